"""The group commit on its own, with real threads: a lone caller syncs by itself, callers
that arrive during a sync share the next one, a failing sync reaches every waiter, and no
caller returns before the sync that covers its record did.

The writer it serves is :class:`Appended`: records appended, a durable point, and a sync that
a test can hold at a gate, as the contract in ``persistlog/_write/group_commit.py`` states it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from threads import wait_until

from persistlog import LogClosedError, LogFailedError
from persistlog._write import group_commit as _group_commit
from persistlog._write.group_commit import GroupCommit


class Appended:
    """The writer side: LSNs appended so far, the first LSN not durable, every sync made."""

    def __init__(self) -> None:
        self.next_lsn = 1
        self.durable_lsn = 1
        self.syncs: list[tuple[int, int, str]] = []  # (lsn asked, durable after, thread)
        self.calls = 0  # sync() calls, those with nothing to do included
        self.gate = threading.Event()
        self.gate.set()
        self.in_sync = threading.Event()
        self.fail: BaseException | None = None
        self.closed = False
        self.lock = threading.Lock()

    def append(self) -> int:
        with self.lock:
            lsn = self.next_lsn
            self.next_lsn += 1
            return lsn

    def sync(self, lsn: int) -> None:
        """Make every record appended by now durable, as an fsync does: records appended
        while it runs wait for the next one."""
        self.calls += 1
        if self.durable_lsn > lsn:
            return
        if self.fail is not None:
            raise self.fail
        if self.closed:
            return  # a closed log syncs nothing: check() says why
        with self.lock:
            through = self.next_lsn
        self.in_sync.set()
        assert self.gate.wait(30), "the test never opened the gate"
        self.durable_lsn = through
        self.syncs.append((lsn, through, threading.current_thread().name))

    def durable(self) -> int:
        return self.durable_lsn

    def check(self) -> None:
        if self.closed:
            raise LogClosedError("the log is closed")


def group_commit(log: Appended) -> GroupCommit:
    return GroupCommit(log.sync, log.durable, log.check, name="persistlog-sync test")


def park(gc: GroupCommit, log: Appended, n: int) -> tuple[list[threading.Thread], dict[int, Any]]:
    """``n`` threads, each appending a record and waiting for it; they park behind the sync
    the test holds at its gate. Returns the threads and, per LSN, what its wait did: the
    durable point it saw on return, or what it raised."""
    outcome: dict[int, Any] = {}

    def writer() -> None:
        lsn = log.append()
        try:
            gc.wait(lsn)
            outcome[lsn] = log.durable()
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            outcome[lsn] = e

    threads = [threading.Thread(target=writer) for _ in range(n)]
    for t in threads:
        t.start()
    wait_until(lambda: len(gc._waiters) == n, 10, f"{n} writers parked")
    return threads, outcome


def leader_held_at_the_gate(gc: GroupCommit, log: Appended) -> threading.Thread:
    """A caller that syncs by itself, held inside its sync until the gate opens."""
    log.gate.clear()
    log.in_sync.clear()
    lsn = log.append()
    leader = threading.Thread(target=gc.wait, args=(lsn,), name="leader")  # it succeeds
    leader.start()
    assert log.in_sync.wait(10)
    return leader


def join(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)


def test_a_lone_caller_syncs_on_its_own_thread_with_no_sync_thread() -> None:
    log = Appended()
    gc = group_commit(log)
    lsn = log.append()
    gc.wait(lsn)
    assert log.syncs == [(1, 2, threading.current_thread().name)]
    assert gc._thread is None


def test_a_durable_record_is_not_synced_again() -> None:
    log = Appended()
    gc = group_commit(log)
    gc.wait(log.append())
    gc.wait(1)
    assert log.calls == 1 and len(log.syncs) == 1


def test_writers_arriving_during_a_sync_share_the_next_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # Parked threads look up now and then whether their sync ended without them being
    # woken (a turn lost to an interruption); here every one of them must be woken.
    monkeypatch.setattr(_group_commit, "_RECHECK", 5.0)
    log = Appended()
    gc = group_commit(log)
    leader = leader_held_at_the_gate(gc, log)
    writers, outcome = park(gc, log, 8)
    parked = list(gc._waiters)
    log.gate.set()
    join([leader, *writers])
    # Each was woken in turn by the chain, none left by its periodic recheck.
    assert [w.woken for w in parked] == [True] * 8
    assert [w.next for w in parked] == [*parked[1:], None]
    # Two syncs in all: the leader's, then one by the sync thread for the eight of them.
    assert [(asked, durable) for asked, durable, _ in log.syncs] == [(1, 2), (9, 10)]
    assert log.syncs[0][2] == "leader" and log.syncs[1][2] == "persistlog-sync test"
    assert sorted(outcome) == list(range(2, 10))
    assert all(seen == 10 for seen in outcome.values())
    gc.stop()
    wait_until(lambda: gc._thread is None, 10, "the sync thread ending after stop()")


def test_the_sync_thread_ends_once_idle_and_the_next_group_starts_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # An idle Log keeps no sync thread: many open Logs cost no thread each.
    monkeypatch.setattr(_group_commit, "_IDLE_END", 0.2)
    log = Appended()
    gc = group_commit(log)
    for _ in range(2):
        leader = leader_held_at_the_gate(gc, log)
        writers, outcome = park(gc, log, 4)
        assert gc._thread is not None
        log.gate.set()
        join([leader, *writers])
        assert all(isinstance(seen, int) for seen in outcome.values())
        wait_until(lambda: gc._thread is None, 10, "the idle sync thread ending")
    assert [name for _, _, name in log.syncs] == ["leader", "persistlog-sync test"] * 2


def test_a_failing_sync_reaches_every_waiter() -> None:
    log = Appended()
    gc = group_commit(log)
    leader = leader_held_at_the_gate(gc, log)
    writers, outcome = park(gc, log, 5)
    disk = OSError(5, "Input/output error")
    log.fail = disk
    log.gate.set()
    join([leader, *writers])
    assert sorted(outcome) == [2, 3, 4, 5, 6]
    for error in outcome.values():
        assert isinstance(error, LogFailedError)
        assert error.__cause__ is disk
        assert str(error) == "a sync failed: [Errno 5] Input/output error"
    assert log.durable_lsn == 2 and [name for _, _, name in log.syncs] == ["leader"]
    gc.stop()


def test_a_log_closed_under_the_waiters_reaches_every_waiter_as_closed() -> None:
    log = Appended()
    gc = group_commit(log)
    leader = leader_held_at_the_gate(gc, log)
    writers, outcome = park(gc, log, 3)
    log.closed = True
    log.gate.set()
    join([leader, *writers])
    assert sorted(outcome) == [2, 3, 4]
    assert all(isinstance(e, LogClosedError) for e in outcome.values()), outcome
    gc.stop()


def test_no_waiter_returns_before_the_sync_that_covers_its_record() -> None:
    """Rounds of writers against a sync held each time: whatever order the threads run in,
    each return sees its own record durable, and syncs cover ever later LSNs."""
    log = Appended()
    gc = group_commit(log)
    seen: dict[int, Any] = {}
    for _round in range(5):
        leader = leader_held_at_the_gate(gc, log)
        writers, outcome = park(gc, log, 6)
        log.gate.set()
        join([leader, *writers])
        seen.update(outcome)
    assert sorted(seen) == [lsn for lsn in range(1, log.next_lsn) if lsn % 7 != 1]
    assert all(durable > lsn for lsn, durable in seen.items()), seen
    covered = [durable for _, durable, _ in log.syncs]
    assert covered == sorted(covered) and covered[-1] == log.next_lsn
    gc.stop()


def test_after_stop_a_caller_syncs_by_itself() -> None:
    log = Appended()
    gc = group_commit(log)
    gc.stop()
    gc.wait(log.append())
    gc.wait(log.append())
    assert [name for _, _, name in log.syncs] == [threading.current_thread().name] * 2
    assert gc._thread is None


@pytest.mark.parametrize("writers", [1, 16])
def test_every_record_is_durable_when_its_wait_returns(writers: int) -> None:
    log = Appended()
    gc = group_commit(log)
    late: list[int] = []

    def writer() -> None:
        for _ in range(50):
            lsn = log.append()
            gc.wait(lsn)
            if log.durable() <= lsn:
                late.append(lsn)

    threads = [threading.Thread(target=writer) for _ in range(writers)]
    for t in threads:
        t.start()
    join(threads)
    assert late == []
    assert log.durable_lsn == log.next_lsn == 50 * writers + 1
    assert len(log.syncs) <= 50 * writers
    gc.stop()

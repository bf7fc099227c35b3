"""Secondary destinations: every record goes to every destination, each through
its own writer thread and bounded queue; a failing secondary is detached (logged, shown in
``stats()``), the primary carries on, and the next rotation re-attaches it; a slow one
blocks ``update()`` only once its queue is full and never loses a record."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from faults import FaultPlan

import persistlog
from kv_app import App, apply, restore_state
from threads import wait_until
from destinations import open_destination
from persistlog._write import secondaries as _secondaries

# -- helpers ------------------------------------------------------------------------------




class ChurningApp(App):
    """The test app with a churn of puts and deletes."""

    def churn(self, count: int, keys: int = 30) -> None:
        for i in range(count):
            n = self.changes
            if i % 5 == 4:
                self.delete(f"k{(n * 7) % keys}")
            else:
                self.put(f"k{n % keys}", [n, "v" * (n % 17)])


def restore_records(url: str, so: dict[str, Any] | None = None) -> tuple[list[Any], persistlog.RestoreResult]:
    records: list[Any] = []
    result = persistlog.restore(url, records.append, storage_options=so)
    return records, result


def seqs(url: str, so: dict[str, Any] | None = None) -> list[int]:
    names = open_destination(url, **(so or {})).list()
    return sorted({int(n[:20]) for n in names if n.endswith(".plog")})


def secondary(lg: persistlog.Log, url: str) -> dict[str, Any]:
    for d in lg.stats()["destinations"]:
        if d["url"] == url:
            return d
    raise AssertionError(f"{url} is not among {lg.stats()['destinations']}")




def mem_url() -> str:
    return f"memory://s{uuid.uuid4().hex[:10]}/log"


class Switch(FaultPlan):
    """A fault plan the test turns on and off: ``failing`` makes every write fail with
    EIO (a permanent error); closing ``gate`` holds every write until it opens again."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False
        self.gate = threading.Event()
        self.gate.set()
        self.held = 0

    def run(self, op: str, call: Callable[[], Any]) -> Any:
        if op == "pipe_file":
            if not self.gate.is_set():
                self.held += 1
                self.gate.wait()
            if self.failing:
                self.calls[op] += 1
                raise OSError(errno.EIO, "injected: the secondary's storage failed")
        return super().run(op, call)


def faulty(plan: FaultPlan) -> tuple[str, dict[str, Any]]:
    return f"faulty://f{uuid.uuid4().hex[:10]}/log", {"target_protocol": "memory", "faults": plan}


# -- every record everywhere --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("primary_kind", ["local", "s3"])
def test_every_record_reaches_every_destination(
    primary_kind: str, tmp_path: Path, clean_memory_fs: None, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    so = s3_storage_options
    local2 = str(tmp_path / "secondary")
    mem = mem_url()
    if primary_kind == "local":
        primary, primary_so = str(tmp_path / "primary"), None
        dests = [(primary, None), (local2, None), (mem, None), (f"s3://{s3_bucket}/sec", so)]
        secondaries: list[Any] = [local2, (mem, {}), (f"s3://{s3_bucket}/sec", so)]
    else:
        primary, primary_so = f"s3://{s3_bucket}/primary", so
        dests = [(primary, so), (local2, None), (mem, None)]
        secondaries = [local2, mem]
    app = ChurningApp()
    lg = app.open(primary, storage_options=primary_so, secondaries=secondaries, retain=2,
                  segment_bytes=4096, flush_interval=0.05)
    for r in range(4):
        app.churn(120)
        if r % 2:
            lg.sync()
        lg.rotate()
    app.churn(30)
    stats = lg.stats()["destinations"]
    assert [d["role"] for d in stats] == ["primary"] + ["secondary"] * (len(dests) - 1)
    assert all(d["healthy"] for d in stats), stats
    lg.close()
    expected, result = restore_records(primary, primary_so)
    for url, dso in dests:
        records, r = restore_records(url, dso)
        assert records == expected, url
        assert (r.logs, r.next_lsn, r.complete) == (result.logs, result.next_lsn, True), url
        assert restore_state(url, storage_options=dso)[0] == app.data, url
        # Retention keeps the same complete logs everywhere.
        assert seqs(url, dso) == seqs(primary, primary_so), url
    # A follower reads a secondary like any other destination.
    followed: dict[str, Any] = {}
    f = persistlog.follow(mem, lambda r: apply(followed, r))
    f.poll()
    assert followed == app.data


# -- add_destination / remove_destination ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_add_destination_returns_with_a_complete_log_and_remove_detaches(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    so: dict[str, Any] | None = None
    if kind == "local":
        url = str(tmp_path / "added")
    elif kind == "memory":
        request.getfixturevalue("clean_memory_fs")
        url = mem_url()
    else:
        so = request.getfixturevalue("s3_storage_options")
        url = f"s3://{request.getfixturevalue('s3_bucket')}/added"
    app = ChurningApp()
    primary = str(tmp_path / "primary")
    lg = app.open(primary, flush_interval=0.05)
    try:
        app.churn(200)
        seq_before = lg.seq
        lg.add_destination(url, storage_options=so)
        # Returned: the newcomer holds a complete log with the whole state, already.
        records, result = restore_records(url, so)
        state: dict[str, Any] = {}
        for r in records:
            apply(state, r)
        assert result.complete and result.logs == [lg.seq] and lg.seq == seq_before + 1
        assert state == app.data
        d = secondary(lg, url)
        assert d["healthy"] and d["attached"] and d["complete_log"] == lg.seq
        with pytest.raises(ValueError):
            lg.add_destination(url, storage_options=so)
        with pytest.raises(ValueError):
            lg.add_destination(primary)

        app.churn(50)
        lg.sync()
        at_removal = dict(app.data)
        lg.remove_destination(url)
        assert [d["url"] for d in lg.stats()["destinations"]] == [primary]
        with pytest.raises(ValueError):
            lg.remove_destination(url)
        app.churn(40)
        lg.rotate()
        app.churn(10)
        lg.sync()
        # Nothing after the removal went there; what it holds is restorable...
        assert restore_state(url, storage_options=so)[0] == at_removal
        assert restore_state(primary)[0] == app.data
    finally:
        lg.close()
    # ...and its writer lock was released: another writer can take it (and would continue
    # from what it holds).
    other = ChurningApp()
    persistlog.restore(url, lambda r: apply(other.data, r), storage_options=so)
    assert other.data == at_removal
    other.open(url, storage_options=so).close()


@pytest.mark.slow
def test_unusable_or_locked_secondary_does_not_stop_open(tmp_path: Path, clean_memory_fs: None) -> None:
    """open() goes on without a secondary it cannot take (detached, stats say why), and
    takes it as soon as it can, with a new log; add_destination() of one raises."""
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    primary = str(tmp_path / "primary")
    lg = persistlog.open(primary, lambda emit: None, secondaries=[str(afile), str(afile / "sub")],
                         secondary_close_wait=0.2)
    for url in (str(afile), str(afile / "sub")):
        d = secondary(lg, url)
        assert not d["healthy"] and not d["attached"] and d["error"], d
    lg.update({"op": "put", "key": "p", "value": 1})
    with pytest.raises(persistlog.DestinationError):
        lg.add_destination(str(afile / "other"))
    assert [d["url"] for d in lg.stats()["destinations"]] == [primary, str(afile), str(afile / "sub")]
    # A secondary another writer holds is a conflict for add_destination, as for the primary.
    mem = mem_url()
    holder = persistlog.open(mem, lambda emit: None)
    with pytest.raises(persistlog.WriterConflict):
        lg.add_destination(mem)
    behind = lg.close()  # still unusable: close() says so
    assert [(b.url, b.last_lsn, b.primary_last_lsn) for b in behind] == [
        (str(afile), None, 1), (str(afile / "sub"), None, 1)]
    assert restore_state(primary)[0] == {"p": 1}
    # open() goes on without it, and attaches it with a new log once the holder lets go.
    app = ChurningApp()
    lg = app.open(str(tmp_path / "p2"), secondaries=[mem])
    try:
        d = secondary(lg, mem)
        assert not d["attached"] and "WriterConflict" in d["error"], d
        app.churn(20)
        holder.close()
        wait_until(lambda: secondary(lg, mem)["complete_log"] is not None, 15, lambda: str(secondary(lg, mem)))
        app.churn(20)
    finally:
        lg.close()
    assert restore_state(mem)[0] == app.data
    with pytest.raises(TypeError):
        persistlog.open(str(tmp_path / "p3"), lambda emit: None, secondaries=[42])  # type: ignore[list-item]


# -- failures detach, the next rotation re-attaches ---------------------------------------


@pytest.mark.slow
def test_failing_secondary_is_detached_then_reattached(tmp_path: Path, clean_memory_fs: None,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    plan = Switch()
    url, so = faulty(plan)
    primary = str(tmp_path / "primary")
    app = ChurningApp()
    lg = app.open(primary, secondaries=[(url, so)], flush_interval=0.02, durability="flush")
    try:
        app.churn(50)
        wait_until(lambda: secondary(lg, url)["batches"] >= 50, 10, lambda: str(secondary(lg, url)))
        assert secondary(lg, url)["healthy"]

        caplog.set_level(logging.WARNING, logger="persistlog")
        plan.failing = True
        app.churn(30)
        d = wait_until(lambda: (s := secondary(lg, url)) and not s["healthy"] and not s["attached"] and s, 10,
                       lambda: str(secondary(lg, url)))
        assert "injected" in d["error"] and d["detaches"] == 1
        assert any("detached" in r.getMessage() and url in r.getMessage() for r in caplog.records)
        # The primary is unaffected.
        app.churn(100)
        lg.sync()
        assert lg.failed is None and lg.stats()["destinations"][0]["healthy"]
        assert restore_state(primary)[0] == app.data

        before = d["complete_log"]
        plan.failing = False
        app.churn(20)
        # Taken back by itself once it answers again, with a new log (a rotation it asks
        # for), not at a size trigger that may be hours away.
        d = wait_until(lambda: (s := secondary(lg, url)) and s["complete_log"] > before and s, 15,
                       lambda: str(secondary(lg, url)))
        assert d["healthy"] and d["attached"] and d["error"] is None
        seq = lg.rotate()  # and every rotation goes there too
        wait_until(lambda: secondary(lg, url)["complete_log"] >= seq, 10, lambda: str(secondary(lg, url)))
        app.churn(40)
        # Restorable from the secondary now (the log it holds is complete).
        lg.sync()
        wait_until(lambda: restore_state(url, storage_options=so)[0] == app.data, 10, "the secondary catching up")
    finally:
        lg.close()
    assert restore_state(url, storage_options=so)[0] == app.data
    assert restore_state(primary)[0] == app.data


@pytest.mark.slow
def test_local_secondary_replaced_by_a_file_is_detached_then_reattached(tmp_path: Path) -> None:
    primary, sec = str(tmp_path / "primary"), tmp_path / "secondary"
    app = ChurningApp()
    lg = app.open(primary, secondaries=[str(sec)])
    try:
        app.churn(60)
        first = lg.rotate()
        # The secondary has taken that log in whole (its CURRENT moved): the swap below is
        # two steps, and a pointer moved between them would meet no directory at all.
        wait_until(lambda: (secondary(lg, str(sec))["complete_log"] or 0) >= first, 10,
                   lambda: str(secondary(lg, str(sec))))
        moved = tmp_path / "moved-away"
        os.rename(sec, moved)
        sec.write_text("someone put a file here")
        app.churn(20)
        seq = lg.rotate()  # the secondary cannot create the new log
        d = wait_until(lambda: (s := secondary(lg, str(sec))) and not s["healthy"] and s, 10,
                       lambda: str(secondary(lg, str(sec))))
        assert "NotADirectoryError" in d["error"] or "Not a directory" in d["error"], d
        app.churn(50)
        lg.sync()
        assert lg.failed is None
        assert restore_state(primary)[0] == app.data

        sec.unlink()
        os.rename(moved, sec)
        seq = lg.rotate()
        wait_until(lambda: secondary(lg, str(sec))["complete_log"] >= seq, 10,
                   lambda: str(secondary(lg, str(sec))))
        assert secondary(lg, str(sec))["healthy"]
        app.churn(30)
    finally:
        lg.close()
    assert restore_state(str(sec))[0] == app.data


def test_secondary_whose_lease_was_taken_is_not_written_again(tmp_path: Path, clean_memory_fs: None) -> None:
    """If another writer takes a secondary's lease over, the secondary is detached and the
    next rotation does not write there (it would interleave with the new owner)."""
    mem = mem_url()
    app = ChurningApp()
    lg = app.open(str(tmp_path / "primary"), secondaries=[mem], lease_ttl=0.6, secondary_close_wait=0.2)
    try:
        app.churn(20)
        lg.rotate()
        dest = open_destination(mem)
        elsewhere = open_destination(mem_url())
        elsewhere.lock("thief", ttl=600)
        dest.replace("LEASE", elsewhere.read("LEASE"))  # the thief's lease, live for 10 minutes
        d = wait_until(lambda: (s := secondary(lg, mem)) and not s["healthy"] and s, 10,
                       lambda: str(secondary(lg, mem)))
        assert "lease" in d["error"].lower()
        before = dest.list()
        seq = lg.rotate()
        app.churn(20)
        lg.sync()
        time.sleep(0.3)  # several flush intervals: nothing may appear (the check is below)
        assert dest.list() == before
        assert seq not in seqs(mem)
        assert not secondary(lg, mem)["healthy"]
        assert b"thief" in dest.read("LEASE")
    finally:
        behind = lg.close()
    assert [b.url for b in behind] == [mem] and "lease" in behind[0].reason.lower()


# -- backpressure and slowness --------------------------------------------------------


@pytest.mark.slow
def test_slow_secondary_blocks_updates_only_when_its_queue_is_full(tmp_path: Path, clean_memory_fs: None) -> None:
    plan = Switch()
    url, so = faulty(plan)
    app = ChurningApp()
    lg = app.open(str(tmp_path / "primary"), secondaries=[(url, so)], durability="flush", flush_interval=0.02)
    maxsize = _secondaries.QUEUE_BATCHES
    # Enough that the queue fills however many batches the secondary took into its write
    # before that write hung (a loaded machine lets it take more).
    total = maxsize * 20
    done = [0]
    errors: list[BaseException] = []

    def updater() -> None:
        try:
            for i in range(total):
                app.put(f"k{i % 50}", i)  # one batch per update (durability="flush")
                done[0] = i + 1
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    try:
        app.churn(10)
        wait_until(lambda: secondary(lg, url)["batches"] >= 10, 10, "the secondary starting")
        plan.gate.clear()  # the secondary's next write hangs
        t = threading.Thread(target=updater)
        t.start()
        # The queue fills up while the secondary is stuck, and then update() waits.
        wait_until(lambda: secondary(lg, url)["queued"] >= maxsize and plan.held, 20,
                   lambda: f"queued {secondary(lg, url)['queued']}, held {plan.held}, done {done[0]}")
        time.sleep(0.2)  # let the updater reach the put() that waits
        stuck_at = done[0]
        assert stuck_at >= maxsize  # it did not block before the queue was full
        assert stuck_at < total
        time.sleep(0.3)
        assert done[0] == stuck_at and t.is_alive()  # blocked, not dropping
        assert secondary(lg, url)["queued"] == maxsize
        plan.gate.set()
        t.join(30)
        assert not t.is_alive() and not errors
    finally:
        plan.gate.set()
        lg.close()
    d = secondary(lg, url)
    assert d["healthy"] and d["detaches"] == 0
    assert restore_state(url, storage_options=so)[0] == app.data


@pytest.mark.slow
def test_delayed_secondary_writes_lose_nothing(tmp_path: Path, clean_memory_fs: None) -> None:
    plan = FaultPlan().delay("pipe_file", 0.08, nth=1, times=10**6)
    url, so = faulty(plan)
    app = ChurningApp()
    lg = app.open(str(tmp_path / "primary"), secondaries=[(url, so)], durability="flush", flush_interval=0.02)
    for r in range(3):
        app.churn(150)
        lg.rotate()
    app.churn(50)
    lg.close()
    assert plan.calls["pipe_file"] > 5
    assert restore_records(url, so)[0] == restore_records(lg.url)[0]
    assert restore_state(url, storage_options=so)[0] == app.data


def test_object_store_secondary_flushes_under_steady_load(tmp_path: Path, clean_memory_fs: None) -> None:
    """A secondary flushes on its interval even when batches never stop coming."""
    mem = mem_url()
    app = ChurningApp()
    lg = app.open(str(tmp_path / "primary"), secondaries=[mem], durability="flush")
    try:
        dest = open_destination(mem)
        start = len(dest.list())
        deadline = time.monotonic() + 5
        grew = False
        while time.monotonic() < deadline and not grew:
            for _ in range(20):
                app.put(f"k{app.changes % 40}", app.changes)
            grew = len(dest.list()) > start
        assert grew, "the secondary wrote nothing in 5 s of steady updates"
    finally:
        lg.close()
    assert restore_state(mem)[0] == app.data


def test_follower_of_a_secondary_resyncs_across_a_detach(tmp_path: Path, clean_memory_fs: None) -> None:
    """A detached secondary misses the end of its log; the re-attached log starts further
    on. A follower of that secondary re-syncs (a reset), never applying a history with a
    hole in it, and never calling it corruption."""
    plan = Switch()
    url, so = faulty(plan)
    app = ChurningApp()
    lg = app.open(str(tmp_path / "primary"), secondaries=[(url, so)], flush_interval=0.02)
    state: dict[str, Any] = {}
    resets: list[int] = []

    def on_reset() -> None:
        resets.append(1)
        state.clear()

    f = persistlog.follow(url, lambda r: apply(state, r), storage_options=so, on_reset=on_reset)
    bare = persistlog.follow(url, lambda r: None, storage_options=so)
    try:
        app.churn(40)
        lg.sync()
        wait_until(lambda: (f.poll(), bare.poll(), state == app.data)[-1], 10, "the follower catching up")
        plan.failing = True
        app.churn(30)
        lg.sync()
        wait_until(lambda: not secondary(lg, url)["attached"], 10, lambda: str(secondary(lg, url)))
        plan.failing = False
        seq = lg.rotate()
        app.churn(10)
        lg.sync()
        wait_until(lambda: secondary(lg, url)["complete_log"] == seq, 10, lambda: str(secondary(lg, url)))
        wait_until(lambda: (f.poll(), state == app.data)[-1], 10, lambda: f"follower at {f.cursor}")
        assert resets == [1]
        with pytest.raises(persistlog.ResetRequired):
            bare.poll()
    finally:
        lg.close()

"""A secondary is a backup that always restores: after a crash of its writer at any moment
(with the secondary behind, detached, or still leased by the dead writer), restoring it
gives the state after a prefix of the updates, never an error; after a clean close, exactly
the primary's state. Followers of a secondary get the same."""

from __future__ import annotations

import errno
import io
import json
import logging
import threading
from contextlib import redirect_stderr, redirect_stdout
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from crashsim import CrashSim
from faults import FaultPlan
from kv_app import App, apply, restore_state
from secondary_crashes import (
    crash_with_secondary_behind,
    is_prefix,
    restart_and_crash_on_the_secondary,
    steps,
)

import persistlog
from destinations import open_destination
from persistlog._read.reader import list_logs, newest_seal
from threads import wait_until

KINDS = ("local", "memory")


def cli(*argv: str) -> Any:
    """The ``persistlog`` command in this process: (status, out) as ``.status``/``.out``."""
    from types import SimpleNamespace

    from persistlog.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(list(argv))
    return SimpleNamespace(status=status, out=out.getvalue(), err=err.getvalue())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("clean_memory_fs")
def test_restart_over_a_secondary_left_behind_restores_a_prefix(kind: str, tmp_path: Path) -> None:
    """The restarted writer's first log cannot continue what the secondary holds; a crash
    before that log is complete there leaves both. Restore stops before the new log (it
    follows a gap the writer declared) instead of calling the broken chain corruption."""
    sec_url, acked = crash_with_secondary_behind(kind, tmp_path, CrashSim(), lease_ttl=0.4)
    before, res = restore_state(sec_url)
    assert 20 <= is_prefix(before) < acked

    # The restarted writer (the dead one's lease may still run) crashes right after its
    # first log's header reached the secondary.
    restart_and_crash_on_the_secondary(kind, tmp_path, sec_url, acked)
    logs = sorted({int(n[:20]) for n in open_destination(sec_url).list() if n.endswith(".plog")})
    after, res = restore_state(sec_url)
    assert after == before, "the secondary's state is the one before the gap"
    assert res.after_gap == [logs[-1]] and res.last_lsn < res.next_lsn
    assert res.last_commit_us is not None
    # The CLI says the same: how far a failover to the secondary reaches, and no damage.
    info = cli("info", sec_url, "--json")
    report = json.loads(info.out)
    assert info.status == 0 and report["clean"], info.out
    assert (report["restore_last_lsn"], report["restore_last_commit_us"]) == (res.last_lsn, res.last_commit_us)
    assert report["restore_skips"] == res.after_gap and report["gaps"] == res.after_gap
    text = cli("info", sec_url).out
    assert f"reaches      LSN {res.last_lsn}, committed " in text and "follow a gap" in text, text
    assert cli("verify", sec_url).status == 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("clean_memory_fs")
def test_restarted_writer_opens_at_once_and_takes_the_secondary_when_the_lease_ends(
    kind: str, tmp_path: Path
) -> None:
    """The dead writer's lease on the secondary does not hold the new writer up; the
    secondary is taken (with a new log) once the lease ends; after a clean close it holds
    exactly the primary's state."""
    ttl = 3.0
    sec_url, acked = crash_with_secondary_behind(kind, tmp_path, CrashSim(), lease_ttl=ttl)
    state, _ = restore_state(str(tmp_path / "primary"))
    app = App(state)
    started = time.monotonic()
    app.log = persistlog.open(str(tmp_path / "primary"), app.enumerate_all, concurrent_enumeration=True, secondaries=[sec_url],
                              durability="fsync", lease_ttl=ttl)
    try:
        opened_in = time.monotonic() - started
        d = app.log.stats()["destinations"][1]
        if kind == "memory":
            assert opened_in < ttl and not d["attached"] and "leased by another writer" in d["error"], d
        steps(app, acked + 1, 10)
        wait_until(lambda: app.log is not None and app.log.stats()["destinations"][1]["complete_log"], 10,
                   lambda: str(app.log.stats()["destinations"] if app.log else None))
        steps(app, acked + 11, 10)
    finally:
        app.log.close()
    primary_state, pres = restore_state(str(tmp_path / "primary"))
    secondary_state, sres = restore_state(sec_url)
    assert secondary_state == primary_state == app.data
    assert (sres.last_lsn, sres.last_commit_us) == (pres.last_lsn, pres.last_commit_us)


@pytest.mark.usefixtures("clean_memory_fs")
def test_secondary_first_log_after_a_gap_restores_nothing_until_complete(tmp_path: Path) -> None:
    """A secondary added to a running log gets that log's later history only: until its
    first log is complete there, it holds no prefix of the updates but the empty one."""
    sec = f"memory://sec-{uuid.uuid4().hex[:10]}/log"
    app = App()
    release = threading.Event()
    entered = threading.Event()
    slow = False

    def enumerate_all(emit: Any) -> None:
        app.enumerate_all(emit)
        if slow:
            entered.set()
            release.wait(10)

    app.log = persistlog.open(str(tmp_path / "primary"), enumerate_all, durability="fsync")
    try:
        steps(app, 1, 10)
        slow = True
        t = threading.Thread(target=lambda: app.log.add_destination(sec) if app.log else None)
        t.start()
        assert entered.wait(10)
        wait_until(lambda: [n for n in open_destination(sec).list() if n.endswith(".plog")], 10,
                   "the new log at the secondary")
        state, res = restore_state(sec)
        assert state == {} and res.after_gap and not res.complete
        release.set()
        t.join(10)
        state, res = restore_state(sec)
        assert state == app.data and not res.after_gap
    finally:
        release.set()
        app.log.close()


@pytest.mark.usefixtures("clean_memory_fs")
def test_follower_of_a_secondary_waits_at_a_gap_then_resyncs(tmp_path: Path) -> None:
    """A follower at the end of the secondary's logs before a gap applies nothing of the
    log after it until that log is complete there, then re-syncs (a reset)."""
    sec_url, acked = crash_with_secondary_behind("memory", tmp_path, CrashSim(), lease_ttl=0.3)
    fstate: dict[str, Any] = {}
    resets: list[int] = []

    def on_reset() -> None:
        resets.append(1)
        fstate.clear()

    f = persistlog.follow(sec_url, lambda r: apply(fstate, r), on_reset=on_reset, poll_interval=0.01)
    f.poll()
    before = is_prefix(fstate)
    state, _ = restore_state(str(tmp_path / "primary"))
    app = App(state)
    release = threading.Event()
    entered = threading.Event()

    def enumerate_all(emit: Any) -> None:
        app.enumerate_all(emit)
        entered.set()
        release.wait(10)

    time.sleep(0.35)  # the dead writer's lease runs out: the secondary is taken at open
    opened: list[persistlog.Log] = []
    t = threading.Thread(target=lambda: opened.append(persistlog.open(
        str(tmp_path / "primary"), enumerate_all, secondaries=[sec_url], durability="fsync", lease_ttl=0.3)))
    t.start()
    try:
        assert entered.wait(10)
        wait_until(lambda: len([n for n in open_destination(sec_url).list() if n.endswith(".plog")]) > 1, 10,
                   "the new log at the secondary")
        for _ in range(5):
            f.poll()
        assert is_prefix(fstate) == before and not resets
        release.set()
        t.join(10)
        app.log = opened[0]
        steps(app, acked + 1, 5)
        app.log.sync()
        wait_until(lambda: (f.poll(), fstate == app.data)[-1], 10, lambda: f"follower at {f.cursor}")
        assert resets == [1]
    finally:
        release.set()
        t.join(10)
        if opened:
            opened[0].close()
        f.stop()


@pytest.mark.slow
def test_unreachable_secondary_does_not_hold_open_up(tmp_path: Path) -> None:
    """An S3 endpoint that refuses connections: open() goes on without it within its bound
    (no ~40 s of retries), and stats() says why."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    so = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
    pytest.importorskip("s3fs")
    app = App()
    started = time.monotonic()
    app.log = persistlog.open(str(tmp_path / "primary"), app.enumerate_all, secondaries=[("s3://nowhere/log", so)],
                              secondary_close_wait=0.5, concurrent_enumeration=True)
    try:
        from persistlog._write import secondaries

        assert time.monotonic() - started < secondaries.ATTACH_WAIT + 5
        d = app.log.stats()["destinations"][1]
        assert not d["healthy"] and not d["attached"] and d["error"], d
        steps(app, 1, 5)
    finally:
        started = time.monotonic()
        behind = app.log.close()
    # Still unreachable at close(): it gives up after its bound (and the 1 s it lets the
    # thread end), seals the primary whole, and reports the secondary.
    assert time.monotonic() - started < 0.5 + 1 + 2
    state, res = restore_state(str(tmp_path / "primary"))
    assert state == app.data
    assert [(b.url, b.last_lsn, b.primary_last_lsn) for b in behind] == [("s3://nowhere/log", None, res.last_lsn)]
    assert "waited 0.5s" in behind[0].reason and behind[0].reason.startswith("detached"), behind[0].reason
    # close() let the secondary's thread finish its attempt in the background (a few
    # seconds of retries against the refused port): it ends here, not in a later test
    # that counts persistlog's threads.
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "persistlog-secondary s3://nowhere/log"],
               60, "the unreachable secondary's thread to end after close()")


class Failing(FaultPlan):
    """Every write fails with EIO while ``failing`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False

    def run(self, op: str, call: Any) -> Any:
        if op == "pipe_file" and self.failing:
            raise OSError(errno.EIO, "injected: the secondary's storage failed")
        return super().run(op, call)


@pytest.mark.slow
@pytest.mark.usefixtures("clean_memory_fs")
def test_secondary_that_missed_logs_restores_the_state_before_them(tmp_path: Path) -> None:
    """A secondary failing through several rotations misses those logs; while the log that
    takes it back is not complete, restoring it gives the state before the missed logs."""
    plan = Failing()
    url, so = f"faulty://f{uuid.uuid4().hex[:10]}/log", {"target_protocol": "memory", "faults": plan}
    app = App()
    hold, entered, release = threading.Event(), threading.Event(), threading.Event()

    def enumerate_all(emit: Any) -> None:
        app.enumerate_all(emit)
        if hold.is_set():
            entered.set()
            release.wait(10)

    app.log = persistlog.open(str(tmp_path / "primary"), enumerate_all, secondaries=[(url, so)],
                              durability="fsync")
    t = None
    try:
        steps(app, 1, 10)
        wait_until(lambda: restore_state(url, storage_options=so)[0].get("last") == 10, 10, "the secondary catching up")
        plan.failing = True
        for n in range(3):
            steps(app, 11 + n, 1)
            app.log.rotate()
        wait_until(lambda: app.log is not None and not app.log.stats()["destinations"][1]["healthy"], 10,
                   "the secondary detached")
        plan.failing = False
        hold.set()
        t = threading.Thread(target=lambda: app.log.rotate() if app.log else None)
        t.start()
        assert entered.wait(10)
        wait_until(lambda: max(int(n[:20]) for n in open_destination(url, **so).list() if n.endswith(".plog"))
                   == app.log.seq if app.log else False, 10, "the new log at the secondary")
        state, res = restore_state(url, storage_options=so)
        assert is_prefix(state) == 10 and res.after_gap == [app.log.seq]
    finally:
        release.set()
        if t is not None:
            t.join(10)
        app.log.close()
    state, res = restore_state(url, storage_options=so)
    assert state == app.data and not res.after_gap


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.parametrize("primary_kind", ["local", "s3"])
def test_clean_close_after_a_crash_leaves_the_s3_pair_equal(
    primary_kind: str, tmp_path: Path, s3_storage_options: dict[str, Any], s3_bucket: str
) -> None:
    """A local primary with an S3 secondary, and an S3 primary with a local secondary: the
    writer dies with the secondary behind; the next one (after a restore) runs and closes
    cleanly; then the secondary restores to exactly the primary's state."""
    so = s3_storage_options
    s3_url = f"s3://{s3_bucket}/{'primary' if primary_kind == 's3' else 'secondary'}"
    local = str(tmp_path / ("secondary" if primary_kind == "s3" else "primary"))
    primary, secondary = (s3_url, local) if primary_kind == "s3" else (local, s3_url)
    options = {s3_url: so, local: None}
    sim = CrashSim()
    hold, release = threading.Event(), threading.Event()
    sim.on("before:put segment" if primary_kind == "local" else "before:append.write segment",
           lambda label, point: hold.is_set() and release.wait(10), times=1 << 30, label="secondary")

    def through_sim(url: str, label: str) -> tuple[str, dict[str, Any]]:
        return sim.remote(url, so, label=label) if url == s3_url else sim.local(url, label=label)

    app = App()
    url, popts = through_sim(primary, "primary")
    app.log = persistlog.open(url, app.enumerate_all, concurrent_enumeration=True, storage_options=popts, durability="fsync", lease_ttl=1.0,
                              secondaries=[through_sim(secondary, "secondary")], flush_interval=0.02)
    steps(app, 1, 15)
    wait_until(lambda: restore_state(secondary, storage_options=options[secondary])[0].get("last") == 15, 15,
               "the secondary catching up")
    hold.set()
    steps(app, 16, 15)
    sim.crash()
    release.set()
    sim.abandon(app.log)
    state, _ = restore_state(primary, storage_options=options[primary])
    assert is_prefix(state) == 30
    behind, _ = restore_state(secondary, storage_options=options[secondary])
    assert 15 <= is_prefix(behind) < 30

    app = App(state)
    deadline = time.monotonic() + 10
    while True:  # an S3 primary is the dead writer's until its lease ends
        try:
            app.log = persistlog.open(primary, app.enumerate_all, concurrent_enumeration=True, storage_options=options[primary],
                                      secondaries=[(secondary, options[secondary] or {})], lease_ttl=1.0)
            break
        except persistlog.WriterConflict:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    try:
        steps(app, 31, 10)
        wait_until(lambda: app.log is not None and app.log.stats()["destinations"][1]["complete_log"], 15,
                   lambda: str(app.log.stats()["destinations"] if app.log else None))
        steps(app, 41, 10)
    finally:
        app.log.close()
    pstate, pres = restore_state(primary, storage_options=options[primary])
    sstate, sres = restore_state(secondary, storage_options=options[secondary])
    assert sstate == pstate == app.data
    assert (sres.last_lsn, sres.last_commit_us) == (pres.last_lsn, pres.last_commit_us)


# -- close() brings a lagging secondary up to date, or says it could not ----------------------


def _reopen_after_the_crash(tmp_path: Path, sec: tuple[str, dict[str, Any]], acked: int, **options: Any) -> App:
    """The next writer: it restores the primary and opens with the secondary, which the dead
    writer still leases, so it goes on without it for now."""
    state, _ = restore_state(str(tmp_path / "primary"))
    assert is_prefix(state) == acked
    app = App(state)
    app.log = persistlog.open(str(tmp_path / "primary"), app.enumerate_all, secondaries=[sec], concurrent_enumeration=True, **options)
    d = app.log.stats()["destinations"][1]
    assert not d["attached"] and "leased by another writer" in d["error"], d
    return app


@pytest.mark.slow
@pytest.mark.s3
def test_clean_close_waits_for_a_secondary_a_killed_writer_still_leases(
    tmp_path: Path, s3_storage_options: dict[str, Any], s3_bucket: str
) -> None:
    """The killed writer's lease on the S3 secondary outlives the next writer's whole run:
    close() waits for it to run out, takes the secondary with a new complete log, then
    seals; the secondary restores to exactly the primary's state."""
    ttl = 4.0  # the dead writer's lease must outlive the restart, on a busy machine too
    s3 = (f"s3://{s3_bucket}/secondary", s3_storage_options)
    sec_url, acked = crash_with_secondary_behind("s3", tmp_path, CrashSim(), lease_ttl=ttl, s3=s3)
    app = _reopen_after_the_crash(tmp_path, s3, acked, lease_ttl=ttl)
    try:
        steps(app, acked + 1, 30)
    finally:
        started = time.monotonic()
        behind = app.log.close()
    pstate, pres = restore_state(str(tmp_path / "primary"))
    sstate, sres = restore_state(sec_url, storage_options=s3_storage_options)
    assert (sres.last_lsn, sres.last_commit_us) == (pres.last_lsn, pres.last_commit_us)
    assert sstate == pstate == app.data and not sres.after_gap
    assert behind == [] and app.log.stats()["destinations"][1]["behind_at_close"] is None
    assert time.monotonic() - started < ttl + 10


@pytest.mark.slow
@pytest.mark.s3
def test_close_reports_a_secondary_still_leased_past_its_bound(
    tmp_path: Path, s3_storage_options: dict[str, Any], s3_bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A lease that outlasts ``secondary_close_wait``: close() gives up on the secondary
    after that long, seals the primary whole, and says which secondary is behind, how far
    it reaches and why: in a warning, in what it returns and in stats()."""
    s3 = (f"s3://{s3_bucket}/secondary", s3_storage_options)
    sec_url, acked = crash_with_secondary_behind("s3", tmp_path, CrashSim(), lease_ttl=60.0, s3=s3)
    reached = restore_state(sec_url, storage_options=s3_storage_options)[1].last_lsn
    app = _reopen_after_the_crash(tmp_path, s3, acked, secondary_close_wait=1.0)
    steps(app, acked + 1, 10)
    caplog.set_level(logging.WARNING, logger="persistlog")
    started = time.monotonic()
    behind = app.log.close()
    assert time.monotonic() - started < 1.0 + 5
    pstate, pres = restore_state(str(tmp_path / "primary"))
    assert pstate == app.data and not pres.torn_tails
    dest = open_destination(str(tmp_path / "primary"))
    seal = newest_seal(dest, list_logs(dest))
    assert seal is not None and seal["next_lsn"] == pres.next_lsn  # sealed at its last record
    assert [(b.url, b.last_lsn, b.primary_last_lsn) for b in behind] == [(sec_url, reached, pres.last_lsn)]
    assert "leased by another writer" in behind[0].reason and "1s" in behind[0].reason, behind[0].reason
    assert app.log.stats()["destinations"][1]["behind_at_close"] == {
        "url": sec_url, "last_lsn": reached, "primary_last_lsn": pres.last_lsn, "reason": behind[0].reason}
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and sec_url in r.getMessage()]
    assert any(f"LSN {reached} of" in m and f"{pres.last_lsn}" in m and "leased" in m for m in warned), warned
    assert restore_state(sec_url, storage_options=s3_storage_options)[1].last_lsn == reached
    assert app.log.close() == behind  # a second close says the same


def test_clean_close_takes_back_a_local_secondary_it_opened_without(tmp_path: Path) -> None:
    """A local secondary unusable at open (a file where its directory goes) is usable again
    just before close(): close() takes it back with a complete log before sealing."""
    primary, sec = str(tmp_path / "primary"), tmp_path / "secondary"
    sec.write_text("not a directory")
    app = App()
    app.log = persistlog.open(primary, app.enumerate_all, secondaries=[str(sec)], concurrent_enumeration=True)
    try:
        assert not app.log.stats()["destinations"][1]["attached"]
        steps(app, 1, 30)
        sec.unlink()
    finally:
        behind = app.log.close()
    pstate, pres = restore_state(primary)
    sstate, sres = restore_state(str(sec))
    assert sres.last_lsn == pres.last_lsn and sstate == pstate == app.data
    assert behind == []

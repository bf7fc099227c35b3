"""One writer per destination: a second writer, in this process or another, gets
``WriterConflict`` and leaves the first unharmed; a killed writer's lock is recoverable; a
writer stopped (SIGSTOP) keeps its local lock, and one stopped past its object-store lease
fails when it resumes, having acknowledged nothing that a restore lacks."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from child_scripts import AckingWriter
from kv_app import App, restore_state
from log_files import log_seqs
from threads import wait_until

import persistlog
from destinations import open_destination
from persistlog._format import decoder, encoder
from persistlog._format import constants as F
from persistlog._write.segment_writer import fence_newest_log
from persistlog.cli import main as cli_main


# -- one writer -------------------------------------------------------------------------


@pytest.mark.slow
def test_second_writer_gets_writer_conflict(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir)
    with pytest.raises(persistlog.WriterConflict) as info:
        persistlog.open(log_dir, lambda emit: None)
    assert str(os.getpid()) in str(info.value)  # names the holder
    code = "import sys, persistlog\npersistlog.open(sys.argv[1], lambda emit: None)\n"
    proc = subprocess.run([sys.executable, "-c", code, log_dir], capture_output=True, text=True)
    assert proc.returncode != 0 and "WriterConflict" in proc.stderr
    app.put("b", 2)  # the holder is unaffected
    lg.close()
    assert restore_state(log_dir)[0] == {"a": 1, "b": 2}
    assert log_seqs(log_dir) == [1]  # the conflicting writers created nothing


@pytest.mark.slow
def test_stale_lock_of_a_killed_process_is_recoverable(log_dir: str) -> None:
    code = (
        "import sys, time, persistlog\n"
        "lg = persistlog.open(sys.argv[1], lambda emit: emit({'op': 'put', 'key': 'a', 'value': 1}),"
        " durability='fsync')\n"
        "lg.update({'op': 'put', 'key': 'b', 'value': 2})\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, log_dir], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == b"ready\n"
        with pytest.raises(persistlog.WriterConflict) as info:
            persistlog.open(log_dir, lambda emit: None)
        assert str(proc.pid) in str(info.value)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    with open(os.path.join(log_dir, "LOCK"), "rb") as f:
        assert str(proc.pid).encode() in f.read()  # the dead owner's record is still there
    state, _ = restore_state(log_dir)
    assert state == {"a": 1, "b": 2}
    app = App(state)
    app.open(log_dir).close()
    assert restore_state(log_dir)[0] == state


# -- a writer stopped and resumed -------------------------------------------------------


def _writer(cfg: dict[str, Any], tmp_path: Path, name: str, **more: Any) -> AckingWriter:
    return AckingWriter({**cfg, "name": name, "threads": 1, "sync": True, **more}, tmp_path, name)


@pytest.mark.slow
def test_local_lock_holds_while_its_writer_is_stopped(tmp_path: Path) -> None:
    """The OS lock of a stopped process stays taken: a second writer gets WriterConflict,
    and everything the first acknowledges, before and after it resumes, restores."""
    cfg = {"url": str(tmp_path / "log"), "open": {"durability": "fsync"}}
    a = _writer(cfg, tmp_path, "a")
    b = None
    try:
        a.wait_for("acknowledgements", lambda: a.count("A ") >= 20, 60)
        a.signal(signal.SIGSTOP)
        b = _writer(cfg, tmp_path, "b", count=5)
        assert b.wait(60) == 0, b.stderr()
        assert [line[:2] for line in b.lines] == ["W "], b.lines  # WriterConflict, nothing written
        resumed_at = a.count("A ")
        a.signal(signal.SIGCONT)
        a.wait_for("acknowledgements after SIGCONT", lambda: a.count("A ") >= resumed_at + 20, 60)
        a.signal(signal.SIGKILL)
        a.wait(30)
    finally:
        a.close()
        if b is not None:
            b.close()
    state, _ = restore_state(cfg["url"])
    assert not sorted(a.acked_keys("a") - set(state))
    assert not [k for k in state if k.startswith("b.")]


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.parametrize("taker", ["holds", "rotates-and-closes"])
def test_s3_writer_stopped_past_its_lease_fails_and_loses_no_acknowledged_update(
    s3_bucket: str, s3_storage_options: dict[str, Any], tmp_path: Path, taker: str
) -> None:
    """Writer A loops ``update(sync=True)``; stopped (SIGSTOP) for 2.5 lease lifetimes, its
    lease runs out and writer B takes over, restores and writes. Resumed, A fails with a
    writer conflict at its next write, and every update either acknowledged restores: B
    fenced A's log, so A's late segment cannot land (docs/DESIGN.md invariant 6). B either
    holds the destination meanwhile, or rotates (its retention deletes A's log, the fence
    with it) and closes (releasing the lease) before A resumes: A's next segment then lands,
    in a log no restore reads, and A must find the newer log before it acknowledges."""
    ttl = 2.0
    cfg = {"url": f"s3://{s3_bucket}/takeover/log", "storage_options": s3_storage_options,
           "open": {"durability": "fsync", "lease_ttl": ttl}}
    a = _writer(cfg, tmp_path, "a")
    b = None
    try:
        a.wait_for("acknowledgements", lambda: a.count("A ") >= 10, 60)
        a.signal(signal.SIGSTOP)
        time.sleep(2.5 * ttl)
        if taker == "holds":
            b = _writer(cfg, tmp_path, "b", count=10, hold=True)
            b.wait_for("acknowledgements", lambda: b.count("A ") >= 10, 60)
        else:
            b = _writer({**cfg, "open": {**cfg["open"], "rotate_records": 5, "retain": 1}}, tmp_path, "b", count=20)
            assert b.wait(60) == 0 and b.lines[-1] == "D", b.stderr()
            a_log = int(a.lines[0].split()[1])
            left = [F.parse_segment_name(n) for n in open_destination(cfg["url"], **s3_storage_options).list()]
            assert not [p for p in left if p is not None and p[0] == a_log]  # deleted, fence and all
        stopped_at = a.count("A ")
        a.signal(signal.SIGCONT)
        assert a.wait(30) == 3, a.stderr()  # it failed, loudly
        failure = [line for line in a.lines if line.startswith("F ")]
        assert len(failure) == 1 and "writer" in failure[0], a.lines[-3:]
        if taker == "holds":
            assert b.finish(30) == 0 and b.lines[-1] == "D", b.stderr()
    finally:
        a.close()
        if b is not None:
            b.close()
    state, result = restore_state(cfg["url"], storage_options=s3_storage_options)
    acked = a.acked_keys("a") | b.acked_keys("b")
    missing = sorted(acked - set(state))
    assert not missing, (
        f"{len(missing)} acknowledged updates lost ({a.count('A ') - stopped_at} acknowledged by A "
        f"after SIGCONT): {missing}"
    )


# -- fencing an object store's newest log -----------------------------------------------


def _put(lg: persistlog.Log, key: str, value: Any) -> int:
    return lg.update({"op": "put", "key": key, "value": value}, sync=True)


def _cli_json(*argv: str) -> tuple[int, Any]:
    out = io.StringIO()
    with redirect_stdout(out):
        status = cli_main([*argv, "--json"])
    return status, json.loads(out.getvalue())


def test_a_writer_whose_log_was_fenced_fails_at_its_next_write(clean_memory_fs: None) -> None:
    """What a writer taking over does (``fence_newest_log``), with the writer before it
    still running: that writer's next PUT finds its segment name taken and fails its Log
    (WriterConflict, then LogFailedError on every call), acknowledging nothing; readers
    see the fence as the end of the log, not as damage."""
    url = "memory://fenced/log"
    lg = persistlog.open(url, lambda emit: None, durability="fsync")
    acked = {f"k{i}": i for i in range(3)}
    for key, value in acked.items():
        _put(lg, key, value)
    segments = [n for n in open_destination(url).list() if F.parse_segment_name(n)]
    name = fence_newest_log(open_destination(url), "taker:1:fence")
    assert name == F.segment_name(1, len(segments))  # the next name of the log
    with pytest.raises(persistlog.LogFailedError, match="another writer took"):
        _put(lg, "late", 1)
    assert isinstance(lg.failed, persistlog.WriterConflict)
    with pytest.raises(persistlog.LogFailedError):
        lg.update({"op": "put", "key": "later", "value": 2})
    lg.close()
    state, result = restore_state(url)
    assert state == acked and result.torn_tails == [] and result.next_lsn == len(acked) + 1
    assert fence_newest_log(open_destination(url), "taker:2:fence") is None  # fenced already

    status, report = _cli_json("verify", url)
    assert status == 0 and report["ok"] and report["problems"] == []
    (info,) = report["logs"]
    assert info["state"] == "complete, fenced" and info["fenced_by"] == "taker:1:fence"
    assert info["next_lsn"] == result.next_lsn
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["info", url]) == 0
    assert "complete, fenced" in out.getvalue() and "taker:1:fence took the destination over" in out.getvalue()

    # A fence segment is an ordinary segment of the format: a header, then one control
    # batch (which readers that know no fence skip as an unknown control record).
    data = open_destination(url).read(name)
    head = decoder.parse_segment_header(data[: F.SEGMENT_HEADER_SIZE])
    assert (head.seq, head.segment, head.first_lsn) == (1, len(segments), result.next_lsn)
    batch = decoder.parse_batch_header(data[F.SEGMENT_HEADER_SIZE: F.SEGMENT_HEADER_SIZE + F.BATCH_HEADER_SIZE], 40)
    assert batch.kind == F.KIND_CONTROL and batch.count == 1 and batch.first_lsn == result.next_lsn
    assert F.SEGMENT_HEADER_SIZE + batch.size == len(data)


def test_a_segment_landing_before_the_fence_is_read_and_fenced_after(clean_memory_fs: None) -> None:
    """The writer before lands its next segment between the taker's look at the log and
    its fence: the fence's create-only write fails, and it goes after that segment, which
    the taker's restore then replays."""
    url = "memory://fence-race/log"
    lg = persistlog.open(url, lambda emit: None, durability="fsync")
    _put(lg, "a", 1)
    dest = open_destination(url)
    last = len([n for n in dest.list() if F.parse_segment_name(n)]) - 1
    create = dest.create
    raced: list[str] = []

    def late_segment_first(name: str, data: bytes) -> None:
        if not raced:
            raced.append(name)
            _put(lg, "b", 2)  # lands at exactly the name the fence was about to take
        create(name, data)

    dest.create = late_segment_first  # type: ignore[method-assign]
    name = fence_newest_log(dest, "taker:1:race")
    assert raced == [F.segment_name(1, last + 1)] and name == F.segment_name(1, last + 2)
    with pytest.raises(persistlog.LogFailedError):
        _put(lg, "c", 3)
    lg.close()
    assert restore_state(url)[0] == {"a": 1, "b": 2}


def _taken_over_and_deleted(url: str) -> None:
    """What a writer taking over does, then its retention: it fences the newest log, starts
    a newer one (here only its first segment's name matters) and, once that is complete,
    deletes the fenced log, fence included, last segment first."""
    dest = open_destination(url)
    fence_newest_log(dest, "taker:1:fence")
    dest.create(F.segment_name(2, 0), b"the taker's log")
    for name in sorted((n for n in dest.list() if (F.parse_segment_name(n) or (0,))[0] == 1), reverse=True):
        dest.delete(name)


@pytest.mark.parametrize("durability", ["fsync", "buffered"])
def test_a_writer_whose_fenced_log_was_deleted_fails_before_acknowledging(
    clean_memory_fs: None, durability: str
) -> None:
    """Retention deleted the fence with the log it ended, so the late writer's next
    segment lands (create-only, at a free name again) in a log no restore reads: its sync
    finds the newer log and fails instead of acknowledging. In buffered mode the records
    it had accepted before are not durable, and close() says so."""
    url = "memory://fence-deleted/log"
    lg = persistlog.open(url, lambda emit: None, durability=durability, flush_interval=3600)
    _put(lg, "a", 1)
    _taken_over_and_deleted(url)
    if durability == "buffered":
        accepted = lg.update({"op": "put", "key": "b", "value": 2})  # in memory only
    with pytest.raises(persistlog.LogFailedError, match="newer than log 1"):
        _put(lg, "late", 3)
    assert isinstance(lg.failed, persistlog.WriterConflict)
    assert [n for n in open_destination(url).list() if (F.parse_segment_name(n) or (0,))[0] == 1]  # it landed
    if durability == "fsync":
        lg.close()  # every acknowledgement waited for its PUT: nothing acknowledged is lost
        return
    lost = f"records {accepted}..{accepted + 1} it accepted are not known to be durable"
    with pytest.raises(persistlog.LogFailedError, match=lost):
        lg.close()
    assert lg.close() == []  # closed: later calls return


def test_close_of_a_buffered_log_failed_by_its_background_flush_raises(clean_memory_fs: None) -> None:
    """The flush timer met the fence and failed the Log: the records it held were
    acknowledged to update() but never written, so close() raises rather than return as
    if they were sealed."""
    url = "memory://fenced-buffered/log"
    lg = persistlog.open(url, lambda emit: None, flush_interval=0.05)
    _put(lg, "a", 1)
    fence_newest_log(open_destination(url), "taker:1:fence")
    lg.update({"op": "put", "key": "b", "value": 2})
    wait_until(lambda: lg.failed is not None, 20, "the background flush to meet the fence")
    with pytest.raises(persistlog.LogFailedError, match="not known to be durable, and may be missing from storage"):
        lg.close()
    assert restore_state(url)[0] == {"a": 1}


def test_fence_ends_the_log_for_readers(clean_memory_fs: None) -> None:
    """Anything after a fence, in its segment or in a later one, is corruption: no writer
    can put it there."""
    url = "memory://fence-end/log"
    lg = persistlog.open(url, lambda emit: None, durability="fsync")
    _put(lg, "a", 1)
    lg.close()
    dest = open_destination(url)
    sealed = max(n for n in dest.list() if F.parse_segment_name(n))
    number = F.parse_segment_name(sealed)[1]
    data = dest.read(sealed)
    dest.delete(sealed)  # the log as a crash leaves it on an object store: unsealed
    name = fence_newest_log(dest, "taker:1:end")
    assert name == sealed
    assert restore_state(url)[0] == {"a": 1}
    after = encoder.segment_header(1, number + 1, 2) + data[F.SEGMENT_HEADER_SIZE:]
    dest.create(F.segment_name(1, number + 1), after)
    with pytest.raises(persistlog.CorruptLogError, match="continues after its fence"):
        restore_state(url)
    dest.delete(F.segment_name(1, number + 1))
    fence = dest.read(name)
    dest.delete(name)
    dest.create(name, fence + data[F.SEGMENT_HEADER_SIZE:])
    with pytest.raises(persistlog.CorruptLogError, match="fence batch is not the end"):
        restore_state(url)

"""Ctrl-C reaches the app, and the Log stays usable and loses nothing acknowledged."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import persistlog
from childproc import run_json
from crashsim import CrashSim
from interrupt_points import PointInterrupter, Retrier, every_point
from log_files import is_sealed_log

PROCS = Path(__file__).resolve().parents[1] / "procs"


def _interrupt_repeatedly(
    tmp_path: Path, durability: str, seconds: float, path: str = "c"
) -> tuple[dict[str, Any], list[Any]]:
    url = str(tmp_path / "log")
    stop, result = tmp_path / "stop", tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROCS), os.environ.get("PYTHONPATH", "")])}
    pure = ["pure"] if path == "pure" else []
    child = subprocess.Popen(
        [sys.executable, str(PROCS / "interrupted_writer.py"), url, durability, str(stop), str(result), *pure],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert child.stdout is not None
    try:
        assert child.stdout.readline() == "READY\n", child.communicate()[1]
        rng = random.Random(durability)
        deadline = time.monotonic() + seconds
        sent = 0
        while time.monotonic() < deadline and child.poll() is None:
            child.send_signal(signal.SIGINT)
            sent += 1
            time.sleep(rng.uniform(0.0005, 0.004))
        time.sleep(0.2)
        stop.touch()
        stopped = time.monotonic()
        _, err = child.communicate(timeout=120)
        # The writer goes on as soon as the interruptions stop: no update waits for a
        # rotation an interruption left unstarted (a held writer gives up after 30 s).
        assert time.monotonic() - stopped < 20, err
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    report = json.loads(result.read_text())
    assert report["interrupts"] >= min(50, sent // 10), (report, sent)
    assert report["accelerated"] is (path == "c"), report
    records: list[Any] = []
    restored = persistlog.restore(url, records.append)
    assert restored.torn_tail is None and is_sealed_log(url, restored.logs[-1])
    return report, records


try:
    from persistlog._cbor_json import Staging  # noqa: F401

    ACCELERATED = True
except ImportError:
    ACCELERATED = False

#: update()'s staging in C (where the accelerator is built) and in Python.
PATHS = [
    pytest.param("c", marks=pytest.mark.skipif(not ACCELERATED, reason="the C accelerator is not built")),
    "pure",
]

_ENCODER_INTERRUPTED = """
import json, sys, threading
import persistlog

url = sys.argv[1]
codec = persistlog.Codec()
calls = {"n": 0}
partial = []


class Part:
    pass


def encode(part):
    calls["n"] += 1
    if calls["n"] <= 2:
        # What the record's encoding put in the batch buffer so far, past its last whole
        # record: the pad, which outgrows the CBOR encoder's own buffer.
        buffer = lg._buffer
        partial.append(buffer._fp.tell() - buffer._pos)
    if calls["n"] == 1:
        raise KeyboardInterrupt("inside the encoder")
    if calls["n"] == 2:
        raise ValueError("the app's encoder failed")
    return {}


codec.register("part", Part, encode=encode, decode=lambda fields: Part())
lg = persistlog.open(url, lambda emit: None, codec=codec)
out = {"accelerated": lg._buffer.accelerated, "lsns": [lg.update({"i": 0})]}
try:
    lg.update({"pad": "x" * 9000, "part": Part(), "after": "y" * 300})
except KeyboardInterrupt as e:
    out["interrupt"] = str(e)
try:
    lg.update({"pad": "z" * 9000, "part": Part()})
except TypeError as e:
    out["type_error"] = str(e)
out["lsns"].append(lg.update({"i": 1}))
# The lock is free for another thread too.
worker = threading.Thread(target=lambda: out["lsns"].append(lg.update({"i": 2})))
worker.start()
worker.join(10)
out["worker_done"] = not worker.is_alive()
out["lsns"].append(lg.update({"i": 3, "part": Part()}, sync=True))
lg.close()
records = []
persistlog.restore(url, records.append, codec=codec)
out["records"] = [sorted(r) for r in records]
out["partial"] = partial
print(json.dumps(out))
"""


@pytest.mark.parametrize("path", PATHS)
def test_an_interruption_inside_the_encoder_leaves_nothing_half_staged(tmp_path: Path, path: str) -> None:
    """A KeyboardInterrupt raised inside a record's encoding (a Codec encode function, on
    the main thread, after part of the record is in the batch buffer) propagates as
    itself, leaves the buffer's lock free (the next update, and another thread's, go
    through) and nothing of the record in the log; an app's encoder error is a
    ``TypeError`` likewise. On both paths of update()'s staging."""
    out = run_json(_ENCODER_INTERRUPTED, str(tmp_path / "log"), hide=["persistlog._cbor_json"] if path == "pure" else [])
    assert out["accelerated"] is (path == "c")
    assert out["interrupt"] == "inside the encoder"
    assert "the app's encoder failed" in out["type_error"]
    assert out["worker_done"]
    assert out["lsns"] == [1, 2, 3, 4]
    assert out["records"] == [["i"], ["i"], ["i"], ["i", "part"]]
    # Each failed encoding had written part of its record (the pad) to the buffer: the
    # blocked buffer's next append cut it.
    assert len(out["partial"]) == 2 and min(out["partial"]) > 9000, out["partial"]



@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("durability", ["fsync", "flush", "buffered"])
def test_sigint_during_updates_propagates_and_loses_nothing(tmp_path: Path, durability: str, path: str) -> None:
    """SIGINT over and over during update()/update_many()/sync()/rotate(): every
    KeyboardInterrupt reaches the app as itself, the app goes on with the same Log and
    closes it, and the restore holds every acknowledged record, in order, with no hole
    (an interrupted record may be there once more, as the app tried it again). On both
    paths of update()'s staging: in C, and in Python."""
    report, records = _interrupt_repeatedly(tmp_path, durability, seconds=4.0, path=path)
    acked = report["acked"]
    # The restore starts at the newest complete log: updates written between its start and
    # its snapshot record come first, and the snapshot covers them (or they are attempts,
    # interrupted, at the record it says comes next).
    first = next(n for n, r in enumerate(records) if "upto" in r)
    early = [r["i"] for r in records[:first]]
    assert all(i <= records[first]["upto"] for i in early), (early, records[first])
    have = 0  # records 0..have-1 are in the log, in order
    repeats = 0
    for r in records[first:]:
        if "upto" in r:
            assert r["upto"] >= have, (r, have)  # a snapshot never goes back
            have = r["upto"]
        elif r["i"] == have:
            have += 1
        else:
            assert r["i"] < have, f"record {r['i']} follows record {have - 1}: a hole"
            repeats += 1
    assert acked <= have <= acked + 2, (acked, have)
    # Each interrupted call's records may be there once more (both of an update_many's).
    assert repeats <= report["interrupted_records"], (repeats, report)


# -- an interruption at every storage step, deterministically ----------------------------


def _interrupt_here(label: str, point: str) -> None:
    if threading.current_thread() is threading.main_thread():
        raise KeyboardInterrupt(f"at {point}")


def _retried(call: Any) -> int:
    """Call ``call()`` until no KeyboardInterrupt stops it; returns how many did."""
    interrupts = 0
    while True:
        try:
            call()
            return interrupts
        except KeyboardInterrupt:
            interrupts += 1


def _workload(url: str, options: dict[str, Any], sim: CrashSim, at: tuple[str, int] | None) -> tuple[int, int, int]:
    """Log 40 records (each written at once: ``flush`` mode), with syncs, a rotation and
    segment roll-overs, retrying whatever a KeyboardInterrupt stopped; then close. With
    ``at`` = (failpoint, n), the n-th time the main thread passes it raises the interrupt.
    Returns (records acknowledged, interruptions caught, failpoints passed before the
    workload began)."""
    acked = {"n": 0}

    def enumerate_all(emit: Any) -> None:
        emit({"upto": acked["n"]})

    lg = persistlog.open(url, enumerate_all, storage_options=options, durability="flush",
                         segment_bytes=4096, flush_interval=3600, retain=1, replay=lambda r: None)
    began = len(sim.points)
    if at is not None:
        sim.on(at[0], _interrupt_here, nth=at[1])
    interrupts = 0

    def retried(call: Any) -> None:
        nonlocal interrupts
        interrupts += _retried(call)

    for i in range(40):
        retried(lambda: lg.update({"i": i, "pad": "x" * 150}))
        acked["n"] = i + 1
        if i % 7 == 6:
            retried(lg.sync)
        if i == 25:
            retried(lg.rotate)
    retried(lg.close)
    return acked["n"], interrupts, began


def _check_restored(url: str, acked: int) -> None:
    records: list[Any] = []
    restored = persistlog.restore(url, records.append)
    assert restored.torn_tail is None and not restored.skipped
    first = next(n for n, r in enumerate(records) if "upto" in r)
    have = records[first]["upto"]
    assert all(r["i"] <= have for r in records[:first])
    for r in records[first + 1:]:
        assert r["i"] <= have, f"record {r['i']} follows record {have - 1}: a hole"
        have += r["i"] == have
    assert have == acked


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "memory"])
def test_an_interruption_at_any_storage_step_loses_nothing(tmp_path: Path, where: str, clean_memory_fs: None) -> None:
    """A KeyboardInterrupt raised before, and after, every storage call the app's thread
    makes (writes, flushes, syncs, segment and log creation, PUTs, the seal): it reaches
    the app as itself, the same Log goes on, and the restore holds every record
    acknowledged, in order, once each (a retried record at most twice)."""

    def target(run: str) -> tuple[str, dict[str, Any], CrashSim, str]:
        sim = CrashSim()
        if where == "local":
            url, options = sim.local(tmp_path / run)
            return url, options, sim, str(tmp_path / run)
        url, options = sim.remote(f"memory://interrupts/{run}")
        return url, options, sim, f"memory://interrupts/{run}"

    url, options, sim, plain = target("recording")
    _, _, began = _workload(url, options, sim, None)
    seen: dict[str, int] = {}
    steps: list[tuple[str, int]] = []
    for label, point, _ in sim.points[began:]:
        if label == "primary" and not point.startswith("mid:"):
            seen[point] = seen.get(point, 0) + 1
            steps.append((point, seen[point]))
    if where == "memory":
        expected = {"before:put segment", "after:put segment"}
    else:
        expected = {"before:append.write segment", "after:append.write segment", "after:append.flush segment",
                    "after:append.sync segment", "after:create segment"}
    assert len(steps) > 20 and {p for p, _ in steps} >= expected, steps
    interrupted = 0
    for n, (point, nth) in enumerate(steps):
        url, options, sim, plain = target(f"run{n}")
        acked, interrupts, _ = _workload(url, options, sim, (point, nth))
        interrupted += interrupts
        _check_restored(plain, acked)
    # Steps taken on the rotation thread are not interrupted (Ctrl-C reaches the main one).
    assert interrupted >= len(steps) // 3, (interrupted, len(steps))


# -- an interruption between a control batch's write and the Log's note of it -------------


def _interrupt_after_control_batches(monkeypatch: pytest.MonkeyPatch) -> tuple[list[bytes], list[bool]]:
    """Have each segment writer's ``append`` raise ``KeyboardInterrupt`` on the main thread
    right after it appended a control batch (it takes no LSN), while armed (once per arming):
    the batch is at the segment writer, the Log has not taken note of it. Returns the
    batches interrupted, and the arming flag to set."""
    from persistlog._write.segment_writer import AppendSegments, ObjectSegments

    interrupted: list[bytes] = []
    armed = [False]
    for cls in (AppendSegments, ObjectSegments):
        real = cls.append

        def append(sw: Any, data: bytes, first_lsn: int, next_lsn: int, real: Any = real) -> None:
            real(sw, data, first_lsn, next_lsn)
            if first_lsn == next_lsn and armed[0] and threading.current_thread() is threading.main_thread():
                armed[0] = False
                interrupted.append(data)
                raise KeyboardInterrupt("right after a control batch was appended")

        monkeypatch.setattr(cls, "append", append)
    return interrupted, armed


@pytest.mark.parametrize("where", ["local", "memory"])
def test_an_interruption_right_after_a_control_batch_keeps_the_chain(
        tmp_path: Path, where: str, clean_memory_fs: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt right after the segment writer took a control batch (a signed
    checkpoint, written on the app's thread after its record batch in ``flush`` mode)
    and before the Log took note of it: the batches after it and the seal link to it, at
    the primary and at its secondary, and a strict restore of each gives every update
    acknowledged."""
    ed25519 = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ed25519")
    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    if where == "local":
        url, secondary = str(tmp_path / "log"), str(tmp_path / "secondary")
    else:
        url, secondary = "memory://interrupts/control/log", "memory://interrupts/control/secondary"
    acked = {"n": 0}

    def enumerate_all(emit: Any) -> None:
        emit({"upto": acked["n"]})

    interrupted, armed = _interrupt_after_control_batches(monkeypatch)
    lg = persistlog.open(url, enumerate_all, durability="flush", segment_bytes=4096, flush_interval=3600,
                         secondaries=[secondary], signing_key=key, sign_interval=1e-9, replay=lambda r: None)
    interrupts = 0

    def retried(call: Any) -> None:
        nonlocal interrupts
        armed[0] = True  # once per call: its retry goes through
        interrupts += _retried(call)

    for i in range(30):
        retried(lambda: lg.update({"i": i, "pad": "x" * 150}))
        acked["n"] = i + 1
        if i == 15:
            retried(lg.rotate)
    retried(lg.close)
    assert interrupts >= 20 and len(interrupted) == interrupts, (interrupts, len(interrupted))
    _check_restored(url, acked["n"])
    _check_restored(secondary, acked["n"])


def _write_path_files() -> tuple[str, ...]:
    """Where the code a Log's calls run on the app's thread lives: the writer, the runtime
    and the destinations."""
    import destinations

    package = Path(persistlog.__file__).parent
    return (str(package / "_write") + os.sep, str(package / "_runtime.py"), str(Path(destinations.__file__).parent) + os.sep)


def _interrupted_at_point(tmp_path: Path, durability: str, concurrent: bool, nth: int | None,
                          where: str = "local") -> tuple[int, int, str]:
    """Log 12 records with a count trigger of 4 (a ``sync()`` and a ``rotate()`` among
    them, segments of 4 KiB), then close, with a KeyboardInterrupt at the ``nth`` point
    where CPython can run a signal handler on the app's thread in the write path (None:
    none): the entry of one of its Python functions, or the return of a C call it makes.
    Each call is retried as an app would. Returns (points passed, interruptions, the
    point interrupted); asserts that no call waited for a timeout and that the restore
    holds every update acknowledged, once each (an interrupted one at most twice). On a
    local disk, or (``where="memory"``) an object store: ``memory://``."""
    url = str(tmp_path / f"log-{nth}") if where == "local" else f"memory://interrupts/points/log-{nth}"
    acked = {"n": 0}
    # Held while a record is logged and counted, and while emitting: the concurrent
    # contract (the quiet point holds the updates while enumerate_all runs).
    app_lock: Any = threading.Lock() if concurrent else contextlib.nullcontext()

    def enumerate_all(emit: Any) -> None:
        with app_lock:
            emit({"upto": acked["n"]})

    # memory:// lists while another thread deletes at its peril (fsspec's MemoryFileSystem
    # raises KeyError): no retention on the rotation job there.
    retain = 1 if where == "local" else 50
    lg = persistlog.open(url, enumerate_all, durability=durability, rotate_records=4, retain=retain, segment_bytes=4096,
                         flush_interval=3600, concurrent_enumeration=concurrent, replay=lambda r: None)
    retried = Retrier()

    def update(i: int) -> None:
        with app_lock:
            lg.update({"i": i, "pad": "x" * 300})
            acked["n"] = i + 1

    with PointInterrupter(_write_path_files(), nth) as at:
        for i in range(12):
            retried(lambda: update(i))
            if i == 5:
                retried(lg.sync)
            if i == 8:
                retried(lg.rotate)
        retried(lg.close)
    point = at.where
    # A held update (retried once, at most) waits for its rotation, not for a timeout.
    assert retried.slowest < 5, (point, retried.slowest)
    assert lg.seq >= 3, (point, lg.seq)  # the open's log, then the triggers' and rotate()'s
    _check_restored(url, acked["n"])
    # close() let the writer lock go: the log opens again (a close interrupted as it let
    # go once left the lock held for the process's life).
    try:
        persistlog.open(url, lambda emit: None, replay=lambda r: None).close()
    except persistlog.WriterConflict as e:
        raise AssertionError(f"the lock is still held after close() (interrupted at {point})") from e
    return at.points, retried.interrupts, point


@pytest.mark.slow
@pytest.mark.parametrize("concurrent", [True, False], ids=["concurrent", "quiet-point"])
@pytest.mark.parametrize("durability", ["flush", "buffered"])
def test_an_interruption_at_any_point_of_the_write_path_loses_nothing_and_stalls_nothing(
        tmp_path: Path, durability: str, concurrent: bool) -> None:
    """A KeyboardInterrupt at each point where CPython could run Ctrl-C's handler on the
    app's thread in the write path (``persistlog/_write``, the runtime, the destinations:
    as each Python function starts, and after each C call returns), through updates, a
    count trigger's rotations, ``sync()``, ``rotate()`` and ``close()``: the app's retried
    call goes through without waiting for a timeout, the rotations run, and the restore
    holds every update acknowledged. (A KeyboardInterrupt between a fired trigger's
    request and the scheduling of its job once left the log never rotating again.)"""
    every_point(lambda nth: _interrupted_at_point(tmp_path, durability, concurrent, nth))


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["flush", "buffered"])
def test_an_interruption_at_any_point_of_an_object_store_writer_loses_nothing_and_stalls_nothing(
        tmp_path: Path, durability: str, clean_memory_fs: None) -> None:
    """The same on an object store (``memory://``, the writer's S3 path: segment objects
    PUT whole, the lease object, CURRENT and the seal by conditional writes): at each
    point the retried calls go through without waiting for a timeout, the restore holds
    every update acknowledged, and ``close()`` lets the lease go."""
    # In flush mode every write PUTs: about 3,000 points a run, 0.17 s each; every 12th
    # point there (the local sweep takes every point of the same code above the store).
    every_point(lambda nth: _interrupted_at_point(tmp_path, durability, False, nth, "memory"),
                stride=12 if durability == "flush" else 1)


def test_a_batch_handed_over_again_is_counted_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt after the primary took a batch, while it is handed to a
    secondary: the next write hands it over again (the primary ignores it), and
    ``stats()`` counts each batch, and its bytes, once."""
    from persistlog._write.secondaries import Secondary
    from persistlog._write.segment_writer import AppendSegments

    url = str(tmp_path / "log")
    at_primary: dict[bytes, None] = {}  # the distinct batches the primary's segment writers took
    at_secondary: dict[bytes, None] = {}  # ... and the secondary's
    real_append, real_batch = AppendSegments.append, Secondary.batch
    armed = [False]
    interrupted = [0]

    def append(sw: Any, data: bytes, first_lsn: int, next_lsn: int) -> None:
        real_append(sw, data, first_lsn, next_lsn)
        if sw.dest.url == url:
            at_primary[data] = None
        else:
            at_secondary[data] = None

    def batch(secondary: Any, data: bytes, first: int, end: int) -> None:
        real_batch(secondary, data, first, end)
        if armed[0] and threading.current_thread() is threading.main_thread():
            armed[0] = False
            interrupted[0] += 1
            raise KeyboardInterrupt("while a batch is handed to a secondary")

    monkeypatch.setattr(AppendSegments, "append", append)
    monkeypatch.setattr(Secondary, "batch", batch)
    lg = persistlog.open(url, lambda emit: emit({"snapshot": True}), durability="flush", flush_interval=3600,
                         secondaries=[str(tmp_path / "secondary")], replay=lambda r: None)
    before = lg.stats()
    for i in range(20):
        armed[0] = True
        _retried(lambda: lg.update({"i": i}))
    armed[0] = False
    lg.sync()
    s = lg.stats()
    lg.close()
    assert interrupted[0] == 20
    assert s["batches"] == len(at_primary) and s["bytes"] == sum(map(len, at_primary)), (s, len(at_primary))
    secondary = lg.stats()["destinations"][1]
    assert secondary["batches"] == len(at_secondary) >= 20, (secondary, len(at_secondary))
    assert secondary["bytes"] == sum(map(len, at_secondary))
    # Each update was written at once, in a batch of its own (its retry, in another).
    assert s["batches"] - before["batches"] == s["updates"] - before["updates"] >= 20


@pytest.mark.slow
def test_an_interruption_while_a_big_record_is_taken_out_of_the_buffer_leaves_nothing_of_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record too big for the batch buffer is encoded there first, then taken out of it
    for the slow path: an interruption in between leaves its bytes past the buffer's last
    whole record, and the buffer blocked, so that the next update cuts them; the record
    itself is refused as too large. On the path update()'s staging takes here (C where
    the accelerator is built)."""
    from persistlog._write.batch_buffer import BatchBuffer

    real = BatchBuffer._take_back
    taken: list[int] = []

    def take_back(buffer: Any, pos: int, end: int) -> bytes:
        taken.append(end - pos)
        if len(taken) == 1:
            raise KeyboardInterrupt("while a big record is taken out of the buffer")
        return real(buffer, pos, end)

    monkeypatch.setattr(BatchBuffer, "_take_back", take_back)
    url = str(tmp_path / "log")
    big = {"big": "b" * (32 * 1024 * 1024)}  # over the 32 MiB a record may take
    with persistlog.open(url, lambda emit: None) as lg:
        assert lg.update({"i": 0}) == 1
        with pytest.raises(KeyboardInterrupt):
            lg.update(big)
        assert lg.update({"i": 1}) == 2
        with pytest.raises(ValueError, match="exceeds"):
            lg.update(big)
        assert lg.update({"i": 2}) == 3
    assert len(taken) == 2 and min(taken) > 32 * 1024 * 1024
    records: list[Any] = []
    persistlog.restore(url, records.append)
    assert records == [{"i": 0}, {"i": 1}, {"i": 2}]


# -- an interrupted PUT that lands after the writer looked for it ----------------------------


def test_interrupt_s3_a_put_landing_after_its_interruption_is_the_writers_own(
    monkeypatch: pytest.MonkeyPatch, clean_memory_fs: None
) -> None:
    """The guarantee matrix's ``queue-flush-interrupt-s3-bytes``: Ctrl-C during a segment
    PUT stops the app's wait, not the request, which s3fs goes on with in its own thread,
    so the object may land after the writer's next call looked for it. That call (here the
    seal of ``close()``) PUTs the same bytes again and finds its own object, not another
    writer's: ``close()`` returns, and the restore holds every acknowledged record (before,
    the seal's PUT met the late object and the Log failed, "another writer took it over")."""
    from faults import FaultyFileSystem

    real = FaultyFileSystem.pipe_file
    late: list[Any] = []
    armed = [False]

    def pipe_file(fs: FaultyFileSystem, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        while late:
            late.pop()()  # the interrupted request lands now, after the writer looked
        if armed[0] and mode == "create" and path.endswith(".plog"):
            armed[0] = False
            late.append(lambda: real(fs, path, value, mode=mode, **kwargs))
            raise KeyboardInterrupt("Ctrl-C while a PUT is under way")
        real(fs, path, value, mode=mode, **kwargs)

    monkeypatch.setattr(FaultyFileSystem, "pipe_file", pipe_file)
    url, so = "faulty://interrupted-put/log", {"target_protocol": "memory"}
    lg = persistlog.open(url, lambda emit: None, durability="flush", storage_options=so)
    for i in range(5):
        lg.update({"i": i})
    armed[0] = True
    with pytest.raises(KeyboardInterrupt):
        lg.update({"i": 5})
    assert late, "the PUT was not interrupted"
    lg.close()
    records: list[Any] = []
    restored = persistlog.restore(url, records.append, storage_options=so)
    assert [r["i"] for r in records] == list(range(6))  # the interrupted update landed whole
    assert restored.torn_tail is None and not restored.skipped


# -- an interruption at any point of opening a log ----------------------------------------


_LEFT_BY_A_CRASH = """
import os, sys
import persistlog

lg = persistlog.open(sys.argv[1], lambda emit: emit({"upto": 0}), durability="flush")
for i in range(6):
    lg.update({"i": i})
if sys.argv[2] == "closed":
    lg.close()
print("{}")
sys.stdout.flush()
os._exit(0)  # (crashed: the writer's LOCK record and no seal left behind)
"""


def _copy_of(template: str, nth: int | None) -> str:
    """A copy of the log at ``template`` (a directory, or a ``memory://`` URL) of its own."""
    if template.startswith("memory://"):
        import fsspec

        url = f"{template}-{nth}"
        fsspec.filesystem("memory").copy(template[len("memory://"):], url[len("memory://"):], recursive=True)
        return url
    url = f"{template}-{nth}"
    shutil.copytree(template, url)
    return url


def _opened_interrupted_at_point(template: str, nth: int | None) -> tuple[int, int, str]:
    """Open a copy of ``template``, a log of 6 records (closed, or left by a crash), which
    restores it (``replay=``), then log 3 more and close, with a KeyboardInterrupt at the
    ``nth`` point where CPython can run a signal handler on the app's thread (in the
    package and the destinations: the restore, the lock's take-over, the open's first
    log...). Each call is retried as an app would: the open must not find the log locked
    by its own interrupted attempt, and the restore holds the 9 records."""
    url = _copy_of(template, nth)
    acked = {"n": 6}

    def enumerate_all(emit: Any) -> None:
        emit({"upto": acked["n"]})

    import destinations

    files = (str(Path(persistlog.__file__).parent) + os.sep, str(Path(destinations.__file__).parent) + os.sep)
    retried = Retrier()
    with PointInterrupter(files, nth) as at:
        lg = retried(lambda: persistlog.open(url, enumerate_all, durability="flush", replay=lambda r: None))
        for i in range(6, 9):
            retried(lambda: lg.update({"i": i}))
            acked["n"] = i + 1
        retried(lg.close)
    assert retried.slowest < 5, (at.where, retried.slowest)
    _check_restored(url, acked["n"])
    return at.points, retried.interrupts, at.where


@pytest.mark.slow
@pytest.mark.parametrize("left", ["closed", "crashed", "closed-memory"])
def test_an_interruption_at_any_point_of_opening_a_log_leaves_it_openable(
        tmp_path: Path, left: str, clean_memory_fs: None) -> None:
    """A KeyboardInterrupt at each point where CPython could run Ctrl-C's handler on the
    app's thread while ``persistlog.open()`` restores a log (closed, or left by a crashed
    writer whose lock it takes over; on a local disk, or closed on an object store,
    ``memory://``, whose lease an interrupted attempt must not leave behind) and starts the
    next one, then through updates and ``close()``: the retried open goes through (an
    interrupted attempt lets the lock go), no call waits for a timeout, and the restore
    holds every record."""
    if left == "closed-memory":
        template = "memory://interrupts/open/template"
        lg = persistlog.open(template, lambda emit: emit({"upto": 0}), durability="flush")
        for i in range(6):
            lg.update({"i": i})
        lg.close()
        # An object store's open takes about 3,000 points: every fifth there.
        every_point(lambda nth: _opened_interrupted_at_point(template, nth), stride=5)
        return
    template = str(tmp_path / "template")
    run_json(_LEFT_BY_A_CRASH, template, left)
    every_point(lambda nth: _opened_interrupted_at_point(template, nth))

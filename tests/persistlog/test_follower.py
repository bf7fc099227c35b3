"""Followers (issue #4): tailing a log that a writer keeps changing, resumably.

Real writer and follower processes on a local directory and on S3 (moto), with rotations,
retention, and the writer killed by SIGKILL and restarted; cursor resume at random points
(no record applied twice or skipped); retention overrun and cursors ahead of the log;
torn tails waited on and corruption raised; no busy loop when idle; O(1) requests per idle
poll on S3; followers never write.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import persistlog
from plhelpers import apply, wait_until
from destinations import open_destination
from faults import FaultPlan

REPO = Path(__file__).resolve().parents[2]
PROCS = Path(__file__).resolve().parent / "procs"

SEGMENT_HEADER = 40
BATCH_HEADER = 40


# -- helpers ------------------------------------------------------------------------------




class Writer:
    """An app with its dict state, logging every change through a persistlog Log."""

    def __init__(
        self, url: str, storage_options: dict[str, Any] | None = None, *, restore: bool = False, **options: Any
    ) -> None:
        self.url = url
        self.so = storage_options
        self.state: dict[str, Any] = {}
        if restore:  # restore, then open: the app's state is what the log holds
            persistlog.restore(url, lambda r: apply(self.state, r), storage_options=storage_options)
        self.log = persistlog.open(url, self.enumerate_all, storage_options=storage_options, **options)
        self.n = 0

    def enumerate_all(self, emit: Callable[[Any], None]) -> None:
        for k, v in list(self.state.items()):
            emit({"op": "put", "key": k, "value": v})

    def put(self, key: str, value: Any, sync: bool = False) -> int:
        self.n += 1
        lsn = self.log.update({"op": "put", "key": key, "value": value}, sync=sync)
        self.state[key] = value
        return lsn

    def delete(self, key: str, sync: bool = False) -> int:
        self.n += 1
        lsn = self.log.update({"op": "del", "key": key}, sync=sync)
        self.state.pop(key, None)
        return lsn

    def random_ops(self, rng: random.Random, count: int, keys: int = 25) -> None:
        for _ in range(count):
            key = f"k{rng.randrange(keys)}"
            if rng.random() < 0.25:
                self.delete(key)
            else:
                self.put(key, [self.n, "v" * rng.randrange(40)])

    @property
    def last_lsn(self) -> int:
        return self.log.next_lsn - 1

    def close(self) -> None:
        self.log.close()


@dataclass
class Where:
    """One kind of destination a test runs against."""

    kind: str
    url: str
    so: dict[str, Any] | None = None
    # Options of persistlog.open suited to the kind (flush intervals, leases).
    open_options: dict[str, Any] = field(default_factory=dict)

    def dest(self) -> Any:
        return open_destination(self.url, **(self.so or {}))

    def names(self) -> list[str]:
        return self.dest().list()

    def log_seqs(self) -> list[int]:
        return sorted({int(n[:20]) for n in self.names() if n.endswith(".plog")})

    def restore(self) -> tuple[dict[str, Any], persistlog.RestoreResult]:
        state: dict[str, Any] = {}
        result = persistlog.restore(self.url, lambda r: apply(state, r), storage_options=self.so)
        return state, result

    def follow(self, replay: Callable[[Any], Any] | None = None, **kwargs: Any) -> persistlog.Follower:
        kwargs.setdefault("poll_interval", 0.02)
        return persistlog.follow(self.url, replay, storage_options=self.so, **kwargs)


def make_where(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    if kind == "local":
        return Where(kind, str(tmp_path / "log"))
    if kind == "memory":
        request.getfixturevalue("clean_memory_fs")
        return Where(kind, f"memory://f{uuid.uuid4().hex[:10]}/log", open_options={"flush_interval": 0.02})
    if kind == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        so = request.getfixturevalue("s3_storage_options")
        return Where(kind, f"s3://{bucket}/app/log", so, open_options={"flush_interval": 0.05, "lease_ttl": 3})
    raise AssertionError(kind)


@pytest.fixture(params=["local", "memory", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    return make_where(request.param, request, tmp_path)


@pytest.fixture(params=["local", "s3"])
def shared_where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    """Destinations another process can reach (memory:// is per process)."""
    return make_where(request.param, request, tmp_path)




def drain(follower: persistlog.Follower, target_lsn: int, timeout: float = 20.0) -> list[persistlog.FollowedBatch]:
    """Iterate ``follower`` until it applied ``target_lsn``; the batches it yielded."""
    out: list[persistlog.FollowedBatch] = []
    if follower.cursor is not None and follower.cursor.next_lsn - 1 == target_lsn:
        return out  # already there (a cursor ahead of the log is not: it must reset)
    guard = threading.Timer(timeout, follower.stop)
    guard.start()
    try:
        for fb in follower:
            out.append(fb)
            if fb.last_lsn >= target_lsn:
                break
    finally:
        guard.cancel()
    assert out and out[-1].last_lsn == target_lsn, (
        f"follower stopped at {out[-1].last_lsn if out else None}, expected LSN {target_lsn}; error={follower.error!r}"
    )
    return out


def check_chain(batches: list[persistlog.FollowedBatch], after: int | None) -> int | None:
    """Assert the batches carry gapless, non-repeating LSNs after ``after``; returns the last."""
    for fb in batches:
        assert fb.last_lsn - fb.first_lsn + 1 == len(fb.records), fb
        if after is not None:
            assert fb.first_lsn == after + 1, f"LSN {after + 1} expected, batch starts at {fb.first_lsn}"
        after = fb.last_lsn
        assert fb.cursor.next_lsn == fb.last_lsn + 1
    return after


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


class Proc:
    """A child process running one of the scripts in ``procs/``."""

    def __init__(self, script: str, cfg: dict[str, Any], logdir: Path, name: str) -> None:
        self.name = name
        self.stderr_path = logdir / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.p = subprocess.Popen(
            [sys.executable, str(PROCS / script), json.dumps(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            env=child_env(),
            cwd=str(logdir),
        )

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")[-3000:]

    def wait(self, timeout: float) -> int:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not finish within {timeout}s; stderr:\n{self.stderr()}") from None

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait(30)

    def close(self) -> None:
        self.kill()
        self._stderr.close()


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


# -- writer and follower processes -----------------------------------------------------


@pytest.mark.slow
def test_follower_process_tracks_writer_process_through_kill_and_restart(shared_where: Where, tmp_path: Path) -> None:
    """A follower process keeps up with a writer process through updates, deletes, several
    rotations with retention, a SIGKILL of the writer and its restart (restore, then open):
    once caught up, the follower holds exactly the writer's state, having applied every LSN
    once in order (between resets, if it ever lagged past retention)."""
    w = shared_where
    run = tmp_path / "run"
    run.mkdir()
    opts: dict[str, Any] = {"segment_bytes": 4096, "retain": 2, "flush_interval": 0.01}
    if w.kind == "s3":
        opts.update(flush_interval=0.05, lease_ttl=2)
    follower_cfg = {
        "url": w.url, "storage_options": w.so, "poll": 0.01 if w.kind == "local" else 0.05,
        "progress": str(run / "f.progress"), "stop": str(run / "f.stop"), "out": str(run / "f.out"),
    }
    writer_cfg = {
        "url": w.url, "storage_options": w.so, "seed": 1, "ops": 100_000, "keys": 40,
        "rotate_every": 60, "sync_every": 7, "pace": 0.004, "open": opts,
        "progress": str(run / "w1.progress"), "result": str(run / "w1.result"),
    }
    procs: list[Proc] = []
    try:
        # The follower starts first, on a destination that has no log yet.
        follower = Proc("follower.py", follower_cfg, run, "follower")
        procs.append(follower)
        writer1 = Proc("writer.py", writer_cfg, run, "writer1")
        procs.append(writer1)

        def w1_ops() -> int:
            p = read_json(run / "w1.progress")
            assert writer1.p.poll() is None, f"writer 1 exited early:\n{writer1.stderr()}"
            return p["ops"] if p else 0

        # Several rotations (every 60 operations) and retention happen before the kill.
        wait_until(lambda: w1_ops() >= 330, 60, lambda: f"writer 1 progress {read_json(run / 'w1.progress')}")
        writer1.kill()
        acked = read_json(run / "w1.progress")["acked_lsn"]

        writer2_cfg = dict(writer_cfg, seed=2, ops=150, pace=0.002, rotate_every=50, open_retry=30,
                           progress=str(run / "w2.progress"), result=str(run / "w2.result"))
        writer2 = Proc("writer.py", writer2_cfg, run, "writer2")
        procs.append(writer2)
        assert writer2.wait(90) == 0, writer2.stderr()
        result = read_json(run / "w2.result")
        # Restore-then-open found everything writer 1 acknowledged as durable.
        assert result["restored_from"] >= acked
        last = result["next_lsn"] - 1

        def caught_up() -> bool:
            assert follower.p.poll() is None, f"follower exited:\n{follower.stderr()}"
            p = read_json(run / "f.progress")
            return bool(p and p["last_lsn"] == last)

        wait_until(caught_up, 60, lambda: f"follower at {read_json(run / 'f.progress')}, writer ended at LSN {last}")
        (run / "f.stop").touch()
        assert follower.wait(30) == 0, follower.stderr()
        out = read_json(run / "f.out")
    finally:
        for p in procs:
            p.close()
    assert out["lsn_errors"] == [], out["lsn_errors"]
    assert out["state"] == result["state"]
    restored, _ = w.restore()
    assert restored == result["state"]
    # Retention deleted the old logs while the follower was following.
    assert min(w.log_seqs()) > 3
    if w.kind == "s3":
        assert out["stats"]["PUT"] == 0 and out["stats"]["DELETE"] == 0, out["stats"]


# -- cursor resume ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [11, 12])
def test_cursor_resume_at_random_points_applies_each_record_once(where: Where, seed: int) -> None:
    """Stop the follower at random points (mid-segment, mid-object, at a seal, before any
    batch), persist ``str(cursor)``, resume a new follower from it: the LSNs applied are
    gapless and never repeat, and the state equals the writer's."""
    rng = random.Random(seed)
    if where.kind == "s3" and seed != 11:
        pytest.skip("one seed is enough on S3")
    # flush mode: one batch per update; a long flush interval puts many batches in each
    # object-store segment, so that stops land in the middle of objects.
    w = Writer(where.url, where.so, durability="flush", segment_bytes=4096, retain=50, flush_interval=30)
    state: dict[str, Any] = {}
    saved: str | None = None
    last: int | None = None
    stops = 0
    rounds = 6 if where.kind == "s3" else 12
    try:
        for round_ in range(rounds):
            w.random_ops(rng, rng.randrange(5, 40))
            if rng.random() < 0.3:
                w.log.rotate()
                w.random_ops(rng, rng.randrange(0, 5))
            w.log.sync()
            target = w.last_lsn
            # Follow to the end in several legs, each stopped after a random number of batches.
            while True:
                cursor: Any = saved
                if saved is not None and rng.random() < 0.5:
                    cursor = persistlog.Cursor.from_dict(json.loads(persistlog.Cursor.parse(saved).to_json()))
                f = where.follow(lambda r: apply(state, r), cursor=cursor)
                leg: list[persistlog.FollowedBatch] = []
                want = rng.randrange(0, 6)
                if want:
                    guard = threading.Timer(20, f.stop)
                    guard.start()
                    for fb in f:
                        leg.append(fb)
                        if len(leg) >= want or fb.last_lsn >= target:
                            break
                    guard.cancel()
                    assert leg, f"follower yielded nothing (error {f.error!r})"
                last = check_chain(leg, last)
                if f.cursor is not None:
                    saved = str(f.cursor)
                f.stop()
                stops += 1
                assert f.resets == 0
                if last == target:
                    break
            assert state == w.state, f"round {round_}"
    finally:
        w.close()
    assert stops > rounds


def test_cursor_roundtrip_and_bad_cursors() -> None:
    c = persistlog.Cursor(3, 1, 4096, 77)
    assert persistlog.Cursor.parse(str(c)) == c
    assert persistlog.Cursor.from_dict(c.to_dict()) == c
    assert persistlog.Cursor.from_dict(json.loads(c.to_json())) == c
    for bad in ["", "1:2:3", "1:2:3:x", "-1:0:0:1", "1:2:3:4:5"]:
        with pytest.raises(ValueError):
            persistlog.Cursor.parse(bad)
    with pytest.raises(ValueError):
        persistlog.Cursor.from_dict({"log": 1})
    with pytest.raises(TypeError):
        persistlog.follow("memory://x/never", lambda r: None, cursor=12)  # type: ignore[arg-type]


# -- retention overrun, cursors ahead -------------------------------------------------------


def _overrun(w: Writer, where: Where, seq: int, retain: int) -> None:
    """Rotate until log ``seq`` is gone from the destination (retention may run late)."""
    for i in range(retain + 1):
        w.put(f"r{i}", i)
        w.log.rotate()
    w.put("after", 1, sync=True)
    wait_until(lambda: seq not in where.log_seqs(), 20, lambda: f"log {seq} still at {where.names()}")


def test_retention_overrun_resets_through_on_reset(where: Where) -> None:
    w = Writer(where.url, where.so, retain=1, **where.open_options)
    try:
        for i in range(30):
            w.put(f"k{i % 9}", i)
        w.log.rotate()
        w.delete("k1")
        w.put("k2", "x", sync=True)
        state: dict[str, Any] = {}
        f = where.follow(lambda r: apply(state, r))
        check_chain(drain(f, w.last_lsn), None)
        saved = str(f.cursor)
        f.stop()
        assert state == w.state
        _overrun(w, where, persistlog.Cursor.parse(saved).log, retain=1)

        # Without a hook: ResetRequired, and nothing applied.
        bare = where.follow(lambda r: apply(state, r), cursor=saved)
        with pytest.raises(persistlog.ResetRequired):
            bare.poll()
        bare.stop()

        # With a hook: the app clears its state, the follower re-syncs from the newest
        # complete log and carries on.
        resets: list[int] = []

        def on_reset() -> None:
            resets.append(1)
            state.clear()

        f2 = where.follow(lambda r: apply(state, r), cursor=saved, on_reset=on_reset)
        batches = drain(f2, w.last_lsn)
        assert resets == [1] and f2.resets == 1
        assert state == w.state
        check_chain(batches, None)
        w.put("later", 2, sync=True)
        check_chain(drain(f2, w.last_lsn), batches[-1].last_lsn)
        assert state == w.state and resets == [1]
        f2.stop()
    finally:
        w.close()


def test_follower_left_unpolled_past_retention_resets(where: Where) -> None:
    """The same follower object, not polled while retention deletes the logs after its
    position (it had read its log to the seal), resets on its next poll instead of
    reporting corruption."""
    w = Writer(where.url, where.so, retain=1, **where.open_options)
    w.put("a", 1)
    w.log.rotate()
    w.put("b", 2)
    w.close()  # seals the log
    state: dict[str, Any] = {}
    resets: list[int] = []
    f = where.follow(lambda r: apply(state, r), on_reset=lambda: (resets.append(1), state.clear()))
    drain(f, w.last_lsn)
    assert f.poll() == 0
    seq = f.cursor.log  # type: ignore[union-attr]
    w2 = Writer(where.url, where.so, restore=True, retain=1, **where.open_options)
    try:
        w2.put("c", 3)
        _overrun(w2, where, seq + 1, retain=1)
        assert seq not in where.log_seqs()
        drain(f, w2.last_lsn)
        assert resets == [1]
        assert state == w2.state
        f.stop()
    finally:
        w2.close()


def test_cursor_ahead_of_the_log_resets(where: Where) -> None:
    w = Writer(where.url, where.so, **where.open_options)
    try:
        for i in range(10):
            w.put(f"k{i}", i)
        w.log.sync()
        state: dict[str, Any] = {}
        f = where.follow(lambda r: apply(state, r))
        drain(f, w.last_lsn)
        cur = f.cursor
        assert cur is not None
        f.stop()
        size = where.dest().size(f"{cur.log:020d}-{cur.segment:010d}.plog")
        ahead = [
            persistlog.Cursor(cur.log + 5, 0, 40, cur.next_lsn + 100),  # a log that does not exist yet
            persistlog.Cursor(cur.log, cur.segment + 3, 120, cur.next_lsn + 50),  # a segment that does not
            persistlog.Cursor(cur.log, cur.segment, size + 1000, cur.next_lsn + 10),  # past the end
        ]
        for c in ahead:
            with pytest.raises(persistlog.ResetRequired):
                where.follow(lambda r: None, cursor=c).poll()
            fresh: dict[str, Any] = {"junk": 1}
            resets: list[int] = []
            f2 = where.follow(lambda r: apply(fresh, r), cursor=str(c),
                              on_reset=lambda: (resets.append(1), fresh.clear()))
            drain(f2, w.last_lsn)
            assert resets == [1], c
            assert fresh == w.state, c
            f2.stop()
    finally:
        w.close()


# -- torn tails and corruption ---------------------------------------------------------


def batch_spans(data: bytes, start: int = SEGMENT_HEADER) -> list[tuple[int, int]]:
    """``(offset, end)`` of every whole batch in segment bytes (FORMAT.md: u32 stored length
    first in each 40-byte batch header)."""
    spans = []
    pos = start
    while pos + BATCH_HEADER <= len(data):
        end = pos + BATCH_HEADER + int.from_bytes(data[pos: pos + 4], "little")
        if end > len(data):
            break
        spans.append((pos, end))
        pos = end
    return spans


def _reference_segments(tmp_path: Path, records: int, segment_bytes: int = 1 << 20) -> tuple[Path, list[bytes], dict[str, Any]]:
    """A live, unsealed log written one batch per update: its segment files' bytes."""
    ref = tmp_path / "ref"
    w = Writer(str(ref), durability="flush", segment_bytes=segment_bytes)
    for i in range(records):
        w.put(f"k{i % 7}", [i, "p" * 30])
    w.log.sync()
    names = sorted(n for n in os.listdir(ref) if n.endswith(".plog"))
    segments = [(ref / n).read_bytes() for n in names]
    state = dict(w.state)
    w.close()
    return ref, segments, state


def test_torn_tail_of_live_segment_is_waited_on_then_applied(tmp_path: Path) -> None:
    _, segments, _ = _reference_segments(tmp_path, 12)
    seg = segments[0]
    spans = batch_spans(seg)
    live = tmp_path / "live"
    live.mkdir()
    path = live / f"{1:020d}-{0:010d}.plog"
    k = len(spans) - 4
    path.write_bytes(seg[: spans[k][0]])
    state: dict[str, Any] = {}
    f = persistlog.follow(str(live), lambda r: apply(state, r))
    first = f.poll()
    assert first > 0
    start, end = spans[k]

    def append(b: bytes) -> None:
        with open(path, "ab") as fh:
            fh.write(b)

    # A batch arriving in pieces: a short header, a whole header with part of the payload.
    for cut in (start + 7, start + BATCH_HEADER, end - 1):
        append(seg[os.path.getsize(path): cut])
        assert f.poll() == 0, f"cut at {cut}"
        assert f.cursor.offset == start  # type: ignore[union-attr]
    append(seg[os.path.getsize(path): end])
    assert f.poll() == 1
    # A zero-filled tail (preallocated space) is waited on too.
    with open(path, "ab") as fh:
        fh.write(b"\0" * 64)
    assert f.poll() == 0
    assert f.error is None
    f.stop()


def test_damaged_batch_before_the_tail_is_corruption(tmp_path: Path) -> None:
    _, segments, _ = _reference_segments(tmp_path, 12)
    seg = segments[0]
    spans = batch_spans(seg)
    live = tmp_path / "live"
    live.mkdir()
    name = f"{1:020d}-{0:010d}.plog"
    path = live / name
    k = len(spans) - 4
    path.write_bytes(seg[: spans[k][0]])
    f = persistlog.follow(str(live), lambda r: None)
    f.poll()
    bad = bytearray(seg[spans[k][0]: spans[k + 1][1]])
    bad[BATCH_HEADER + 3] ^= 0x40  # payload of batch k; batch k+1 follows it intact
    with open(path, "ab") as fh:
        fh.write(bytes(bad))
    with pytest.raises(persistlog.CorruptLogError) as e:
        f.poll()
    assert e.value.segment == name and e.value.offset == spans[k][0]
    f.stop()
    # A fresh follower (and restore) meet the same damage during the initial sync.
    with pytest.raises(persistlog.CorruptLogError):
        persistlog.follow(str(live), lambda r: None).poll()
    with pytest.raises(persistlog.CorruptLogError):
        persistlog.restore(str(live), lambda r: None)


def test_torn_end_of_a_segment_followed_by_another_is_corruption(tmp_path: Path) -> None:
    """Segments become durable in order: a torn-looking end of segment 0 once segment 1
    exists is damage, reported where it is (as restore does), never silently dropped."""
    _, segments, _ = _reference_segments(tmp_path, 220, segment_bytes=4096)
    assert len(segments) >= 2
    seg0 = segments[0]
    spans = batch_spans(seg0)
    live = tmp_path / "live"
    live.mkdir()
    name0 = f"{1:020d}-{0:010d}.plog"
    (live / name0).write_bytes(seg0[: spans[-3][0]])
    f = persistlog.follow(str(live), lambda r: None)
    assert f.poll() > 0
    torn_at = spans[-1][0]
    with open(live / name0, "ab") as fh:
        fh.write(seg0[spans[-3][0]: torn_at + 30])  # the last batch of the segment, torn
    (live / f"{1:020d}-{1:010d}.plog").write_bytes(segments[1])
    with pytest.raises(persistlog.CorruptLogError) as e:
        f.poll()
    assert e.value.segment == name0 and e.value.offset == torn_at, e.value
    with pytest.raises(persistlog.CorruptLogError) as r:
        persistlog.restore(str(live), lambda r: None)
    assert r.value.segment == name0 and r.value.offset == torn_at, r.value


def test_truncated_object_is_corruption_not_a_write_in_progress(clean_memory_fs: None) -> None:
    """Object stores write whole objects: a short object is damage, not something to wait for."""
    url = "memory://torn/log"
    w = Writer(url, flush_interval=30)
    for i in range(5):
        w.put(f"k{i}", i)
    w.log.sync()
    f = persistlog.follow(url, lambda r: None)
    f.poll()
    for i in range(5):
        w.put(f"j{i}", i)
    w.log.sync()
    dest = open_destination(url)
    last = [n for n in dest.list() if n.endswith(".plog")][-1]
    data = dest.read(last)
    dest.delete(last)
    dest.create(last, data[:-9])
    with pytest.raises(persistlog.CorruptLogError):
        f.poll()
    with pytest.raises(persistlog.CorruptLogError):
        persistlog.follow(url, lambda r: None).poll()
    f.stop()
    w.close()


# -- idle cost ---------------------------------------------------------------------------


def test_idle_local_follower_does_not_busy_loop(tmp_path: Path) -> None:
    w = Writer(str(tmp_path / "log"), segment_bytes=4096)
    for i in range(300):
        w.put(f"k{i % 13}", ["v" * 20, i])
    w.log.rotate()
    w.log.sync()
    try:
        out = subprocess.run(
            [sys.executable, str(PROCS / "idle_follower.py"), w.url, "1.0"],
            capture_output=True, text=True, timeout=60, env=child_env(),
        )
        assert out.returncode == 0, out.stderr
        r = json.loads(out.stdout)
    finally:
        w.close()
    assert r["error"] is None
    assert r["applied"] > 0
    assert r["polls"] >= 5  # it does poll while idle...
    assert r["cpu"] / r["wall"] < 0.2, r  # ...without spinning


def test_idle_s3_follower_makes_one_request_per_poll(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    where = make_where("s3", request, tmp_path)
    w = Writer(where.url, where.so, segment_bytes=4096, **where.open_options)
    try:
        for r in range(3):
            for i in range(40):
                w.put(f"k{i}", [r, i])
            w.log.sync()
            w.log.rotate()
        w.log.sync()
        f = where.follow(lambda r: None, poll_interval=0.05)
        while f.poll():
            pass
        f.poll()
        dest = f.dest
        before, polls = dest.stats(), f.polls
        for _ in range(20):
            assert f.poll() == 0
        after = dest.stats()
        delta = {k: after[k] - before[k] for k in after}
        assert f.polls - polls == 20
        assert delta == {"PUT": 0, "GET": 0, "LIST": 20, "DELETE": 0, "HEAD": 0}, delta
        f.stop()
    finally:
        w.close()


# -- followers never write ------------------------------------------------------------------


def _snapshot_local(path: Path) -> dict[str, tuple[int, int]]:
    return {e.name: (e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(path)}


def test_followers_never_write(shared_where: Where, tmp_path: Path) -> None:
    where = shared_where
    w = Writer(where.url, where.so, retain=1, **where.open_options)
    for i in range(50):
        w.put(f"k{i % 11}", i)
    w.log.rotate()
    w.put("z", 1)
    w.close()
    local = Path(where.url) if where.kind == "local" else None
    before = _snapshot_local(local) if local else None
    names = where.names()
    state: dict[str, Any] = {}
    f = where.follow(lambda r: apply(state, r), on_reset=state.clear)
    f.poll()
    # A resume from a stale cursor (a reset), then idle polls.
    stale = persistlog.Cursor(1, 0, 40, 1)
    f2 = where.follow(lambda r: apply(state, r), cursor=stale, on_reset=state.clear)
    f2.poll()
    for _ in range(5):
        f.poll()
        f2.poll()
    assert f2.resets == 1
    assert state == w.state
    if local:
        assert _snapshot_local(local) == before
    else:
        for fl in (f, f2):
            stats = fl.dest.stats()
            assert stats["PUT"] == 0 and stats["DELETE"] == 0, stats
    assert where.names() == names
    # Following a destination that does not exist creates nothing.
    if local:
        missing = tmp_path / "missing" / "log"
        g = persistlog.follow(str(missing), lambda r: None)
        assert g.poll() == 0
        assert not missing.exists() and not missing.parent.exists()


# -- races with the writer, undecodable records ---------------------------------------------


class _OnFirstRead(FaultPlan):
    """Runs ``hook`` just before the first read of a file (the reader's look at CURRENT,
    which comes right after its listing): the writer moving on between the two."""

    def __init__(self, hook: Callable[[], None]) -> None:
        super().__init__()
        self.hook: Callable[[], None] | None = hook

    def run(self, op: str, call: Callable[[], Any]) -> Any:
        if op == "cat_file" and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return super().run(op, call)


def _rotation_between_listing_and_current(clean: None) -> tuple[str, Callable[[], None], dict[str, Any]]:
    """A destination where log 2 has only its header segment; the returned hook adds the
    segment with log 2's complete marker and moves CURRENT to 2, as a writer finishing a
    rotation would."""
    ref_url = "memory://race-ref/log"
    w = Writer(ref_url, flush_interval=30)
    for i in range(8):
        w.put(f"k{i}", i)
    w.log.rotate()
    state = dict(w.state)
    ref = open_destination(ref_url)
    names = [n for n in ref.list() if n.endswith(".plog")]
    blobs = {n: ref.read(n) for n in names}
    current2 = ref.read("CURRENT")
    w.close()
    dest = open_destination("memory://race/log")
    dest.ensure()
    log1 = [n for n in names if n.startswith(f"{1:020d}")]
    log2 = [n for n in names if n.startswith(f"{2:020d}")]
    assert len(log2) >= 2, names
    for n in log1 + log2[:1]:
        dest.create(n, blobs[n])
    # CURRENT naming log 1 (FORMAT.md: magic, version, reserved, seq, CRC-32).
    import struct
    import zlib

    head = struct.pack("<8sHHQ", b"PLOGCURR", 1, 0, 1)
    dest.replace("CURRENT", head + struct.pack("<I", zlib.crc32(head)))

    def writer_moves_on() -> None:
        for n in log2[1:]:
            dest.create(n, blobs[n])
        dest.replace("CURRENT", current2)

    return "faulty://race/log", writer_moves_on, state


def test_follower_initial_sync_racing_a_rotation(clean_memory_fs: None) -> None:
    """CURRENT may name a log whose complete marker was written after the follower listed
    the destination: the follower must not call that corruption."""
    url, hook, state = _rotation_between_listing_and_current(None)
    got: dict[str, Any] = {}
    f = persistlog.follow(url, lambda r: apply(got, r),
                          storage_options={"target_protocol": "memory", "faults": _OnFirstRead(hook)})
    f.poll()
    assert got == state


def test_restore_racing_a_rotation(clean_memory_fs: None) -> None:
    url, hook, state = _rotation_between_listing_and_current(None)
    got: dict[str, Any] = {}
    persistlog.restore(url, lambda r: apply(got, r),
                       storage_options={"target_protocol": "memory", "faults": _OnFirstRead(hook)})
    assert got == state


def _frame(payload: bytes, count: int, first_lsn: int) -> bytes:
    """An update batch framed by hand after FORMAT.md (checksums right, payload as given)."""
    import struct
    import zlib

    head = struct.pack("<IIIH2sQqI", len(payload), len(payload), count, 0, b"PB", first_lsn,
                       time.time_ns() // 1000, zlib.crc32(payload))
    return head + struct.pack("<I", zlib.crc32(head)) + payload


def test_undecodable_records_are_corruption_for_followers(tmp_path: Path) -> None:
    """A batch whose checksums hold but whose payload is not CBOR is corruption (a
    CorruptLogError naming where), not a stray decoder exception; skip mode passes it."""
    url = str(tmp_path / "log")
    w = Writer(url)
    w.put("a", 1, sync=True)
    name = f"{w.log.seq:020d}-{0:010d}.plog"
    f = persistlog.follow(url, lambda r: None)
    f.poll()
    at = os.path.getsize(Path(url) / name)
    with open(Path(url) / name, "ab") as fh:
        fh.write(_frame(b"\xff\xff", 1, w.log.next_lsn))
        fh.write(_frame(b"\x01", 1, w.log.next_lsn + 1))
    with pytest.raises(persistlog.CorruptLogError) as e:
        f.poll()
    assert e.value.segment == name and e.value.offset == at
    with pytest.raises(persistlog.CorruptLogError):
        persistlog.follow(url, lambda r: None).poll()
    got: list[Any] = []
    skipping = persistlog.follow(url, got.append, recovery="skip")
    skipping.poll()
    assert got[-1] == 1  # the batch after the damaged one
    w.log._failed = RuntimeError("the test wrote into the live segment")  # do not seal over it
    w.close()


# -- background mode -------------------------------------------------------------------


def test_background_follower_keeps_up_and_reports_its_error(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    w = Writer(url, segment_bytes=4096, retain=10)  # no retention overrun: no reset hook here
    batches: list[list[Any]] = []
    state: dict[str, Any] = {}

    def replay_batch(records: list[Any]) -> None:
        batches.append(records)
        for r in records:
            apply(state, r)

    with pytest.raises(persistlog.CorruptLogError):  # leaving the block raises it too
        with persistlog.follow(url, replay_batch=replay_batch, poll_interval=0.01) as f:
            assert f.wait_caught_up(10)
            rng = random.Random(3)
            for r in range(3):
                w.random_ops(rng, 150)
                w.log.rotate()
            w.log.sync()
            wait_until(lambda: state == w.state, 20, lambda: f"follower at {f.cursor}, writer at {w.last_lsn}")
            assert f.wait_caught_up(10)
            assert f.lag().records == 0
            assert f.applied_records == sum(map(len, batches)) and f.error is None
            # Damage behind the writer's back stops the thread; the error is kept.
            w.close()
            nxt = Path(url) / f"{w.log.seq + 1:020d}-{0:010d}.plog"
            nxt.write_bytes(b"\x13" * 200)  # a "next log" whose segment header is garbage
            wait_until(lambda: f.error is not None, 10, "the follower to stop on the damage")
            assert isinstance(f.error, persistlog.CorruptLogError)
            with pytest.raises(persistlog.CorruptLogError):
                f.wait_caught_up(1)
            with pytest.raises(persistlog.CorruptLogError):
                f.stop()
            with pytest.raises(persistlog.CorruptLogError):
                f.lag()
    with pytest.raises(TypeError):
        persistlog.follow(url, apply, replay_batch=replay_batch)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        persistlog.follow(url, poll_interval=0)


def test_background_follower_whose_replay_raised_says_so(tmp_path: Path) -> None:
    """Like ``Future.result()``: once the replay callback raised on the background thread,
    ``wait_caught_up()``, ``lag()`` and ``stop()`` raise the app's own exception instead of
    reporting a follower that is caught up with no lag."""
    url = str(tmp_path / "log")
    w = Writer(url, retain=10)
    w.random_ops(random.Random(5), 20)
    w.log.sync()

    class ReplayBug(Exception):
        pass

    def replay(record: Any) -> None:
        if record.get("key") == "poison":
            raise ReplayBug("cannot apply the poison record")

    f = persistlog.follow(url, replay, poll_interval=0.01).start()
    assert f.wait_caught_up(10)
    w.log.update({"op": "put", "key": "poison", "value": 1}, sync=True)
    wait_until(lambda: f.error is not None, 10, "the follower to stop on the replay error")
    with pytest.raises(ReplayBug):
        f.wait_caught_up(0.1)
    with pytest.raises(ReplayBug):
        f.lag()
    with pytest.raises(ReplayBug):
        f.stop()
    # Leaving a with block raises it as well, unless the block itself is raising.
    with pytest.raises(ReplayBug):
        with f:
            pass
    with pytest.raises(KeyError):
        with f:
            raise KeyError("the block's own error wins")
    w.close()


def test_followed_batches_carry_each_records_kind(tmp_path: Path) -> None:
    """Snapshot records (from an enumeration) and updates, even mixed in one batch, come
    with their kind."""
    url = str(tmp_path / "log")
    holder: dict[str, persistlog.Log] = {}

    def enumerate_all(emit: Any) -> None:
        emit({"op": "put", "key": "s1", "value": 1})
        if "lg" in holder:  # an update between two snapshot records: a mixed batch
            holder["lg"].update({"op": "put", "key": "u-during", "value": 2})
        emit({"op": "put", "key": "s2", "value": 3})

    lg = persistlog.open(url, enumerate_all, rotate_bytes=None, flush_interval=3600.0)
    holder["lg"] = lg
    lg.update({"op": "put", "key": "u1", "value": 4})
    lg.rotate()
    last = lg.update({"op": "put", "key": "u2", "value": 5})
    lg.close()
    f = persistlog.follow(url, lambda r: None)
    batches = drain(f, last)
    f.stop()
    assert all(len(fb.kinds) == len(fb.records) for fb in batches)
    pairs = [(r["key"], kind) for fb in batches for r, kind in zip(fb.records, fb.kinds)]
    assert pairs[-4:] == [("s1", "snapshot"), ("u-during", "update"), ("s2", "snapshot"), ("u2", "update")]
    assert any(set(fb.kinds) == {"snapshot", "update"} for fb in batches), "no mixed batch was made"

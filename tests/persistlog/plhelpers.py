"""Shared helpers of the core log tests: a small app, crash simulation, file surgery.

No mocks: the app is a real dict behind a real lock; a "crash" abandons a real Log the way a
killed process would (its threads stop, its file handles and flock go away, nothing is
sealed and bytes still in user space are lost); torn writes are made by truncating real
segment files.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from hypothesis import HealthCheck, settings

import persistlog
from batches import batch_offsets
from threads import wait_until  # noqa: F401 - the tests import it from here
from persistlog import _decoder
from persistlog import _exit as persistlog_exit
from persistlog import _format as F

# -- hypothesis profiles ------------------------------------------------------------------
# PERSISTLOG_HYPOTHESIS_PROFILE picks one (default "ci": the property tests take a few tens
# of seconds; "thorough" is a soak). Applied per test, never loaded globally, so other
# packages' hypothesis tests keep their own settings.

_COMMON: dict[str, Any] = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("ci", max_examples=25, stateful_step_count=30, **_COMMON)
settings.register_profile("thorough", max_examples=400, stateful_step_count=60, **_COMMON)


def plsettings(**ci: Any) -> settings:
    """The active persistlog hypothesis profile; ``ci`` overrides apply to the "ci" one
    (a test's own budget for CI), never to a soak profile."""
    name = os.environ.get("PERSISTLOG_HYPOTHESIS_PROFILE", "ci")
    profile = settings.get_profile(name)
    return settings(profile, **ci) if name == "ci" else profile

# -- the app ------------------------------------------------------------------------------


class App:
    """A dict of resources kept in memory, logged through a persistlog Log.

    Records follow the ResourceStore convention: ``{"op": "put"|"del", "key", "value"}``.
    Each change is logged and applied under the resource's lock (one lock per key stripe),
    and the enumeration takes the same lock per key, as the seed's concurrency contract asks.
    """

    STRIPES = 16

    def __init__(self, state: dict[Any, Any] | None = None, *, slow: float = 0.0) -> None:
        self.data: dict[Any, Any] = dict(state or {})
        self.locks = [threading.Lock() for _ in range(self.STRIPES)]
        self.log: persistlog.Log | None = None
        self.slow = slow  # seconds to sleep per emitted record (a slow enumeration)
        self.fail_enumerate: BaseException | None = None
        self.enumerations = 0

    def _lock(self, key: Any) -> threading.Lock:
        return self.locks[hash(key) % self.STRIPES]

    def enumerate_all(self, emit: Callable[[Any], None]) -> None:
        self.enumerations += 1
        import time

        # List the resources while no change is in flight: a resource being created right
        # now was logged into the old log, so it must be in this list (the seed's contract).
        for lock in self.locks:
            lock.acquire()
        try:
            keys = list(self.data)
        finally:
            for lock in self.locks:
                lock.release()
        for key in keys:
            with self._lock(key):
                if key in self.data:
                    emit({"op": "put", "key": key, "value": self.data[key]})
            if self.fail_enumerate is not None:
                raise self.fail_enumerate  # after emitting one record
            if self.slow:
                time.sleep(self.slow)
        if self.fail_enumerate is not None:
            raise self.fail_enumerate

    def open(self, url: str, **options: Any) -> persistlog.Log:
        """Restore, then open: a destination holding records replaces the app's state
        (an empty one keeps the state the App was built with, which the enumeration writes)."""
        restored: dict[Any, Any] = {}
        result = persistlog.restore(
            url, lambda r: apply(restored, r),
            **{k: options[k] for k in ("storage_options", "codec") if k in options},
        )
        if result.found:
            self.data = restored
        self.log = persistlog.open(url, self.enumerate_all, **options)
        return self.log

    def put(self, key: Any, value: Any, sync: bool = False) -> int:
        assert self.log is not None
        with self._lock(key):
            lsn = self.log.update({"op": "put", "key": key, "value": value}, sync=sync)
            self.data[key] = value
        return lsn

    def put_many(self, changes: list[tuple[Any, Any]], sync: bool = False) -> int:
        """Log several puts with one ``update_many``, holding every key's lock."""
        assert self.log is not None
        # In stripe order, as the enumeration takes them: no deadlock.
        locks = [self.locks[i] for i in sorted({hash(k) % self.STRIPES for k, _ in changes})]
        for lock in locks:
            lock.acquire()
        try:
            lsn = self.log.update_many(
                [{"op": "put", "key": k, "value": v} for k, v in changes], sync=sync
            )
            for k, v in changes:
                self.data[k] = v
        finally:
            for lock in reversed(locks):
                lock.release()
        return lsn

    def delete(self, key: Any, sync: bool = False) -> int:
        assert self.log is not None
        with self._lock(key):
            lsn = self.log.update({"op": "del", "key": key}, sync=sync)
            self.data.pop(key, None)
        return lsn


def apply(state: dict[Any, Any], record: Any) -> None:
    """Replay one ResourceStore-convention record into ``state``."""
    op = record["op"]
    if op == "put":
        state[record["key"]] = record["value"]
    elif op == "del":
        state.pop(record["key"], None)
    else:  # pragma: no cover - a test bug
        raise AssertionError(f"unexpected record {record!r}")


def restore_state(url: str, **options: Any) -> tuple[dict[Any, Any], persistlog.RestoreResult]:
    """Restore ``url`` into a fresh dict."""
    state: dict[Any, Any] = {}
    result = persistlog.restore(url, lambda r: apply(state, r), **options)
    return state, result


def replay_ops(base: dict[Any, Any], ops: Iterable[tuple[Any, ...]]) -> dict[Any, Any]:
    """``base`` after the model operations ``("put", k, v)`` / ``("del", k)``."""
    state = dict(base)
    for op in ops:
        if op[0] == "put":
            state[op[1]] = op[2]
        else:
            state.pop(op[1], None)
    return state


def prefix_states(base: dict[Any, Any], ops: list[tuple[Any, ...]]) -> list[dict[Any, Any]]:
    """The model's state after each prefix of ``ops``: element k is after ``ops[:k]``."""
    states = [dict(base)]
    state = dict(base)
    for op in ops:
        if op[0] == "put":
            state[op[1]] = op[2]
        else:
            state.pop(op[1], None)
        states.append(dict(state))
    return states


# -- crashes ------------------------------------------------------------------------------


def crash(lg: persistlog.Log) -> None:
    """Abandon ``lg`` as if its process had been killed.

    Stops its background threads (waiting for a rotation that is already running: tests
    call this between operations), drops the bytes still in user space (the Log's pending
    batch and the append file's buffer), closes the file descriptors and releases the flock
    without sealing anything. What the OS already has stays: this is a process crash. To
    also lose unsynced OS data (a power loss), truncate the newest segment afterwards with
    :func:`tear_newest_segment`.
    """
    lg._stop.set()
    lg._rotator.close()
    if lg._ticker is not None:
        lg._ticker.join()
    lg._restore_signal()
    with lg._io_lock:
        # Records still pending in the Log's memory are simply never written.
        sw = lg._current_writer
        f = getattr(sw, "_file", None)
        if f is not None:
            with f._lock:
                f._buffer.clear()
            f.close()
        lg._closed = True
        if hasattr(lg, "_blocked"):
            lg._blocked = True
    lg._release()
    lg.dest.close()
    # A killed process seals nothing at its exit.
    lg._close_done = True
    persistlog_exit.forget(lg)


# -- files --------------------------------------------------------------------------------


def segment_files(path: str | os.PathLike[str]) -> list[str]:
    """Full paths of the segment files in ``path``, in (seq, segment) order."""
    names = sorted(n for n in os.listdir(path) if F.parse_segment_name(n) is not None)
    return [os.path.join(path, n) for n in names]


def log_seqs(path: str | os.PathLike[str]) -> list[int]:
    """The seqs of the logs present in ``path``."""
    seqs = {F.parse_segment_name(n)[0] for n in os.listdir(path) if F.parse_segment_name(n)}  # type: ignore[index]
    return sorted(seqs)


def creation_size(segment_path: str) -> int:
    """Bytes a segment held when it was created (durably): its header, plus the log header
    batch for segment 0."""
    with open(segment_path, "rb") as f:
        data = f.read(F.SEGMENT_HEADER_SIZE + F.BATCH_HEADER_SIZE)
    sh = _decoder.parse_segment_header(data)
    if sh.segment != 0:
        return F.SEGMENT_HEADER_SIZE
    head = _decoder.parse_batch_header(data[F.SEGMENT_HEADER_SIZE:], F.SEGMENT_HEADER_SIZE)
    return F.SEGMENT_HEADER_SIZE + head.size


def durable_floor(segment_path: str) -> int:
    """Bytes of a segment known durable from its own contents: its creation size, or the
    end of its last control batch (the writer syncs right after a snapshot-complete marker,
    which a background rotation may have written after the test's last durable ack)."""
    floor = creation_size(segment_path)
    for offset, size, kind in batch_offsets(segment_path):
        if kind == F.KIND_CONTROL:
            floor = max(floor, offset + size)
    return floor


def segment_sizes(path: str | os.PathLike[str]) -> dict[str, int]:
    """``{segment file name: size}`` right now (files deleted meanwhile are left out)."""
    sizes = {}
    for p in segment_files(path):
        try:
            sizes[os.path.basename(p)] = os.path.getsize(p)
        except FileNotFoundError:
            pass  # retention of a live writer
    return sizes




def fill_disk(lg: persistlog.Log) -> None:
    """Make the primary's current segment file reject writes as a full disk does: its
    descriptor now points at ``/dev/full`` (every write fails with ENOSPC, for real)."""
    f = lg._current_writer._file  # type: ignore[union-attr]
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        os.dup2(full, f._fd)
    finally:
        os.close(full)


def _scanners(url: str, only: int | None = None) -> Iterator[Any]:
    """A LogScanner per log at ``url`` (or for log ``only``), in order; iterate each."""
    from destinations import open_destination
    from persistlog._reader import LogScanner, list_logs

    dest = open_destination(url)
    for seq, segments in sorted(list_logs(dest).items()):
        if only is None or seq == only:
            yield LogScanner(dest, seq, segments)


def app_batches(url: str) -> list[tuple[int, int]]:
    """``(first LSN, record count)`` of every batch of records at ``url``, in order."""
    return [(b.first_lsn, b.header.count) for sc in _scanners(url) for b in sc if not b.is_control]


def _scanned_state(url: str, seq: int) -> Any:
    (scanner,) = _scanners(url, seq)
    for _batch in scanner:
        pass
    return scanner.state


def is_complete_log(url: str, seq: int) -> bool:
    """Whether log ``seq`` at ``url`` holds its snapshot-complete marker."""
    return bool(_scanned_state(url, seq).complete)


def is_sealed_log(url: str, seq: int) -> bool:
    return bool(_scanned_state(url, seq).sealed)


def truncate(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def flip_bit(path: str, offset: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ (1 << bit)]))

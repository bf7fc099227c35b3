"""Rotation: starting a fresh log that begins with a full enumeration of the app's state.

The protocol (DESIGN.md, "Rotation"), run on the rotation thread:

1. create log N+1 durably and switch every later record to it; seal log N;
2. call ``enumerate_all(emit)``: ``emit`` writes *snapshot* records into N+1 while the app's
   updates keep flowing into the same log;
3. append the snapshot-complete marker and make it durable;
4. move CURRENT to N+1, then apply retention.

If ``enumerate_all`` raises, N+1 stays incomplete and writing continues in it; the error is
logged, counted, handed to ``on_error`` and raised from ``rotate(wait=True)``. The next
trigger retries with N+2.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from . import _format as F
from ._errors import EnumerateError, LogClosedError, LogFailedError, PersistLogError
from ._retention import apply_retention
from ._segment_writer import move_pointer
from ._writer import NEVER, LogCore

log = logging.getLogger("persistlog")

EnumerateAll = Callable[[Callable[[Any], None]], Any]


class Rotator:
    """Owns the rotation thread, the triggers and the record of past rotations."""

    def __init__(
        self,
        core: LogCore,
        enumerate_all: EnumerateAll,
        *,
        rotate_bytes: int | None,
        rotate_records: int | None,
        rotate_interval: float | None,
        retain: int,
        on_error: Callable[[BaseException], None] | None,
        known_complete: list[int],
        on_complete: Callable[[int], None] | None = None,
    ) -> None:
        self.core = core
        self.enumerate_all = enumerate_all
        self.rotate_bytes = rotate_bytes
        self.rotate_records = rotate_records
        self.rotate_interval = rotate_interval
        self.retain = retain
        self.on_error = on_error
        self.on_complete = on_complete
        self.known_complete = list(known_complete)
        self.rotations = 0
        self.failures = 0
        self.last_rotation: dict[str, Any] | None = None
        self.last_error: BaseException | None = None
        self.rotating = False  # a rotation owns the head of the queue (its retention too)
        self.retaining = False  # ... and is deleting old logs
        self._snapshot_bytes = 0
        self._pointer_moved = True  # whether the last rotation's CURRENT move succeeded
        self._started_at = time.monotonic()
        self._cv = threading.Condition()
        self._queue: list[Future[int]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="persistlog-rotation", daemon=True)
        self._thread.start()

    # -- requests -----------------------------------------------------------------------

    def request(self, coalesce: bool = True) -> Future[int]:
        """Ask for a rotation; a trigger joins a request not yet started."""
        with self._cv:
            if self._stop:
                fut: Future[int] = Future()
                fut.set_exception(PersistLogError("the log is closing; no rotation was started"))
                return fut
            # Join a request not yet started; never one already running (its enumeration
            # may have passed the change that fired this trigger) or finished.
            if coalesce and self._queue and not (self._queue[-1].running() or self._queue[-1].done()):
                return self._queue[-1]
            fut = Future()
            self._queue.append(fut)
            self._cv.notify()
            return fut

    def check_triggers(self) -> None:
        """Called after each batch: cheap checks of the size and count triggers.

        Between checks the writer cuts its batches where a trigger would fire (the
        record-count trigger's LSN, the bytes left before the size trigger), and a fired
        trigger holds the writers that hand batches over until the new log is started: a
        log overshoots a trigger by at most about one batch (``batch_bytes``). A trigger
        crossed while the log's own enumeration still runs fires when it ends.
        """
        core = self.core
        sw = core._current_writer
        if sw is None:
            return
        records_due = self.rotate_records is not None and core._log_update_records >= self.rotate_records
        if any(not fut.done() for fut in self._queue):
            # Whole batches while a rotation is due or enumerating; this runs again after
            # it. (One only deleting old logs has a complete log already: queue the next.)
            core._batch_bytes = core.settings.batch_bytes
            self._arm_records(records_due)
            return
        log_bytes = sw.bytes_written - self._snapshot_bytes
        if records_due or (self.rotate_bytes is not None and log_bytes >= self.rotate_bytes):
            self._arm_records(True)
            core._batch_bytes = core.settings.batch_bytes
            # Set before the request: the rotation thread may switch before it returns.
            core._switching = threading.Event()
            if self.request().done():  # refused: the log is closing
                self._switched()
            return
        self._arm_records(False)
        if self.rotate_bytes is not None:
            core._batch_bytes = max(1, min(core.settings.batch_bytes, self.rotate_bytes - log_bytes))

    def _arm_records(self, off: bool) -> None:
        """Have update() hand its batch over at the record-count trigger (buffered mode)."""
        core = self.core
        if core._eager:
            return
        if off or self.rotate_records is None:
            core._cut_lsn = NEVER
        else:
            core._cut_lsn = core._written_lsn + self.rotate_records - core._log_update_records - 1

    def _switched(self) -> None:
        """Release the writers a fired trigger holds (the new log is started, or will not be)."""
        switching, self.core._switching = self.core._switching, None
        if switching is not None:
            switching.set()

    def check_interval(self) -> None:
        if self.rotate_interval is None or self.rotating or self._queue:
            return
        if time.monotonic() - self._started_at >= self.rotate_interval:
            self.request()

    # -- the thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if not self._queue:
                    return
                fut = self._queue[0]
                self.rotating = True
            done = False
            try:
                if fut.set_running_or_notify_cancel():
                    try:
                        seq = self._rotate()
                    except BaseException as e:
                        fut.set_exception(e)
                    else:
                        fut.set_result(seq)
                        self.retaining = True
                        try:
                            self._retain()
                        finally:
                            self.retaining = False
                        done = True
            finally:
                with self._cv:
                    self._queue.pop(0)
                    self.rotating = False
                    self._cv.notify_all()
            if done:
                # Batches written while this rotation ran skipped the size and count checks;
                # check once now, or a trigger crossed meanwhile waits for the next batch.
                self.check_triggers()

    def _rotate(self) -> int:
        core = self.core
        started = time.monotonic()
        self._started_at = started
        seq = core.seq + 1
        try:
            core._start_log(seq)
            self._arm_records(False)
        finally:
            self._switched()
        self._snapshot_bytes = 0
        emitted = 0
        active = True

        def emit(record: Any) -> None:
            nonlocal emitted
            if not active:
                raise RuntimeError("emit() called after enumerate_all returned")
            core._emit(record)
            emitted += 1
            if not emitted & 0xFF:
                # Give the GIL away now and then: an enumeration of millions of resources
                # would otherwise hold it for whole switch intervals (5 ms) at a time and
                # show up in the app's update() latency.
                time.sleep(0)

        try:
            self.enumerate_all(emit)
        except BaseException as e:
            active = False
            self.failures += 1
            self.last_error = e
            if isinstance(e, LogFailedError) or core.failed is not None:
                raise
            log.error("enumerate_all failed; log %d stays incomplete and the next trigger retries: %r", seq, e)
            if self.on_error is not None:
                try:
                    self.on_error(e)
                except Exception:
                    log.exception("on_error callback raised")
            raise EnumerateError(f"enumerate_all raised during rotation to log {seq}: {e!r}") from e
        active = False
        with core._io_lock:
            core._check()
            core._append_control({"t": F.CONTROL_COMPLETE, "records": emitted})
            core._sync_primary()
            sw = core._current_writer
            self._snapshot_bytes = sw.bytes_written if sw is not None else 0
        self._pointer_moved = move_pointer(core.dest, seq)
        self.known_complete.append(seq)
        self.rotations += 1
        self.last_rotation = {
            "seq": seq,
            "snapshot_records": emitted,
            "seconds": round(time.monotonic() - started, 6),
            "finished": time.time(),
        }
        log.info("log %d complete at %s: %d snapshot records in %.3fs", seq, core.dest.url, emitted,
                 self.last_rotation["seconds"])
        if self.on_complete is not None:
            self.on_complete(seq)
        return seq

    def _retain(self) -> None:
        if not self._pointer_moved:
            # Old logs go only once a newer complete log *and its pointer* are durable
            # (DESIGN invariant 4): wait for a rotation whose CURRENT move succeeds.
            log.warning("retention at %s postponed: CURRENT was not moved", self.core.dest.url)
            return
        try:
            apply_retention(self.core.dest, self.known_complete, self.retain, self.core.seq)
        except BaseException as e:  # the rotation thread must outlive anything retention meets
            log.warning("retention at %s failed (will retry after the next rotation): %s", self.core.dest.url, e)

    def close(self) -> None:
        """Wait for a running rotation, drop queued ones, stop the thread."""
        with self._cv:
            self._stop = True
            # The rotation thread owns the head of the queue while `rotating` (it is waited
            # for); the ones never started fail as the Log does from now on, not with a bare
            # CancelledError in a rotate(wait=True) caller.
            start = 1 if self.rotating else 0
            for fut in self._queue[start:]:
                fut.set_exception(LogClosedError("the log was closed before this rotation started"))
            del self._queue[start:]
            self._cv.notify_all()
        self._switched()
        if threading.current_thread() is not self._thread:
            self._thread.join()

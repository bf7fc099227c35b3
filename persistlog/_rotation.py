"""Rotation: starting a fresh log that begins with a full enumeration of the app's state.

The protocol (docs/DESIGN.md, "Rotation"), run on the rotation thread:

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
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from . import _format as F
from ._errors import EnumerateError, LogClosedError, LogFailedError, PersistLogError
from ._retention import apply_retention
from ._segment_writer import move_pointer

if TYPE_CHECKING:
    from ._log import Log

log = logging.getLogger("persistlog")

EnumerateAll = Callable[[Callable[[Any], None]], Any]

# A cut LSN no record reaches: the record-count cut is off.
NEVER = 1 << 62


class Rotator:
    """Owns the rotation thread, the triggers and the record of past rotations."""

    def __init__(
        self,
        lg: Log,
        enumerate_all: EnumerateAll,
        *,
        rotate_bytes: int | None,
        rotate_records: int | None,
        rotate_interval: float | None,
        retain: int,
        on_error: Callable[[BaseException], None] | None,
        known_complete: list[int],
        on_complete: Callable[[int, int], None] | None = None,
    ) -> None:
        self.lg = lg
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
        # App threads take the plain lock: Condition's own __enter__ is Python code, and a
        # KeyboardInterrupt raised in it just after it took the lock would keep it forever.
        self._mutex = threading.RLock()
        self._cv = threading.Condition(self._mutex)
        self._queue: list[Future[int]] = []
        # Per request, a lock released once it is done: rotate() waits on that, not on
        # the Future (whose methods take a Condition).
        self._done: dict[Future[int], threading.Lock] = {}
        self._stop = False
        # The thread holds the Rotator (and so the Log) only while a rotation runs: between
        # rotations an unreferenced Log can be collected, and its finalizer wakes the thread
        # to end it.
        self._thread = threading.Thread(
            target=_serve, args=(weakref.ref(self), self._cv), name="persistlog-rotation", daemon=True
        )
        wake = weakref.finalize(self, _wake, self._cv)
        wake.atexit = False
        self._thread.start()

    # -- requests -----------------------------------------------------------------------

    def request(self, coalesce: bool = True) -> Future[int]:
        """Ask for a rotation; a trigger joins a request not yet started."""
        with self._mutex:
            if self._stop:
                fut: Future[int] = Future()
                fut.set_exception(PersistLogError("the log is closing; no rotation was started"))
                return fut
            # Join a request not yet started; never one already running (its enumeration
            # may have passed the change that fired this trigger) or finished.
            # (Only the head can be running or done: it is while `rotating`.)
            if coalesce and self._queue and not (len(self._queue) == 1 and self.rotating):
                return self._queue[-1]
            fut = Future()
            done = threading.Lock()
            done.acquire()
            self._done[fut] = done
            self._queue.append(fut)
            self._cv.notify()
            return fut

    def wait(self, fut: Future[int], timeout: float | None = None) -> int:
        """``fut.result(timeout)``, waiting on a plain lock: an interruption there leaves
        nothing held."""
        done = self._done.get(fut)
        if done is not None:
            if not done.acquire(timeout=-1 if timeout is None else timeout):
                raise TimeoutError(f"the rotation did not finish within {timeout}s")
            done.release()
        return fut.result(0)

    def start_after_snapshot(self) -> int:
        """Start the next log without an enumeration, for open() when the newest log is a
        complete log holding a fresh snapshot and nothing after it: restore starts there
        and reads this one after it, and the next trigger's rotation makes a new
        complete log as usual."""
        lg = self.lg
        seq = lg.seq + 1
        lg._start_log(seq)
        self._arm_records(False)
        log.info("log %d started at %s after the snapshot of log %d, without an opening enumeration",
                 seq, lg.dest.url, seq - 1)
        return seq

    def _finished(self, fut: Future[int]) -> None:
        done = self._done.pop(fut, None)
        if done is not None:
            done.release()

    def check_triggers(self) -> None:
        """Called after each batch: cheap checks of the size and count triggers.

        Between checks the writer cuts its batches where a trigger would fire (the
        record-count trigger's LSN, the bytes left before the size trigger), and a fired
        trigger holds the writers that hand batches over until the new log is started: a
        log overshoots a trigger by at most about one batch (``batch_bytes``). A trigger
        crossed while the log's own enumeration still runs fires when it ends.
        """
        lg = self.lg
        sw = lg._current_writer
        if sw is None:
            return
        records_due = self.rotate_records is not None and lg._log_update_records >= self.rotate_records
        # Not the Futures' own done(): it enters a Condition (see the note on _mutex). The
        # head of the queue is done once it is retaining; the others have not started.
        if len(self._queue) > 1 or (self._queue and not self.retaining):
            # Whole batches while a rotation is due or enumerating; this runs again after
            # it. (One only deleting old logs has a complete log already: queue the next.)
            lg._batch_bytes = lg.settings.batch_bytes
            self._arm_records(records_due)
            return
        log_bytes = sw.bytes_written - self._snapshot_bytes
        if records_due or (self.rotate_bytes is not None and log_bytes >= self.rotate_bytes):
            self._arm_records(True)
            lg._batch_bytes = lg.settings.batch_bytes
            # Set before the request: the rotation thread may switch before it returns.
            switching = threading.Lock()
            switching.acquire()
            lg._switching = switching
            self.request()
            if self._stop:  # refused: the log is closing
                self._switched()
            return
        self._arm_records(False)
        if self.rotate_bytes is not None:
            lg._batch_bytes = max(1, min(lg.settings.batch_bytes, self.rotate_bytes - log_bytes))

    def _arm_records(self, off: bool) -> None:
        """Have update() hand its batch over at the record-count trigger (buffered mode)."""
        lg = self.lg
        if lg._eager:
            return
        if off or self.rotate_records is None:
            lg._cut_lsn = NEVER
        else:
            lg._cut_lsn = lg._written_lsn + self.rotate_records - lg._log_update_records - 1

    def _switched(self) -> None:
        """Release the writers a fired trigger holds (the new log is started, or will not be)."""
        switching, self.lg._switching = self.lg._switching, None
        if switching is not None:
            try:
                switching.release()
            except RuntimeError:
                pass  # two threads swapped it out at once: the other released it

    def check_interval(self) -> None:
        if self.rotate_interval is None or self.rotating or self._queue:
            return
        if time.monotonic() - self._started_at >= self.rotate_interval:
            self.request()

    def refuse_from_rotation_thread(self, call: str) -> None:
        """Raise ``RuntimeError`` if called from inside ``enumerate_all`` (or ``on_error``).

        ``call`` waits for the rotation that is running on this very thread: it would
        wait forever.
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                f"{call} cannot be called from inside enumerate_all (the rotation thread): "
                "it waits for the rotation that is running there"
            )

    # -- the thread ---------------------------------------------------------------------

    def _serve_head(self) -> bool:
        """Run the rotation at the head of the queue; False once closed and drained."""
        with self._cv:
            if not self._queue:
                return False
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
            self._finished(fut)
        if done:
            # Batches written while this rotation ran skipped the size and count checks;
            # check once now, or a trigger crossed meanwhile waits for the next batch.
            self.check_triggers()
        return True

    def _rotate(self) -> int:
        lg = self.lg
        started = time.monotonic()
        self._started_at = started
        seq = lg.seq + 1
        try:
            lg._start_log(seq)
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
            lg._emit(record)
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
            if isinstance(e, LogFailedError) or lg.failed is not None:
                raise
            log.error("enumerate_all failed; log %d stays incomplete and the next trigger retries: %r", seq, e)
            if self.on_error is not None:
                try:
                    self.on_error(e)
                except Exception:
                    log.exception("on_error callback raised")
            raise EnumerateError(f"enumerate_all raised during rotation to log {seq}: {e!r}") from e
        active = False
        with lg._io_lock:
            lg._check()
            lg._append_control({"t": F.CONTROL_COMPLETE, "records": emitted})
            complete_lsn = lg._complete_lsn = lg._written_lsn  # control batches take no LSN
            lg._sync_primary()
            sw = lg._current_writer
            self._snapshot_bytes = sw.bytes_written if sw is not None else 0
        self._pointer_moved = move_pointer(lg.dest, seq)
        self.known_complete.append(seq)
        self.rotations += 1
        self.last_rotation = {
            "seq": seq,
            "snapshot_records": emitted,
            "seconds": round(time.monotonic() - started, 6),
            "finished": time.time(),
        }
        log.info("log %d complete at %s: %d snapshot records in %.3fs", seq, lg.dest.url, emitted,
                 self.last_rotation["seconds"])
        if self.on_complete is not None:
            self.on_complete(seq, complete_lsn)
        return seq

    def _retain(self) -> None:
        if not self._pointer_moved:
            # Old logs go only once a newer complete log *and its pointer* are durable
            # (docs/DESIGN.md invariant 4): wait for a rotation whose CURRENT move succeeds.
            log.warning("retention at %s postponed: CURRENT was not moved", self.lg.dest.url)
            return
        try:
            apply_retention(self.lg.dest, self.known_complete, self.retain, self.lg.seq)
        except BaseException as e:  # the rotation thread must outlive anything retention meets
            log.warning("retention at %s failed (will retry after the next rotation): %s", self.lg.dest.url, e)

    def close(self, timeout: float | None = None) -> None:
        """Wait for a running rotation (``timeout`` seconds at most), drop queued ones,
        stop the thread."""
        with self._mutex:
            self._stop = True
            # The rotation thread owns the head of the queue while `rotating` (it is waited
            # for); the ones never started fail as the Log does from now on, not with a bare
            # CancelledError in a rotate(wait=True) caller.
            start = 1 if self.rotating else 0
            for fut in self._queue[start:]:
                if not fut.done():
                    fut.set_exception(LogClosedError("the log was closed before this rotation started"))
                self._finished(fut)
            del self._queue[start:]
            self._cv.notify_all()
        self._switched()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("closing %s without waiting any longer for the rotation in progress",
                            self.lg.dest.url)


def _serve(ref: weakref.ReferenceType[Rotator], cv: threading.Condition) -> None:
    """The rotation thread: serves requests for as long as the Rotator lives."""
    while True:
        with cv:
            while True:
                rotator = ref()
                if rotator is None:
                    return
                if rotator._queue or rotator._stop:
                    break
                del rotator  # not held while idle
                cv.wait(0.5)  # a notify an interruption cut short costs this much at most
        if not rotator._serve_head():
            return
        del rotator


def _wake(cv: threading.Condition) -> None:
    with cv:
        cv.notify_all()

"""Rotation: starting a fresh log that begins with a full enumeration of the app's state.

The protocol (docs/DESIGN.md, "Rotation"), run by the rotation job on a worker of the
process's runtime (``_runtime.py``), one rotation of a Log at a time:

1. create log N+1 durably and switch every later record to it; seal log N;
2. call ``enumerate_all(emit)``: ``emit`` writes *snapshot* records into N+1 while the app's
   updates keep flowing into the same log;
3. append the snapshot-complete marker and make it durable;
4. move CURRENT to N+1, then apply retention.

If ``enumerate_all`` raises, N+1 stays incomplete and writing continues in it; the error is
logged, counted, handed to ``on_error`` and raised from ``rotate(wait=True)``. The next
trigger retries with N+2.

When a rotation runs (docs/DESIGN.md, "Rotation"): by default a fired trigger only makes a
rotation *due*; it starts at a quiet point, the app's next call into the Log, and updates
are held (:class:`Hold`) until ``enumerate_all`` returns, so the enumeration reads a state
that every acknowledged update was applied to, whatever locking the app does. With
``concurrent_enumeration=True`` a trigger starts the rotation at once and updates keep
flowing beside the enumeration: the app's own per-resource locks keep the two apart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from .._errors import EnumerateError, EnumerationStalled, LogClosedError, LogFailedError, PersistLogError
from .._format.codec import records_list
from .._runtime import Job, Runtime, weak_method
from .batch_buffer import NEVER
from .retention import Retention, apply_retention
from .segment_writer import move_pointer

if TYPE_CHECKING:
    from .batch_buffer import BatchBuffer
    from .batch_writer import BatchWriter

logger = logging.getLogger("persistlog")


#: Nanoseconds of enumeration between two times it gives the GIL away (``Emit._give_way``):
#: well under the interpreter's own switch interval (5 ms), which a thread waiting for the
#: GIL would otherwise wait out whole.
YIELD_INTERVAL_NS = 2_000_000


class Emit:
    """What ``enumerate_all`` is given: ``emit(record)`` writes one snapshot record,
    ``emit.many(records)`` several (a list, or any iterable of records) at
    ``update_many()``'s cost per record.

    Each record is encoded before the call returns, so the app may change or reuse its
    objects afterwards, and a record that cannot be logged raises (``TypeError``,
    ``ValueError``) from the call that emits it. ``emit.many`` is one call where a
    per-record ``emit`` is one per resource: an app that holds per-resource locks
    (``concurrent_enumeration=True``) takes its lock once per chunk of resources and emits
    them in one ``many`` call under it. Either is refused once ``enumerate_all`` returned.
    Usable wherever a ``Callable[[Any], None]`` is expected.
    """

    __slots__ = ("_one", "_many", "_open", "count", "_yield_at")

    def __init__(self, one: Callable[[Any], None], many: Callable[[list[Any]], None]) -> None:
        self._one = one
        self._many = many
        self._open = True
        #: Records emitted so far.
        self.count = 0
        self._yield_at = time.monotonic_ns() + YIELD_INTERVAL_NS

    def __call__(self, record: Any) -> None:
        """Write one snapshot record."""
        if not self._open:
            raise RuntimeError("emit() called after enumerate_all returned")
        self._one(record)
        self.count += 1
        if not self.count & 0xFF:
            self._give_way()

    def many(self, records: Iterable[Any]) -> None:
        """Write several snapshot records, in their order; raises before writing any record
        of a chunk (1,024 records) that holds one that cannot be logged."""
        if not self._open:
            raise RuntimeError("emit.many() called after enumerate_all returned")
        items = records_list(records, "emit.many()", "emit()")
        self._many(items)
        self.count += len(items)
        self._give_way()

    def _give_way(self) -> None:
        """Give the GIL away once every ``YIELD_INTERVAL_NS`` (looked at every 256
        ``emit`` calls, and at each ``emit.many``): an enumeration of millions of
        resources would otherwise hold it for whole switch intervals (5 ms) at a time and
        show up in the latency of the app's other threads. Not more often: ``sleep(0)``
        costs some 15 us of CPU (a timer: it must truly sleep for a waiting thread to take
        the GIL), 6 % of a call of ``emit.many`` of 1,000 small records."""
        now = time.monotonic_ns()
        if now >= self._yield_at:
            time.sleep(0)
            self._yield_at = now + YIELD_INTERVAL_NS

    def close(self) -> None:
        """Refuse every later call (``enumerate_all`` returned)."""
        self._open = False


EnumerateAll = Callable[[Emit], Any]

# Seconds a held update waits for an enumeration that makes no progress (emits nothing and
# does not return) before it gives up with EnumerationStalled: long enough for any real
# pause of an enumeration, short enough to name the usual cause, a lock that enumerate_all
# waits for and the held caller holds.
ENUMERATION_STALL = 10.0


class Hold:
    """Updates held while a rotation started at a quiet point enumerates.

    Released once (by the rotation job when ``enumerate_all`` returns or raises, or when
    the rotation ends without enumerating). Threads wait on a plain lock (see the note on
    ``Rotator._mutex``); asyncio tasks await ``released``.
    """

    def __init__(self, claimer: int | None = None) -> None:
        #: The thread (ident) that claimed these updates' quiet point, if a thread did.
        self.claimer = claimer
        self._lock = threading.Lock()
        self._lock.acquire()
        self.released: Future[None] = Future()
        # Set once a worker took the rotation up: a rotation waiting for a free worker
        # (others enumerate) is not a stalled enumeration.
        self._begun = False

    def begin(self) -> None:
        """The rotation holding these updates started: the stall clock runs from now."""
        self._begun = True

    def release(self) -> None:
        """Let the held updates go (idempotent)."""
        try:
            self._lock.release()
        except RuntimeError:
            return  # released already
        self.released.set_result(None)

    def wait(self, progress: Callable[[], int]) -> None:
        """Return once released; raise :class:`EnumerationStalled` if ``progress()`` (the
        log's next LSN, which only emits move while updates are held) stands still for
        ``ENUMERATION_STALL`` seconds first."""
        stall = ENUMERATION_STALL
        last = progress()
        since = time.monotonic()
        while not self._lock.acquire(timeout=min(1.0, stall)):
            now = progress()
            if now != last or not self._begun:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= stall:
                raise EnumerationStalled(
                    f"this call waited {stall:g}s for enumerate_all, which emitted nothing "
                    "meanwhile: if it waits for a lock that this call's caller holds, open the log "
                    "with concurrent_enumeration=True (the concurrency contract: per-resource "
                    "locks held while logging and while emitting); nothing of this call was logged"
                )
        self._lock.release()


class _Request:
    """What a requested rotation holds until it is finished: ``done``, a lock released once
    it is done (retention included), and ``complete``, one released once its log is
    complete (``rotate()`` waits on the first, ``open()`` on the second, not on the
    Future, whose methods take a Condition); ``hold``, the updates it holds, if any. Each
    is taken out (set to None) once, when released."""

    __slots__ = ("done", "complete", "hold")

    def __init__(self, hold: Hold | None) -> None:
        self.done: threading.Lock | None = threading.Lock()
        self.complete: threading.Lock | None = threading.Lock()
        self.done.acquire()
        self.complete.acquire()
        self.hold = hold


class Rotator:
    """Owns the rotation job, the triggers and the record of past rotations.

    It works on the Log's batch buffer (where batches are cut) and batch writer (which
    starts, completes and seals logs), never on the Log itself. The rotation job is made
    at the first rotation requested.
    """

    __slots__ = (
        "_buffer", "_writer", "_runtime", "concurrent", "gated", "_due", "_hold", "enumerate_all",
        "rotate_bytes", "rotate_records", "rotate_interval", "retention", "on_error",
        "known_complete", "rotations", "failures", "_last", "last_error", "rotating", "retaining",
        "_snapshot_bytes", "_pointer_moved", "_started_at", "_mutex", "_queue", "_requests", "_stop",
        "_job", "_runner", "_here", "__weakref__",
    )

    def __init__(
        self,
        buffer: BatchBuffer,
        writer: BatchWriter,
        enumerate_all: EnumerateAll,
        *,
        runtime: Runtime,
        rotate_bytes: int | None,
        rotate_records: int | None,
        rotate_interval: float | None,
        retention: Retention,
        on_error: Callable[[BaseException], None] | None,
        known_complete: list[int],
        concurrent: bool = False,
    ) -> None:
        self._buffer = buffer
        self._writer = writer
        self._runtime = runtime
        #: Whether enumerations run beside updates (``concurrent_enumeration=True``), or
        #: at a quiet point with updates held (the default).
        self.concurrent = concurrent
        #: True while updates must pass :meth:`pass_gate` first: a rotation is due (a
        #: trigger fired) or holds them. Read by the fronts on every update, unlocked.
        self.gated = False
        self._due = False
        self._hold: Hold | None = None
        self.enumerate_all = enumerate_all
        self.rotate_bytes = rotate_bytes
        self.rotate_records = rotate_records
        self.rotate_interval = rotate_interval
        self.retention = retention
        self.on_error = on_error
        self.known_complete = list(known_complete)
        self.rotations = 0
        self.failures = 0
        # (seq, snapshot records, seconds, finished) of the last rotation: last_rotation.
        self._last: tuple[int, int, float, float] | None = None
        self.last_error: BaseException | None = None
        self.rotating = False  # a rotation owns the head of the queue (its retention too)
        self.retaining = False  # ... and is deleting old logs
        self._snapshot_bytes = 0
        self._pointer_moved = True  # whether the last rotation's CURRENT move succeeded
        self._started_at = time.monotonic()
        # App threads take the plain lock: Condition's own __enter__ is Python code, and a
        # KeyboardInterrupt raised in it just after it took the lock would keep it forever.
        self._mutex = threading.RLock()
        self._queue: list[Future[int]] = []
        # What each request holds until it is finished (_Request), by its Future; None
        # while there is none, so that an idle Log keeps no table of them.
        self._requests: dict[Future[int], _Request] | None = None
        self._stop = False
        # Rotations run on the runtime's workers, one of this Log's at a time (a long job:
        # enumerate_all is app code that may take minutes), made at a request when there
        # is none, and dropped once no request is left. The job holds the Rotator only
        # while it runs.
        self._job: Job | None = None
        # The worker running this Log's rotation, while one runs (enumerate_all, on_error,
        # telling the secondaries, and retention included): what "inside enumerate_all" means.
        self._runner: threading.Thread | None = None
        # Held while rotate_here() runs a rotation on an app's thread (close() waits on it).
        self._here: threading.Lock | None = None

    # -- requests -----------------------------------------------------------------------

    @property
    def last_rotation(self) -> dict[str, Any] | None:
        """The last rotation: its log's ``seq``, its ``snapshot_records``, the ``seconds`` it
        took and when it ``finished`` (``time.time()``); None before the first."""
        if self._last is None:
            return None
        seq, emitted, seconds, finished = self._last
        return {"seq": seq, "snapshot_records": emitted, "seconds": seconds, "finished": finished}

    @property
    def due(self) -> bool:
        """Whether a fired trigger's rotation waits for the app's next call."""
        return self._due

    def trigger(self) -> None:
        """A trigger fired (size, count, interval, signal, a secondary taken back): rotate
        now beside the updates (``concurrent``), or at the next quiet point."""
        if self.concurrent:
            self.request()
            return
        with self._mutex:
            if not self._stop:
                # Gated first: the quiet point looks at `gated`, and finds the rotation due
                # or not; due but not gated, no call would ever start it.
                self.gated = True
                self._due = True

    def request(self, coalesce: bool = True, hold: Hold | None = None) -> Future[int]:
        """Ask for a rotation; a trigger joins a request not yet started. With ``hold``,
        updates are held from now until its enumeration returns."""
        with self._mutex:
            if self._stop:
                fut: Future[int] = Future()
                fut.set_exception(PersistLogError("the log is closing; no rotation was started"))
                if hold is not None:
                    if self._hold is hold:
                        self._hold = None
                        self.gated = False
                    hold.release()
                return fut
            # Join a request not yet started; never one already running (its enumeration
            # may have passed the change that fired this trigger) or finished.
            # (Only the head can be running or done: it is while `rotating`.)
            if coalesce and self._queue and not (len(self._queue) == 1 and self.rotating):
                return self._queue[-1]
            # The job is asked for first: an app thread interrupted after it leaves a run
            # that finds nothing to do, never a request queued that no run serves.
            self._run_job()
            fut = Future()
            if self._requests is None:
                self._requests = {}
            self._requests[fut] = _Request(hold)
            if hold is not None:
                self._hold = hold
                self._due = False
                self.gated = True
            self._queue.append(fut)
            return fut

    def _run_job(self) -> None:
        """Have the rotation job serve the queue, made if there is none (holds ``_mutex``)."""
        job = self._job
        if job is None:
            job = self._job = self._runtime.job(
                weak_method(self._serve), "persistlog-rotation", self._writer.dest.url, long=True)
        job.run_soon()

    def _serve_queued(self) -> None:
        """Have the job serve the queued rotations, if none runs: for the writers a fired
        trigger holds, whatever an interruption cut short on an app thread."""
        with self._mutex:
            if self._queue and not self.rotating and not self._stop and self._here is None:
                self._run_job()

    def rotate_here(self) -> int:
        """Rotate on the calling thread, retention included, and return the new log's seq
        (raising what the rotation raised): the open's first log on a local disk, which
        the opener waits for anyway, without handing it to a worker and back. A request
        queued meanwhile (a trigger fired by a secondary) is left to the rotation job."""
        fut: Future[int] = Future()
        here = threading.Lock()
        here.acquire()
        head = False
        # One try from the moment `here` may be published: an interruption anywhere
        # after that lets it go (close() waits on it) and leaves a queued request to the
        # job, never a held `_here` that nobody releases.
        try:
            with self._mutex:
                head = not self._stop and not self._queue
                if head:
                    if self._requests is None:
                        self._requests = {}
                    self._requests[fut] = _Request(None)
                    self._queue.append(fut)
                    self._here = here
            if head:
                self._serve_head(here=True)
        finally:
            if head:
                with self._mutex:
                    self._here = None
                    if self._queue and not self._stop:
                        self._run_job()
                here.release()
        if not head:
            # Not first in the queue: wait for the rotation job like any other request.
            return self.wait(self.request(coalesce=False))
        return fut.result(0)

    # -- the quiet point ----------------------------------------------------------------

    def claim_quiet_point(self, by_thread: bool = True) -> tuple[Hold | None, bool]:
        """At an app's call while ``gated``: the hold to wait for, and whether this caller
        must start the rotation (it was due and nobody holds the updates yet). A claimed
        hold holds updates at once; pass it to :meth:`request` (or :meth:`give_up`).

        A thread's claim is its thread's until requested: an interruption after the claim
        and before the caller knew of it leaves the hold to the thread's next call, which
        starts the rotation (``by_thread=False``: an asyncio task's, on a loop's thread)."""
        with self._mutex:
            hold = self._hold
            if hold is not None:
                mine = by_thread and hold.claimer == threading.get_ident() and not self._requested(hold)
                return hold, mine
            if self._due and not self._stop and not self.in_rotation():
                hold = Hold(threading.get_ident() if by_thread else None)
                self._hold = hold
                self._due = False
                return hold, True
            self._due = False
            self.gated = False
            return None, False

    def hold_updates(self) -> Hold:
        """Hold updates from now on, for a rotation requested later with this hold (an
        asyncio ``rotate()`` first lets the tasks told of their records run on)."""
        with self._mutex:
            hold = self._hold = Hold()
            self.gated = True
            return hold

    def _requested(self, hold: Hold) -> bool:
        """Whether a queued rotation holds ``hold`` (holds ``_mutex``)."""
        requests = self._requests
        if requests is None:
            return False
        for fut in self._queue:
            request = requests.get(fut)
            if request is not None and request.hold is hold:
                return True
        return False

    def give_up(self, hold: Hold) -> None:
        """A claimed hold whose rotation was not requested (its caller was interrupted):
        the rotation is due again and the updates go on. One the request queued before
        the interruption stays, for that rotation to release."""
        with self._mutex:
            if self._requested(hold):
                return
            if self._hold is hold:
                self._hold = None
                self._due = not self._stop
                self.gated = self._due
        hold.release()

    def pass_gate(self) -> None:
        """The quiet point of a thread's call (``update()``, ``update_many()``): start a due
        rotation, or wait for one that holds updates. Raises :class:`EnumerationStalled`
        if the enumeration stands still (nothing of the call is logged then)."""
        if self.in_rotation():
            return  # an update() from inside enumerate_all goes on beside its emits
        while self.gated:
            hold, mine = self.claim_quiet_point()
            if hold is None:
                return
            if mine:
                try:
                    self.request(coalesce=False, hold=hold)
                except BaseException:
                    self.give_up(hold)
                    raise
            hold.wait(self._next_lsn)

    def _next_lsn(self) -> int:
        return self._buffer.next_lsn

    def _let_go_of(self, fut: Future[int]) -> None:
        """Release the updates ``fut``'s rotation holds, if any."""
        with self._mutex:
            hold = self._take(fut, "hold")
            if hold is None:
                return
            if self._hold is hold:
                self._hold = None
                self.gated = self._due
        hold.release()

    def wait(self, fut: Future[int], timeout: float | None = None, retention: bool = True) -> int:
        """``fut.result(timeout)``, waiting on a plain lock: an interruption there leaves
        nothing held. With ``retention=False`` it returns once the log is complete, while
        the job may still delete old logs (open(): an object store's old logs take a
        request per segment)."""
        requests = self._requests
        request = requests.get(fut) if requests is not None else None
        done = None if request is None else request.done if retention else request.complete
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
        writer = self._writer
        seq = writer.seq + 1
        writer.start_log(seq)
        self._arm_records(False)
        logger.info("log %d started at %s after the snapshot of log %d, without an opening enumeration",
                 seq, writer.dest.url, seq - 1)
        return seq

    def _finished(self, fut: Future[int]) -> None:
        self._release(fut, "complete")
        self._release(fut, "done")

    def _release(self, fut: Future[int], which: str) -> None:
        """Release ``fut``'s lock ``which`` (``"complete"`` or ``"done"``), once."""
        lock = self._take(fut, which)
        if lock is not None:
            lock.release()

    def _take(self, fut: Future[int], which: str) -> Any:
        """Take ``fut``'s ``which`` (``"done"``, ``"complete"`` or ``"hold"``) out of its
        request (None if taken already); a request is forgotten once all three are."""
        with self._mutex:
            requests = self._requests
            request = requests.get(fut) if requests is not None else None
            if request is None:
                return None
            value = getattr(request, which)
            setattr(request, which, None)
            if request.done is None and request.complete is None and request.hold is None:
                assert requests is not None
                del requests[fut]
                if not requests:
                    self._requests = None
            return value

    def check_triggers(self) -> None:
        """Called after each batch: cheap checks of the size and count triggers.

        Between checks the writer cuts its batches where a trigger would fire (the
        record-count trigger's LSN, the bytes left before the size trigger), and a fired
        trigger holds the writers that hand batches over until the new log is started: a
        log overshoots a trigger by at most about one batch (``batch_bytes``). A trigger
        crossed while the log's own enumeration still runs fires when it ends.
        """
        writer, buffer = self._writer, self._buffer
        sw = writer.current
        if sw is None:
            return
        records_due = self.rotate_records is not None and writer.log_update_records >= self.rotate_records
        # Not the Futures' own done(): it enters a Condition (see the note on _mutex). The
        # head of the queue is done once it is retaining; the others have not started.
        if self._due or len(self._queue) > 1 or (self._queue and not self.retaining):
            # Whole batches while a rotation is due or enumerating; this runs again after
            # it. (One only deleting old logs has a complete log already: queue the next.)
            buffer.cut_batches_at(None)
            self._arm_records(records_due)
            if self._queue and not self.rotating:
                self._serve_queued()
            return
        log_bytes = sw.bytes_written - self._snapshot_bytes
        if records_due or (self.rotate_bytes is not None and log_bytes >= self.rotate_bytes):
            self._arm_records(True)
            buffer.cut_batches_at(None)
            if not self.concurrent:
                self.trigger()  # the app's next call starts it, with updates held
                return
            # Set before the request: the rotation job may switch before it returns.
            writer.hold_writers_for_switch()
            try:
                self.request()
            except BaseException:
                self._switched()  # interrupted: no writer waits for a switch maybe never asked for
                raise
            if self._stop:  # refused: the log is closing
                self._switched()
            return
        self._arm_records(False)
        if self.rotate_bytes is not None:
            buffer.cut_batches_at(self.rotate_bytes - log_bytes)

    def _arm_records(self, off: bool) -> None:
        """Have update() hand its batch over at the record-count trigger (buffered mode)."""
        writer = self._writer
        if off or self.rotate_records is None:
            self._buffer.cut_at_lsn(NEVER)
        else:
            self._buffer.cut_at_lsn(writer.written_lsn + self.rotate_records - writer.log_update_records - 1)

    def _switched(self) -> None:
        """Release the writers a fired trigger holds (the new log is started, or will not be)."""
        self._writer.release_writers_held_for_switch()

    def check_interval(self) -> None:
        if self.rotate_interval is None or self.rotating or self._queue or self._due:
            return
        if time.monotonic() - self._started_at >= self.rotate_interval:
            self.trigger()

    def next_interval_check(self) -> float | None:
        """When :meth:`check_interval` is next worth calling (``time.monotonic()``), or
        None without an interval trigger. While a rotation is due, queued or running the
        check waits one more interval (a rotation that starts resets the clock)."""
        if self.rotate_interval is None:
            return None
        due = self._started_at + self.rotate_interval
        if self.rotating or self._queue or self._due:
            due = max(due, time.monotonic() + self.rotate_interval)
        return due

    def in_rotation(self) -> bool:
        """Whether the calling thread is the worker running this Log's rotation (inside
        ``enumerate_all``, ``on_error``, telling the secondaries or retention)."""
        return self._runner is threading.current_thread()

    def refuse_from_rotation_thread(self, call: str) -> None:
        """Raise ``RuntimeError`` if called from inside ``enumerate_all`` (or ``on_error``).

        ``call`` waits for the rotation that is running on this very thread: it would
        wait forever.
        """
        if self.in_rotation():
            raise RuntimeError(
                f"{call} cannot be called from inside enumerate_all (this Log's rotation): "
                "it waits for the rotation that is running there"
            )

    # -- the rotation job ---------------------------------------------------------------

    def _serve(self) -> float | None:
        """The rotation job: run the rotation at the head of the queue; run again at once
        while more are queued (each rotation is a run of its own, so that the worker goes
        back to the pool between two)."""
        served = self._serve_head()
        with self._mutex:
            if served and self._queue and not self._stop:
                return 0.0
            if not self._queue:
                # Nothing queued: the job goes, and the next request makes another, so
                # that a Log that rotated once (at its open) keeps no job. A request can
                # only come in under this lock, and this run touches nothing after it.
                self._job = None
            return None

    def _serve_head(self, here: bool = False) -> bool:
        """Run the rotation at the head of the queue on this thread; False if there is
        none, or if another thread runs it (:meth:`rotate_here`, which runs the job after:
        ``here`` is its call)."""
        with self._mutex:
            if not self._queue or self.rotating or (self._here is not None and not here):
                return False
            fut = self._queue[0]
            self.rotating = True
            self._runner = threading.current_thread()
            requests = self._requests
            request = requests.get(fut) if requests is not None else None
            hold = request.hold if request is not None else None
        if hold is not None:
            hold.begin()
        done = False
        try:
            if fut.set_running_or_notify_cancel():
                try:
                    seq = self._rotate(fut)
                except BaseException as e:
                    fut.set_exception(e)
                else:
                    fut.set_result(seq)
                    self._release(fut, "complete")
                    self.retaining = True
                    try:
                        self._retain()
                    finally:
                        self.retaining = False
                    done = True
        finally:
            self._let_go_of(fut)
            with self._mutex:
                del self._queue[0]
                if not self._queue:
                    self._queue = []  # an idle Log keeps no room for requests
                self.rotating = False
                self._runner = None
            self._finished(fut)
        if done:
            # Batches written while this rotation ran skipped the size and count checks;
            # check once now, or a trigger crossed meanwhile waits for the next batch.
            self.check_triggers()
        return True

    def _rotate(self, fut: Future[int]) -> int:
        writer = self._writer
        started = time.monotonic()
        self._started_at = started
        seq = writer.seq + 1
        try:
            writer.start_log(seq)
            self._arm_records(False)
        finally:
            self._switched()
        self._snapshot_bytes = 0
        emit = Emit(writer.emit, writer.emit_many)
        try:
            self.enumerate_all(emit)
        except BaseException as e:
            emit.close()
            self._let_go_of(fut)
            self.failures += 1
            self.last_error = e
            if isinstance(e, (LogFailedError, KeyboardInterrupt)) or writer.failed is not None:
                # (A KeyboardInterrupt, on the opening thread: as itself. The log stays
                # incomplete, as after a crash there, and the open lets the Log go.)
                raise
            logger.error("enumerate_all failed; log %d stays incomplete and the next trigger retries: %r", seq, e)
            if self.on_error is not None:
                try:
                    self.on_error(e)
                except Exception:
                    logger.exception("on_error callback raised")
            raise EnumerateError(f"enumerate_all raised during rotation to log {seq}: {e!r}") from e
        emit.close()
        emitted = emit.count
        self._let_go_of(fut)  # held updates go on: the snapshot has read the state
        complete_lsn, self._snapshot_bytes = writer.complete_log(emitted)
        self._pointer_moved = move_pointer(writer.dest, seq)
        self.known_complete.append(seq)
        self.rotations += 1
        seconds = round(time.monotonic() - started, 6)
        self._last = (seq, emitted, seconds, time.time())
        logger.info("log %d complete at %s: %d snapshot records in %.3fs", seq, writer.dest.url, emitted, seconds)
        writer.secondaries_complete(seq, complete_lsn)
        return seq

    def _retain(self) -> None:
        if not self._pointer_moved:
            # Old logs go only once a newer complete log *and its pointer* are durable
            # (docs/DESIGN.md invariant 4): wait for a rotation whose CURRENT move succeeds.
            logger.warning("retention at %s postponed: CURRENT was not moved", self._writer.dest.url)
            return
        try:
            apply_retention(self._writer.dest, self.known_complete, self.retention, self._writer.seq)
        except BaseException as e:  # the rotation job must outlive anything retention meets
            if isinstance(e, KeyboardInterrupt):
                raise  # Ctrl-C, in an open's first rotation on the app's thread: as itself
            logger.warning("retention at %s failed (will retry after the next rotation): %s", self._writer.dest.url, e)

    def close(self, timeout: float | None = None) -> None:
        """Wait for a running rotation (``timeout`` seconds at most), drop queued ones,
        run the rotation job no more."""
        with self._mutex:
            self._stop = True
            # The rotation job owns the head of the queue while `rotating` (it is waited
            # for); the ones never started fail as the Log does from now on, not with a bare
            # CancelledError in a rotate(wait=True) caller.
            start = 1 if self.rotating else 0
            dropped = self._queue[start:]
            for fut in dropped:
                if not fut.done():
                    fut.set_exception(LogClosedError("the log was closed before this rotation started"))
                self._finished(fut)
            del self._queue[start:]
            self._due = False
        for fut in dropped:
            self._let_go_of(fut)
        self._switched()
        here = self._here
        if here is not None and not self.in_rotation():
            # A rotation rotate_here() runs on another thread (the open's, while a
            # handover asks for the log).
            if here.acquire(timeout=-1 if timeout is None else timeout):
                here.release()
            else:
                logger.warning("closing %s without waiting any longer for the rotation in progress",
                               self._writer.dest.url)
        job = self._job
        if job is None:
            return
        job.cancel()
        if not job.wait_idle(timeout):
            logger.warning("closing %s without waiting any longer for the rotation in progress", self._writer.dest.url)

    def idle(self) -> bool:
        """Whether no rotation runs or waits (retention included)."""
        return not self.rotating and not self._queue

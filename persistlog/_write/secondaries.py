"""Secondary destinations: every record also goes to each of them, off the update path.

Each secondary has its own writer thread fed through a bounded queue: a slow secondary
slows ``update()`` only once its queue is full (backpressure, never a silent drop). The
thread mirrors the primary's log generations event by event (start, batches, seal,
pointer) with its own segment writer, so the secondary holds ordinary, self-sufficient
logs that restore and followers read like any other.

A secondary never stops the primary. One that cannot be attached (unreachable, or still
leased by a crashed predecessor) or that fails later is *detached*: the cause is logged
and kept for ``Log.stats()``, and the events of the log being written are dropped. The
thread keeps trying to take the secondary back (when a lease runs out, else with a
doubling wait), and once it has it asks for a rotation: a new log is complete by itself,
so the secondary is whole again as soon as that log's enumeration is.

A log written to a secondary that does not continue exactly the log before it there (a
detached stretch, a writer that crashed with the secondary behind) says so in its header
(``after_gap``): readers then start from a complete log after the gap, or stop before it,
instead of reading a broken chain as corruption.

The thread also keeps how far a restore of the secondary reaches (``restore_last_lsn`` in
``stats()``): read when it takes the secondary, moved on by each write while what the
secondary holds is whole (no gap since its newest complete log). At ``close()`` the Log
asks each secondary whether it will hold the primary's history whole (:meth:`behind`),
waits for the ones that do not to answer, gives them a new log, and afterwards has each
one that still falls short say so (:meth:`lag`, a :class:`SecondaryLag`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from destinations import Destination, LockHeld, WriterLock

from .._errors import WriterConflict
from .._format import encoder
from .._format import constants as F
from .._format.chain import link_of
from .._read.reader import end_and_chain, header_record, list_logs, newest_seal
from .._read.restore import reach
from .retention import Retention, apply_retention
from .segment_writer import SegmentWriter, fence_newest_log, move_pointer, now_us, seal_batch, segment_writer

logger = logging.getLogger("persistlog")

QUEUE_BATCHES = 256
LEASE_TTL = 30.0
#: Longest open() waits for a secondary to answer before going on without it.
ATTACH_WAIT = 5.0
#: Waits between attempts to take a detached secondary back: doubling from the first to
#: the last, so that a secondary failing again and again costs few rotations.
RETRY_FIRST = 1.0
RETRY_MAX = 300.0
#: Longest any one wait of the Log on a secondary's thread lasts before it checks that the
#: thread still runs (a thread that died answers nothing).
_WAIT_SLICE = 0.1


@dataclass(frozen=True)
class SecondaryLag:
    """A secondary that does not hold the primary's state after ``close()``.

    ``last_lsn`` is the last LSN a restore of it reaches (0: none; None: unknown, as for a
    secondary never reached), against the primary's ``primary_last_lsn``; ``reason`` says
    why it is behind (detached and why, a log after a gap not complete there, a thread
    still writing) and how long ``close()`` waited for it.
    """

    url: str
    last_lsn: int | None
    primary_last_lsn: int
    reason: str


class Secondary:
    """One secondary destination and its writer thread."""

    def __init__(
        self,
        dest: Destination,
        *,
        writer_id: str,
        segment_bytes: int,
        retention: Retention,
        flush_interval: float,
        queue_batches: int = QUEUE_BATCHES,
        lease_ttl: float = LEASE_TTL,
        on_ready: Callable[[], None] | None = None,
        sign_seal: Callable[[int, int, bytes | None], dict[str, Any]] | None = None,
    ) -> None:
        self.lease_ttl = lease_ttl
        # The writer's signature of a seal (seq, next LSN, chain head): a secondary's
        # seals are signed as the writer's are (nothing when it does not sign).
        self.sign_seal = sign_seal
        self.dest = dest
        self.writer_id = writer_id
        self.segment_bytes = segment_bytes
        self.retention = retention
        self.flush_interval = flush_interval
        self.on_ready = on_ready
        self.queue: queue.Queue[tuple[Any, ...]] = queue.Queue(maxsize=queue_batches)
        self.error: BaseException | None = None
        self.detaches = 0
        self.batches = 0
        self.bytes = 0
        self.complete_seq: int | None = None
        self._lock: WriterLock | None = None
        self._sw: SegmentWriter | None = None
        self._next_lsn = 0
        # The chain head of the log written here (None: not chained): what its seal names.
        self._head: bytes | None = None
        self._complete_lsn: int | None = None  # the current log's, for its seal
        # (seq, next LSN) of the newest log at the destination when known for sure: a new
        # log continues it only if it is the next seq starting at that LSN.
        self._end: tuple[int, int] | None = None
        # Where the hash chain of that newest log ends here (None: not known, or not
        # chained): a new log continues it only if its header links to exactly this. A
        # destination that missed a control batch (a snapshot-complete marker a crash kept
        # from it) ends its chain elsewhere than the primary, with no LSN missing.
        self._end_head: bytes | None = None
        self._known_complete: list[int] = []
        # The next LSN a restore of the destination reaches (None: not known), and whether
        # what it holds from its newest complete log on is the primary's history without a
        # gap, so that each write there moves that reach on.
        self._reach: int | None = None
        self._whole = False
        # Notified when a log completes, the secondary answers or is detached, a signal
        # from the Log is handled.
        self._changed = threading.Condition()
        # Producer side (the Log's threads): events are numbered so that the thread can
        # tell when some were dropped; a log's events are fed only if the secondary was
        # healthy when the log started.
        self._events = 0
        self._expect = 1
        self._feed = False
        self._put_lock = threading.Lock()
        self._failures = 0
        self._retry_at: float | None = None
        self._probed = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name=f"persistlog-secondary {dest.url}", daemon=True)

    def attach(self, wait: float = ATTACH_WAIT) -> None:
        """Start the thread and wait up to ``wait`` seconds for it to take the secondary.

        Never raises for the secondary's sake: one that is not taken by then is detached
        (``error`` says why) and the thread keeps trying.
        """
        self._thread.start()
        if not self._probed.wait(wait):
            self.error = TimeoutError(f"secondary {self.dest.url} did not answer within {wait}s")
            logger.warning("going on without secondary %s for now: it did not answer within %ss", self.dest.url, wait)

    def _take_lock(self) -> None:
        try:
            self.dest.ensure()
            self._lock = self.dest.lock(self.writer_id, self.lease_ttl)
        except LockHeld as e:
            raise WriterConflict(f"secondary {e}; a destination has one writer at a time") from e
        try:
            if not self.dest.appendable:
                # As the primary's opening does: the writer that held the lease before
                # may still be about to write here (docs/DESIGN.md, "One writer").
                fence_newest_log(self.dest, self.writer_id)
            logs = list_logs(self.dest)
            seal = newest_seal(self.dest, logs)
            seq, next_lsn, self._end_head = end_and_chain(self.dest, logs, seal)
            self._end = (seq, next_lsn)
        except Exception as e:  # unknown end: the next log declares a gap, which is always safe
            logger.info("cannot tell where the logs at %s end (%s): the next log there follows a gap", self.dest.url, e)
            self._end = None
            self._end_head = None
        self._read_reach()
        # Writes here move the reach on only if a restore reads through to their log.
        self._whole = self._end is not None and self._reach == self._end[1]

    def _read_reach(self) -> None:
        """Read how far a restore of the secondary reaches: when it is taken, and once for
        the report when another writer holds it (it changes only under that writer)."""
        try:
            self._reach = reach(self.dest)
        except Exception as e:
            logger.info("cannot tell how far a restore of %s reaches: %s", self.dest.url, e)
            self._reach = None

    # -- events from the Log (in LSN order; batches under its I/O lock) -----------------

    def _put(self, event: tuple[Any, ...], feed: bool) -> None:
        with self._put_lock:
            self._events += 1
            if feed:
                self.queue.put((self._events, *event))

    def start(self, seq: int, first_lsn: int, header_batch: bytes) -> None:
        # Decided once per log: a secondary whose lock is not held now (its thread may be
        # busy trying to take it) skips this whole log; one that failed but holds its lock
        # is tried again with it, as every new log is complete by itself.
        self._feed = self._lock is not None
        self._put(("start", seq, first_lsn, header_batch, self._feed), True)

    def batch(self, data: bytes, first: int, end: int) -> None:
        self._put(("batch", data, first, end), self._feed)

    def seal(self) -> None:
        self._put(("seal",), self._feed)

    def complete(self, seq: int, complete_lsn: int) -> None:
        self._put(("complete", seq, complete_lsn), self._feed)

    def close(self, seal: bool = False, timeout: float | None = 60.0) -> None:
        """Write what is queued (sealing the current log if asked), then stop."""
        self._closing = True
        if not self._thread.is_alive():
            self._release()
            return
        self._put(("close", seal), True)
        # A thread still trying to take the secondary lets go of it when that returns.
        self._thread.join(timeout if self._lock is not None else min(timeout or 1.0, 1.0))
        if self._thread.is_alive() and self._lock is not None:
            logger.warning("secondary %s did not drain within %ss", self.dest.url, timeout)

    def wait_complete(self, seq: int, timeout: float | None = None) -> bool:
        """Wait until log ``seq`` is complete at this destination (False if detached)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while (self.complete_seq or 0) < seq:
                if self.error is not None and self._sw is None:
                    return False
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._changed.wait(remaining if remaining is not None else 0.5)
        return True

    # -- closing: is it whole, and if not, why ------------------------------------------

    def behind(self, seq: int, timeout: float) -> bool:
        """Whether this secondary will not hold the primary's history whole at the end of
        log ``seq`` unless a new log goes there: it is detached, or was not given log
        ``seq`` from its start, or holds it after a gap and no log complete since.

        Waits up to ``timeout`` for the thread to take in what is queued first. A thread
        still busy writing then is not behind: a new log would not help it.
        """
        if self.error is not None or self._lock is None or not self._thread.is_alive():
            return True
        if not self._settle(timeout):
            return self.error is not None or not self._thread.is_alive()
        sw = self._sw
        return not (self.error is None and sw is not None and sw.seq >= seq and self._whole)

    def wait_answer(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the thread to hold this secondary again (its lock
        taken, no error); True once it does. A detached secondary is tried again at once,
        and then at the first retry waits again, or as its lease runs out."""
        if self._answers():
            return True
        self._signal("hurry")
        return self._wait(self._answers, timeout)

    def lag(self, next_lsn: int, waited: str | None = None) -> SecondaryLag | None:
        """How this secondary falls short of a primary whose records end before
        ``next_lsn`` (its Log has just let go of it); None if a restore of it gives
        exactly the primary's state. ``waited`` says what ``close()`` did for it."""
        if self._reach == next_lsn and self.error is None:
            return None
        if self.error is not None:
            why = f"detached ({type(self.error).__name__}: {self.error})"
        elif self._thread.is_alive():
            why = "its thread was still writing when close() stopped waiting for it"
        elif not self._whole:
            why = "its newest log follows a gap and is not complete there"
        else:
            why = "it does not hold the primary's last records"
        last = None if self._reach is None else self._reach - 1
        return SecondaryLag(self.dest.url, last, next_lsn - 1, f"{why}; {waited}" if waited else why)

    def _answers(self) -> bool:
        return self.error is None and self._lock is not None

    def _settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the thread to take in every event queued before."""
        reached = threading.Event()
        return self._signal("barrier", reached, timeout) and self._wait(reached.is_set, timeout)

    def _signal(self, kind: str, reached: threading.Event | None = None, timeout: float = 0.0) -> bool:
        """Queue a signal for the thread (not a log event: it takes no event number)."""
        try:
            self.queue.put((0, kind, reached), timeout=max(timeout, 1e-3))
        except queue.Full:
            return False
        return True

    def _wait(self, ready: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not ready():
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return ready()
                self._changed.wait(min(left, _WAIT_SLICE))
        return True

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    @property
    def healthy(self) -> bool:
        return self.error is None

    def stats(self) -> dict[str, Any]:
        retry = self._retry_at
        return {
            "url": self.dest.url,
            "role": "secondary",
            "healthy": self.healthy,
            "attached": self._sw is not None,
            "error": repr(self.error) if self.error else None,
            "retry_in": round(max(0.0, retry - time.monotonic()), 3) if retry is not None and self.error else None,
            "queued": self.queue.qsize(),
            "batches": self.batches,
            "bytes": self.bytes,
            "detaches": self.detaches,
            "complete_log": self.complete_seq,
            "written_lsn": self._next_lsn - 1 if self._sw is not None else None,
            "restore_last_lsn": self._reach - 1 if self._reach is not None else None,
        }

    # -- the thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        self._probe()
        self._probed.set()
        if isinstance(self.error, WriterConflict):
            self._read_reach()
        last_renew = last_flush = time.monotonic()
        renew_every = self.lease_ttl / 3
        while True:
            # Flush on the interval even while events keep coming: waiting for an idle
            # queue would keep an object store's segments in memory under steady load.
            # Wake for the lease too, whatever the flush interval: a lapsed lease lets
            # another writer in; and for the next attempt to take a detached secondary.
            now = time.monotonic()
            wait = max(0.0, last_flush + self.flush_interval - now)
            if self._lock is not None and not self.dest.appendable:
                wait = min(wait, max(0.0, last_renew + renew_every - now))
            if self.error is not None and self._retry_at is not None:
                wait = min(wait, max(0.0, self._retry_at - now))
            try:
                event = self.queue.get(timeout=wait) if wait > 0 else self.queue.get_nowait()
            except queue.Empty:
                event = None
            if event is not None and event[0] == 0:
                self._handle_signal(event[1], event[2])
                event = None
            try:
                if event is not None and event[1] == "close":
                    try:
                        if self._sw is not None:
                            if event[2]:
                                self._seal()
                            else:
                                self._flush(self._sw)
                    finally:
                        self._release()
                    return
                if event is not None:
                    self._handle(event)
                if time.monotonic() - last_flush >= self.flush_interval:
                    last_flush = time.monotonic()
                    if self._sw is not None:
                        self._flush(self._sw)
                if self._lock is not None and not self.dest.appendable and time.monotonic() - last_renew >= renew_every:
                    last_renew = time.monotonic()
                    self._renew()
            except Exception as e:
                if event is not None and event[1] == "close":
                    logger.warning("closing secondary %s failed: %s", self.dest.url, e)
                    self.error = e
                    return
                self._detach(e)
            if self.error is not None and self._retry_at is not None and time.monotonic() >= self._retry_at:
                if self._probe() and self.on_ready is not None:
                    self.on_ready()  # a rotation: the next log goes here whole
                last_renew = time.monotonic()
                self._notify()

    def _handle_signal(self, kind: str, reached: threading.Event | None) -> None:
        """A signal from the Log's closing: ``barrier`` (everything queued before it is
        taken in) or ``hurry`` (try a detached secondary again now)."""
        if kind == "hurry" and self.error is not None and self._retry_at is not None:
            self._failures = 0
            self._schedule_retry(self.error)  # soon, and as the lease runs out at the latest
        if reached is not None:
            reached.set()
        self._notify()

    def _flush(self, sw: SegmentWriter) -> None:
        sw.flush()
        self._written()

    def _written(self) -> None:
        """What is written here is at the destination now: a restore reaches it if whole."""
        if self._whole:
            self._reach = self._next_lsn

    def _renew(self) -> None:
        assert self._lock is not None
        try:
            self._lock.renew()
        except LockHeld:
            # Another writer took the lease over: never write there again without taking
            # it back first.
            self._lock = None
            raise

    def _probe(self) -> bool:
        """Try to take the secondary (back): its lock if not held, else one request.

        True when it answered; otherwise it stays detached until the next attempt.
        """
        self._retry_at = None
        try:
            if self._closing:
                return False
            if self._lock is None:
                self._take_lock()
            elif self.dest.appendable:
                self.dest.ensure()
            else:
                self._lock.renew()
        except Exception as e:
            if isinstance(e, LockHeld):
                self._lock = None
            self._failures += 1
            self._schedule_retry(e)
            if self.error is None or self._failures == 1:
                logger.warning("secondary %s is detached (retrying in %.1fs): %s", self.dest.url,
                            self._retry_at - time.monotonic() if self._retry_at else 0.0, e)
            self.error = e
            return False
        if self._closing:
            self._release()
            return False
        if self.error is not None:
            logger.info("secondary %s answers again: it is re-attached with the next log", self.dest.url)
        self.error = None
        return True

    def _schedule_retry(self, e: BaseException) -> None:
        delay = min(RETRY_MAX, RETRY_FIRST * 2 ** (self._failures - 1))
        cause = e.__cause__ if isinstance(e, WriterConflict) else e
        expires = getattr(cause, "expires", None)
        if isinstance(expires, float):
            # Held by a lease (a crashed predecessor's, typically): try as it runs out at
            # the latest.
            delay = min(delay, max(expires - time.time(), 0.0) + 0.05)
        self._retry_at = time.monotonic() + delay

    def _handle(self, event: tuple[Any, ...]) -> None:
        number, kind = event[0], event[1]
        dropped = number != self._expect
        self._expect = number + 1
        if kind == "start":
            _, _, seq, first, header_batch, feed = event
            if self._sw is not None:
                # Its seal was dropped: what an unsealed writer let go of is not known.
                self._sw.close()
                self._sw = None
                self._end = None
            if not feed:
                return  # detached when this log started: it is skipped here
            if self._lock is None:
                self._take_lock()  # lost since: a secondary is never written unlocked
            link = link_of(header_batch)
            if self._end != (seq - 1, first) or (link is not None and link != self._end_head):
                header_batch = self._after_gap(header_batch, first)
                self._whole = False  # a restore stops before this log until it is complete
            started = segment_writer(self.dest, seq, self.segment_bytes)
            started.start(first, header_batch)
            self._sw = started
            self._head = self._end_head = started.head
            self._next_lsn = first
            self._complete_lsn = None
            self._end = (seq, first)
            if self.error is not None:
                logger.info("re-attached secondary %s with log %d", self.dest.url, seq)
                self.error = None
            return
        sw = self._sw
        if sw is None:
            return  # detached, or attached mid-log: wait for the next log to start
        if dropped:
            raise RuntimeError(f"events of log {sw.seq} were dropped while the secondary was busy")
        if kind == "batch":
            _, _, data, first, end = event
            new = not sw.holds(data, first, end)  # False: handed over again
            sw.append(data, first, end)  # nothing if it holds it
            self._head = self._end_head = sw.head
            self._next_lsn = end
            self._end = (sw.seq, end)
            if new:
                self.batches += 1
                self.bytes += len(data)
            if sw.dest.appendable or getattr(sw, "pending_bytes", 0) >= self.segment_bytes:
                self._flush(sw)
        elif kind == "seal":
            self._seal()
        elif kind == "complete":
            seq = event[2]
            if seq != sw.seq:
                return  # a log this secondary does not hold whole: CURRENT must not name it
            self._complete_lsn = event[3]
            sw.sync()
            self._whole = True  # a complete log: a restore starts here and reads all of it
            self._written()
            moved = move_pointer(self.dest, seq)
            self._known_complete.append(seq)
            self._failures = 0
            with self._changed:
                self.complete_seq = seq
                self._changed.notify_all()
            if moved:  # as on the primary: old logs go only after the pointer moved
                apply_retention(self.dest, self._known_complete, self.retention, seq)

    def _after_gap(self, header_batch: bytes, first: int) -> bytes:
        """The log header, saying that this log does not continue the one before it here."""
        header = header_record(header_batch, 0)
        assert header is not None, "the writer's first batch is its log header"
        logger.info("secondary %s: log %d follows a gap (the logs here end at %s)", self.dest.url,
                 header["seq"], self._end)
        return encoder.control_batch([{**header, F.HEADER_AFTER_GAP: True}], first, now_us(), link_of(header_batch))

    def _seal(self) -> None:
        sw = self._sw
        if sw is None:
            return
        signed = self.sign_seal(sw.seq, self._next_lsn, self._head) if self.sign_seal is not None else None
        sw.seal(seal_batch(self._next_lsn, self._complete_lsn, self._head, signed))
        sw.confirm()  # no other writer took this secondary over and deleted the log meanwhile
        self._written()
        self._sw = None

    def _detach(self, e: BaseException) -> None:
        self.error = e
        self.detaches += 1
        self._failures += 1
        self._end = None  # what the failed write left there is unknown
        self._whole = False
        self._feed = False  # events of this log are no use here: spare the queue
        self._schedule_retry(e)
        logger.warning("secondary %s detached (retrying in %.1fs): %s", self.dest.url,
                    (self._retry_at or 0.0) - time.monotonic(), e)
        if self._sw is not None:
            try:
                self._sw.close()
            except Exception:
                pass
            self._sw = None
        self._notify()

    def _release(self) -> None:
        if self._lock is not None:
            try:
                self._lock.release()
            except OSError as e:
                logger.warning("releasing the writer lock on %s failed: %s", self.dest.url, e)
            self._lock = None
        self.dest.close()

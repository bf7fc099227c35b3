"""Secondary destinations: every record also goes to each of them, off the update path.

Each secondary has its own writer thread fed through a bounded queue: a slow secondary
slows ``update()`` only once its queue is full (backpressure, never a silent drop). The
thread mirrors the primary's log generations event by event (start, batches, seal,
pointer) with its own segment writer, so the secondary holds ordinary, self-sufficient
logs that restore and followers read like any other.

A secondary that fails is *detached*: the cause is logged and kept for ``Log.stats()``,
its events are dropped until the next log starts, and then it is re-attached, because a
new log is complete by itself.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from destinations import Destination, LockHeld, WriterLock

from ._errors import DestinationError, WriterConflict
from ._retention import apply_retention
from ._segment_writer import SegmentWriter, move_pointer, seal_batch, segment_writer

log = logging.getLogger("persistlog")

QUEUE_BATCHES = 256
LEASE_TTL = 30.0


class Replica:
    """One secondary destination and its writer thread."""

    def __init__(
        self,
        dest: Destination,
        *,
        writer_id: str,
        segment_bytes: int,
        retain: int,
        flush_interval: float,
        queue_batches: int = QUEUE_BATCHES,
        lease_ttl: float = LEASE_TTL,
    ) -> None:
        self.lease_ttl = lease_ttl
        self.dest = dest
        self.writer_id = writer_id
        self.segment_bytes = segment_bytes
        self.retain = retain
        self.flush_interval = flush_interval
        self.queue: queue.Queue[tuple[Any, ...]] = queue.Queue(maxsize=queue_batches)
        self.error: BaseException | None = None
        self.detaches = 0
        self.batches = 0
        self.bytes = 0
        self.complete_seq: int | None = None
        self._lock: WriterLock | None = None
        self._sw: SegmentWriter | None = None
        self._next_lsn = 0
        self._known_complete: list[int] = []
        self._complete_event = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=f"persistlog-replica {dest.url}", daemon=True)

    def attach(self) -> None:
        """Take the destination's writer lock and start the thread."""
        try:
            self._take_lock()
        except OSError as e:
            raise DestinationError(f"cannot open secondary {self.dest.url} for writing: {e}") from e
        self._thread.start()

    def _take_lock(self) -> None:
        try:
            self.dest.ensure()
            self._lock = self.dest.lock(self.writer_id, self.lease_ttl)
        except LockHeld as e:
            raise WriterConflict(f"secondary {e}; a destination has one writer at a time") from e

    # -- events from the Log (called under its I/O lock, in LSN order) -------------------

    def start(self, seq: int, first_lsn: int, header_batch: bytes) -> None:
        self.queue.put(("start", seq, first_lsn, header_batch))

    def batch(self, data: bytes, first: int, end: int) -> None:
        self.queue.put(("batch", data, first, end))

    def seal(self) -> None:
        self.queue.put(("seal",))

    def complete(self, seq: int) -> None:
        self.queue.put(("complete", seq))

    def close(self, seal: bool = False, timeout: float | None = 60.0) -> None:
        """Write what is queued (sealing the current log if asked), then stop."""
        if not self._thread.is_alive():
            self._release()
            return
        self.queue.put(("close", seal))
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("secondary %s did not drain within %ss", self.dest.url, timeout)

    def wait_complete(self, seq: int, timeout: float | None = None) -> bool:
        """Wait until log ``seq`` is complete at this destination (False if detached)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._complete_event:
            while (self.complete_seq or 0) < seq:
                if self.error is not None and self._sw is None:
                    return False
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._complete_event.wait(remaining if remaining is not None else 0.5)
        return True

    @property
    def healthy(self) -> bool:
        return self.error is None

    def stats(self) -> dict[str, Any]:
        return {
            "url": self.dest.url,
            "role": "secondary",
            "healthy": self.healthy,
            "attached": self._sw is not None,
            "error": repr(self.error) if self.error else None,
            "queued": self.queue.qsize(),
            "batches": self.batches,
            "bytes": self.bytes,
            "detaches": self.detaches,
            "complete_log": self.complete_seq,
        }

    # -- the thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        last_renew = last_flush = time.monotonic()
        renew_every = self.lease_ttl / 3
        while True:
            # Flush on the interval even while events keep coming: waiting for an idle
            # queue would keep an object store's segments in memory under steady load.
            # Wake for the lease too, whatever the flush interval: a lapsed lease lets
            # another writer in.
            now = time.monotonic()
            wait = max(0.0, last_flush + self.flush_interval - now)
            if self._lock is not None and not self.dest.appendable:
                wait = min(wait, max(0.0, last_renew + renew_every - now))
            try:
                event = self.queue.get(timeout=wait) if wait > 0 else self.queue.get_nowait()
            except queue.Empty:
                event = None
            try:
                if event is not None and event[0] == "close":
                    try:
                        if self._sw is not None:
                            if event[1]:
                                self._seal()
                            else:
                                self._sw.flush()
                    finally:
                        self._release()
                    return
                if event is not None:
                    self._handle(event)
                if time.monotonic() - last_flush >= self.flush_interval:
                    last_flush = time.monotonic()
                    if self._sw is not None:
                        self._sw.flush()
                if self._lock is not None and not self.dest.appendable and time.monotonic() - last_renew >= renew_every:
                    last_renew = time.monotonic()
                    try:
                        self._lock.renew()
                    except LockHeld:
                        # Another writer took the lease over: never write there again
                        # without taking it back first (at the next log's start).
                        self._lock = None
                        raise
            except Exception as e:
                if event is not None and event[0] == "close":
                    log.warning("closing secondary %s failed: %s", self.dest.url, e)
                    self.error = e
                    return
                self._detach(e)

    def _handle(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "start":
            _, seq, first, header_batch = event
            if self._sw is not None:
                self._sw.close()  # the primary seals the old log before starting a new one
                self._sw = None
            if self._lock is None:
                self._take_lock()  # lost or never taken: a secondary is never written unlocked
            if self.error is not None:
                log.info("re-attaching secondary %s with log %d", self.dest.url, seq)
                self.error = None
            started = segment_writer(self.dest, seq, self.segment_bytes)
            started.start(first, header_batch)
            self._sw = started
            self._next_lsn = first
            return
        sw = self._sw
        if sw is None:
            return  # detached, or attached mid-log: wait for the next log to start
        if kind == "batch":
            _, data, first, end = event
            sw.append(data, first, end)
            if sw.dest.appendable or getattr(sw, "pending_bytes", 0) >= self.segment_bytes:
                sw.flush()
            self._next_lsn = end
            self.batches += 1
            self.bytes += len(data)
        elif kind == "seal":
            self._seal()
        elif kind == "complete":
            seq = event[1]
            sw.sync()
            moved = move_pointer(self.dest, seq)
            self._known_complete.append(seq)
            with self._complete_event:
                self.complete_seq = seq
                self._complete_event.notify_all()
            if moved:  # as on the primary: old logs go only after the pointer moved
                apply_retention(self.dest, self._known_complete, self.retain, seq)

    def _seal(self) -> None:
        sw = self._sw
        if sw is None:
            return
        sw.seal(seal_batch(self._next_lsn))
        self._sw = None

    def _detach(self, e: BaseException) -> None:
        self.error = e
        self.detaches += 1
        log.warning("secondary %s detached until the next rotation: %s", self.dest.url, e)
        if self._sw is not None:
            try:
                self._sw.close()
            except Exception:
                pass
            self._sw = None
        with self._complete_event:
            self._complete_event.notify_all()

    def _release(self) -> None:
        if self._lock is not None:
            try:
                self._lock.release()
            except OSError as e:
                log.warning("releasing the writer lock on %s failed: %s", self.dest.url, e)
            self._lock = None
        self.dest.close()

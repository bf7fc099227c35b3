"""The Log: appending records, batching, group commit, failure state and closing.

Two locks split the work. ``_lock`` guards the in-memory batch under construction and the
LSN counter; ``update()`` holds it for an append and nothing more. ``_io_lock`` serialises
everything that touches storage, so batches reach each destination in LSN order. A thread
that needs its record written (``flush``/``fsync`` modes, ``sync=True``, or a full batch)
takes ``_io_lock``; whoever holds it writes *all* records appended so far in one batch.
Threads that queued behind it find their record already covered and return. Threads that
need their record durable go through the group commit (``_group_commit``), which shares
each fsync among all of them.

Interruptions. Only an ``OSError`` from storage fails the Log. Anything else raised in
the middle of a write (a ``KeyboardInterrupt`` in the main thread, ``SystemExit`` from a
signal handler) propagates as itself and leaves the Log consistent: records leave the
buffer in one step into ``_taking`` (a batch detached but not yet with the segment
writer), which is handed over again until the segment writer has it (it ignores LSNs it
holds already, and settles a write the interruption cut short); whatever an interrupted
encode left in the buffer past ``_pos`` is cut before the next append (``_blocked``
sends it down the slow path). Bookkeeping that must happen together is written without
a call in between, where CPython never raises a pending signal's exception.
"""

from __future__ import annotations

import io
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import cbor2

from destinations import Destination, LockHeld, WriterLock

from . import _encoder
from . import _format as F
from ._codec import Codec, check_depth, encode_error
from ._errors import DestinationError, LogClosedError, LogFailedError, PersistLogError, WriterConflict
from ._group_commit import GroupCommit
from ._replicas import Replica
from ._segment_writer import ObjectSegments, SegmentWriter, now_us, seal_batch, segment_writer

log = logging.getLogger("persistlog")

DURABILITY_MODES = ("buffered", "flush", "fsync")
COMPRESSIONS = {None: F.COMPRESSION_NONE, "gzip": F.COMPRESSION_GZIP, "zstd": F.COMPRESSION_ZSTD}


_MAX_RECORD = F.MAX_RECORD_BYTES
_MAX_DEPTH = F.MAX_RECORD_DEPTH
# Record bytes one batch may hold, leaving room for a kind bitmap (at most 1/8 of them).
_BATCH_FILL = F.MAX_BATCH_BYTES // 9 * 8


def _too_large(n: int) -> ValueError:
    return ValueError(f"record of {n} bytes exceeds the {_MAX_RECORD}-byte limit")


# No LSN reaches it: the record-count cut is off.
NEVER = 1 << 62
# Seconds a writer waits for a triggered rotation's switch to the new log; past it the
# writer goes on (into the old log) rather than hang on a storage that stalls.
SWITCH_WAIT = 30.0


def _not_bool(sync: object) -> TypeError:
    return TypeError(f"sync must be True or False, not {sync!r}")


def _array_header_len(n: int) -> int:
    """Bytes of a definite-length CBOR array header for ``n`` items."""
    return 1 if n < 24 else 2 if n < 0x100 else 3 if n < 0x10000 else 5 if n < 0x100000000 else 9



class _Settings:
    """Validated options of one Log."""

    def __init__(
        self,
        *,
        durability: str,
        batch_bytes: int,
        segment_bytes: int,
        flush_interval: float | None,
        compression: str | None,
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, not {durability!r}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be None, 'gzip' or 'zstd', not {compression!r}")
        if compression == "zstd":
            try:
                import zstandard  # noqa: F401
            except ImportError:
                raise ImportError("compression='zstd' needs the zstd extra: pip install 'persistlog[zstd]'") from None
        for name, value, low in (
            ("batch_bytes", batch_bytes, 1),
            ("segment_bytes", segment_bytes, 4096),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, not {value!r}")
        if batch_bytes > F.MAX_BATCH_BYTES // 2:
            raise ValueError(f"batch_bytes must be at most {F.MAX_BATCH_BYTES // 2}")
        if flush_interval is not None and (not isinstance(flush_interval, (int, float)) or flush_interval <= 0):
            raise ValueError(f"flush_interval must be a positive number of seconds or None, not {flush_interval!r}")
        self.durability = durability
        self.batch_bytes = batch_bytes
        self.segment_bytes = segment_bytes
        self.flush_interval = flush_interval
        self.compression = COMPRESSIONS[compression]
        self.compression_name = compression


class LogCore:
    """The write path of a Log at its primary destination (rotation lives in ``_rotation``)."""

    def __init__(
        self,
        dest: Destination,
        settings: _Settings,
        codec: Codec,
        metadata: Any,
    ) -> None:
        self.dest = dest
        self.settings = settings
        self.codec = codec
        self.metadata = metadata
        self.writer_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._encode = codec.encode
        self._lock = threading.Lock()
        self._io_lock = threading.RLock()
        # The group commit's thread must not keep the Log alive: it reaches it weakly.
        ref = weakref.ref(self)

        def sync_through(lsn: int) -> None:
            core = ref()
            if core is None:
                raise LogClosedError("the log was closed")
            core._sync_through(lsn)

        def durable() -> int:
            core = ref()
            return core._durable_lsn if core is not None else 1 << 63

        def check() -> None:
            core = ref()
            if core is not None:
                core._check()

        self._group = GroupCommit(sync_through, durable, check, f"persistlog-sync {dest.url}")
        # Records are encoded straight into one growing buffer (a CBOR sequence), which
        # saves a bytes object per record; _pos is the end of the last whole record.
        self._fp = io.BytesIO()
        self._enc_encode = codec.record_encoder(self._fp)  # returns the buffer's new end
        self._pos = 0
        self._buf_first = F.FIRST_LSN
        self._snap: list[int] = []
        self._batch_bytes = settings.batch_bytes
        self._blocked = False  # failed, closed or interrupted: the slow path sorts it out
        # Records taken out of the buffer for a batch that the segment writer may not hold
        # yet: (payload, snapshot offsets, first LSN, next LSN), and the framed batch.
        self._taking: tuple[bytes, list[int], int, int] | None = None
        self._taking_batch: bytes | None = None
        self._next_lsn = F.FIRST_LSN
        self._written_lsn = F.FIRST_LSN
        self._durable_lsn = F.FIRST_LSN
        self._sw: SegmentWriter | None = None
        self.seq = 0
        self._failed: BaseException | None = None
        self._closed = False
        self._let_go = False  # close() finished: writer, secondaries and lock let go
        self._sync_each = settings.durability == "fsync"
        # update() hands its batch over once its LSN reaches this: at once in flush and
        # fsync modes, else at the record-count trigger's LSN (the rotator arms it), so that
        # a trigger is seen after the batch that crosses it, not at the next timer tick.
        self._eager = settings.durability != "buffered"
        self._cut_lsn = 0 if self._eager else NEVER
        # Held (a plain lock, not an Event: see _wait_for_switch) while a fired trigger
        # holds the writers; released once the new log is started.
        self._switching: threading.Lock | None = None
        self._lock_handle: WriterLock | None = None
        # Figures for stats() and rotation triggers.
        self._counts = {"updates": 0, "snapshot_records": 0, "batches": 0, "bytes": 0, "syncs": 0}
        self._log_update_records = 0
        # Where the current log's ``complete`` record stands, once written: its seal says so.
        self._complete_lsn: int | None = None
        self._after_batch: Callable[[], None] = lambda: None
        self._replicas: list[Replica] = []

    # -- opening ------------------------------------------------------------------------

    def _acquire(self, ttl: float) -> None:
        try:
            self.dest.ensure()
            self._lock_handle = self.dest.lock(self.writer_id, ttl)
        except LockHeld as e:
            raise WriterConflict(f"{e}; a destination has one writer at a time") from e
        except OSError as e:
            raise DestinationError(f"cannot open {self.dest.url} for writing: {e}") from e

    def _renew_lock(self) -> None:
        if self._lock_handle is None:
            return
        try:
            self._lock_handle.renew()
        except LockHeld as e:
            self._fail(WriterConflict(f"lost the writer lease on {self.dest.url}: {e}"))
        except OSError as e:
            log.warning("renewing the writer lease on %s failed: %s", self.dest.url, e)

    def _release(self) -> None:
        if self._lock_handle is not None:
            try:
                self._lock_handle.release()
            except OSError as e:
                log.warning("releasing the writer lock on %s failed: %s", self.dest.url, e)
            self._lock_handle = None

    def _set_position(self, next_lsn: int, last_seq: int) -> None:
        self._next_lsn = self._written_lsn = self._durable_lsn = self._buf_first = next_lsn
        self.seq = last_seq

    # -- appending ----------------------------------------------------------------------

    def _check(self) -> None:
        if self._failed is not None:
            raise LogFailedError(f"the log at {self.dest.url} failed earlier: {self._failed}") from self._failed
        if self._closed:
            raise LogClosedError(f"the log at {self.dest.url} is closed")

    def _unblock(self) -> None:
        """The slow path of an append (holds ``_lock``): raise if failed or closed, else cut
        what an interruption left past ``_pos`` and take the fast path again."""
        self._check()
        self._fp.seek(self._pos)
        self._fp.truncate()
        self._blocked = False
        # _fail() sets _failed before _blocked: whichever order this runs in, it stays set.
        if self._failed is not None or self._closed:
            self._blocked = True

    def update(self, record: Any, sync: bool = False) -> int:
        # One identity test for the usual sync=False (a truthy "yes" must not pass).
        if sync is not False and sync is not True:
            raise _not_bool(sync)
        # _buffer(record, False), inlined: the extra call costs update() about a sixth of
        # its speed (bench: update() against the naive loop), and this is the hot path.
        with self._lock:
            if self._blocked:
                self._unblock()
            pos = self._pos
            try:
                end = self._enc_encode(record)
            except BaseException as e:
                self._blocked = True  # what was encoded of it is cut before the next append
                if isinstance(e, Exception):
                    raise encode_error(e) from None
                raise
            if end <= _MAX_RECORD:
                self._pos = end
                lsn = self._next_lsn
                self._next_lsn = lsn + 1
                data = None
            else:
                self._blocked = True
                data = self._take_back(pos, end)
        if data is not None:
            lsn, end = self._append_encoded([data], snapshot=False)
        if sync or end >= self._batch_bytes or lsn >= self._cut_lsn:
            self._commit(lsn, durable=sync or self._sync_each)
        return lsn

    def _buffer(self, record: Any, snapshot: bool) -> tuple[int, int]:
        """Encode one record into the batch buffer; returns (its LSN, buffered bytes)."""
        staged = self._stage(record, snapshot)
        if isinstance(staged, bytes):
            return self._append_encoded([staged], snapshot)
        return staged

    def _stage(self, record: Any, snapshot: bool) -> tuple[int, int] | bytes:
        """Encode one record into the batch buffer, touching no storage: (its LSN, buffered
        bytes), or the record's bytes when they must go through ``_append_encoded``.

        The hot path: one encode inside a short critical section.
        """
        with self._lock:
            if self._blocked:
                self._unblock()
            pos = self._pos
            try:
                end = self._enc_encode(record)
            except BaseException as e:
                self._blocked = True
                if isinstance(e, Exception):
                    raise encode_error(e) from None
                raise
            if end <= _MAX_RECORD:
                self._pos = end
                lsn = self._next_lsn
                if snapshot:
                    self._snap.append(lsn - self._buf_first)
                self._next_lsn = lsn + 1
                return lsn, end
            # A big record, or a buffer grown past a record's limit: check the size and
            # cut batches on the slow path (the limit is below a batch's).
            self._blocked = True  # cut by the next append if interrupted from here
            return self._take_back(pos, end)

    def _rewind(self, pos: int) -> None:
        """Drop a partly encoded record (or call) so nothing of it is ever written."""
        self._fp.seek(pos)
        self._fp.truncate()

    def _take_back(self, pos: int, end: int) -> bytes:
        """The bytes of a record just encoded at ``pos``, removed from the buffer."""
        data = self._fp.getvalue()[pos:end]
        self._rewind(pos)
        return data

    def _append_encoded(self, records: list[bytes], snapshot: bool, whole: bool = False) -> tuple[int, int]:
        """Append encoded records, cutting batches so none exceeds the format's limit.

        The slow path for big records and big calls: returns (last LSN, buffered bytes).
        Nothing is appended if any record is over the size limit. With ``whole`` the
        records go into one batch (the caller checked they fit in one): what is buffered
        is written first if they do not fit beside it.
        """
        for data in records:
            if len(data) > _MAX_RECORD:
                raise _too_large(len(data))
        need = sum(map(len, records)) if whole else 0
        lsn = end = 0
        i = 0
        while i < len(records):
            with self._lock:
                if self._blocked:
                    self._unblock()
                end = self._pos
                room = end == 0 or end + need <= _BATCH_FILL
                self._blocked = True  # until the records written below are all counted
                while room and i < len(records) and (end == 0 or end + len(records[i]) <= _BATCH_FILL):
                    size = len(records[i])
                    self._fp.write(records[i])
                    end += size
                    self._pos = end
                    if snapshot:
                        self._snap.append(self._next_lsn - self._buf_first)
                    self._next_lsn += 1
                    i += 1
                lsn = self._next_lsn - 1
                self._blocked = False
                if self._failed is not None or self._closed:
                    self._blocked = True
            if i < len(records):
                with self._io_lock:  # make room: what is buffered becomes a batch
                    self._check()
                    self._write_pending(flush=False)
        return lsn, end

    def update_many(self, records: Iterable[Any], sync: bool = False) -> int | None:
        """Append several records as one batch; if any cannot be encoded, or they are more
        than one batch holds, none is appended. None for no records."""
        if sync is not False and sync is not True:
            raise _not_bool(sync)
        items, body = self._encode_many(records)
        if not items:
            return None
        staged = self._stage_many(len(items), body)
        if staged is None:
            # Too big for the buffer as it stands: check each record's size, and write what
            # is buffered first if the call does not fit beside it.
            staged = self._append_encoded([self._encode(item) for item in items], snapshot=False, whole=True)
        lsn, end = staged
        if sync or end >= self._batch_bytes or lsn >= self._cut_lsn:
            self._commit(lsn, durable=sync or self._sync_each)
        return lsn

    def _encode_many(self, records: Iterable[Any]) -> tuple[list[Any], memoryview]:
        """The records of an ``update_many()`` as a list, and their encoded bytes one after
        another; raises before anything is appended."""
        if isinstance(records, (str, bytes, bytearray, memoryview, Mapping)):
            # Each would iterate into characters, ints or keys: never what was meant.
            raise TypeError(
                f"update_many() takes an iterable of records (a list...), not a {type(records).__name__}; "
                "for one record use update()"
            )
        try:
            items = records if isinstance(records, list) else list(records)
        except TypeError:
            raise TypeError(
                f"update_many() takes an iterable of records, not a {type(records).__name__}"
            ) from None
        check_depth(items, limit=_MAX_DEPTH + 1)  # the list is one level more
        # One encoder call for the whole list is much cheaper than one per record: encode
        # it as an array and keep only the items (the array header is 1-9 bytes long).
        try:
            encoded = self._encode(items)
        except Exception as e:
            raise encode_error(e) from None
        body = memoryview(encoded)[_array_header_len(len(items)):]
        if len(body) > _BATCH_FILL:
            # One batch is what a crash keeps or drops whole: a bigger call could be torn.
            raise ValueError(
                f"update_many() of {len(body)} bytes exceeds the {_BATCH_FILL} bytes one batch "
                "holds; split it into smaller calls"
            )
        return items, body

    def _stage_many(self, n: int, body: memoryview) -> tuple[int, int] | None:
        """Append ``n`` encoded records to the batch buffer, touching no storage: (the last
        LSN, buffered bytes), or None when they do not fit beside what is buffered."""
        with self._lock:
            if self._blocked:
                self._unblock()
            end = self._pos + len(body)
            if len(body) > _MAX_RECORD or end > _BATCH_FILL:
                return None
            self._blocked = True
            self._fp.write(body)
            self._pos = end
            self._next_lsn += n
            self._blocked = False
            if self._failed is not None or self._closed:
                self._blocked = True
            return self._next_lsn - 1, end

    def _emit(self, record: Any) -> None:
        """Append a snapshot record (from the enumerate callback)."""
        lsn, end = self._buffer(record, True)
        if end >= self._batch_bytes:
            self._commit(lsn, durable=False)

    # -- writing ------------------------------------------------------------------------

    def _commit(self, lsn: int, durable: bool) -> None:
        """Return once the record at ``lsn`` is written (and durable if asked)."""
        if durable:
            self._group.wait(lsn)
        elif self._written_lsn <= lsn:
            with self._io_lock:
                if self._written_lsn <= lsn:
                    self._check()
                    self._write_pending()
        switching = self._switching
        if switching is not None:
            # A size or count trigger fired: hold the writers who hand batches over until
            # the rotation thread has switched to the new log, so that the old one grows
            # past its trigger by at most the batch buffered meanwhile.
            self._wait_for_switch(switching)

    def _wait_for_switch(self, switching: threading.Lock) -> None:
        # A plain lock, polled: an Event's wait() enters a Condition, whose Python-level
        # __enter__ a KeyboardInterrupt can leave holding its lock, and then the rotation
        # thread's set() would wait for it forever. A waiter interrupted while it holds this
        # one delays the others by one poll at most (the rotator clears _switching first).
        deadline = time.monotonic() + SWITCH_WAIT
        while self._switching is switching and time.monotonic() < deadline:
            if switching.acquire(timeout=0.05):
                switching.release()
                return

    def _sync_through(self, lsn: int) -> None:
        """Make the records up to ``lsn`` durable, with every record appended so far (the
        group commit's sync)."""
        with self._io_lock:
            if self._durable_lsn > lsn:
                return
            # Not before the durable check: a close() that sealed the records made them
            # durable, and their callers must not be told they failed.
            self._check()
            self._write_pending()
            self._sync_primary()

    def _write_pending(self, flush: bool = True) -> None:
        """Frame every appended record into one batch and hand it over. Holds ``_io_lock``."""
        if self._taking is not None:
            self._hand_over(flush)  # an interrupted hand-over: older, so first
        with self._lock:
            if not self._pos:
                if flush and self._sw is not None and self._failed is None:
                    self._guarded(self._sw.flush)
                return
            payload = self._fp.getvalue()
            if len(payload) != self._pos:
                payload = payload[: self._pos]  # an interrupted encode's leftovers
            taking = (payload, self._snap, self._buf_first, self._next_lsn)
            # Out of the buffer and into _taking in one step, then the buffer is cleared
            # (the slow path clears it if this is interrupted).
            self._taking = taking
            self._blocked = True
            self._pos = 0
            self._snap = []
            self._buf_first = taking[3]
            self._rewind(0)
            self._blocked = False
            if self._failed is not None or self._closed:
                self._blocked = True
        self._hand_over(flush)

    def _hand_over(self, flush: bool) -> None:
        """Give the detached batch to the segment writer (and the secondaries)."""
        taking = self._taking
        assert taking is not None
        payload, snaps, first, end = taking
        data = self._taking_batch
        if data is None:
            data = _encoder.record_batch(payload, end - first, snaps, first, now_us(), self.settings.compression)
            self._taking_batch = data
        self._append(data, first, end, flush)
        n_updates = end - first - len(snaps)
        self._taking = None
        self._taking_batch = None
        c = self._counts
        c["updates"] += n_updates
        c["snapshot_records"] += len(snaps)
        self._log_update_records += n_updates
        self._after_batch()

    def _append(self, data: bytes, first: int, end: int, flush: bool = True) -> None:
        sw = self._sw
        assert sw is not None

        def write() -> None:
            sw.append(data, first, end)
            if flush and (not isinstance(sw, ObjectSegments) or sw.pending_bytes >= self.settings.segment_bytes):
                sw.flush()

        self._guarded(write)
        self._written_lsn = end
        c = self._counts
        c["batches"] += 1
        c["bytes"] += len(data)
        for replica in self._replicas:
            replica.batch(data, first, end)

    def _flush_writer(self) -> None:
        """Hand the current segment writer's buffered bytes to storage. Holds ``_io_lock``."""
        if self._sw is not None:
            self._guarded(self._sw.flush)

    def _append_control(self, record: dict[str, Any]) -> None:
        """Write a control batch at the current position. Holds ``_io_lock``."""
        self._write_pending(flush=False)
        pos = self._written_lsn
        self._append(_encoder.control_batch([record], pos, now_us()), pos, pos)
        self._after_batch()

    def _sync_primary(self) -> None:
        sw = self._sw
        assert sw is not None
        self._guarded(sw.sync)
        self._durable_lsn = self._written_lsn
        self._counts["syncs"] += 1

    def _guarded(self, op: Callable[[], None]) -> None:
        """Run a storage operation; an ``OSError`` fails the Log for good. Anything else
        (an interruption) propagates as itself: the segment writer settles what it cut
        short at its next call."""
        try:
            op()
        except OSError as e:
            self._fail(e)
            raise LogFailedError(f"writing to {self.dest.url} failed: {e}") from e

    def _fail(self, e: BaseException) -> None:
        if self._failed is None:
            self._failed = e
            self._blocked = True
            log.error("log at %s failed and refuses further writes: %s", self.dest.url, e)

    # -- log generations ----------------------------------------------------------------

    def _start_log(self, seq: int) -> SegmentWriter:
        """Create log ``seq`` durably and make it the target of every later batch.

        Holds ``_io_lock`` throughout: what was appended before is written (and synced) to
        the old log first, so the old log is complete before its successor exists.
        """
        with self._io_lock:
            self._check()
            old = self._sw
            if old is not None:
                self._write_pending(flush=False)
                self._sync_primary()
            first = self._written_lsn
            header = {
                "t": F.CONTROL_HEADER,
                "v": F.FORMAT_VERSION,
                "seq": seq,
                "first_lsn": first,
                "writer": self.writer_id,
                "created": now_us(),
                "metadata": self.metadata,
            }
            sw = segment_writer(self.dest, seq, self.settings.segment_bytes)
            batch = _encoder.control_batch([header], first, now_us())
            try:
                sw.start(first, batch)
            except FileExistsError as e:
                self._fail(WriterConflict(f"log {seq} already exists at {self.dest.url}: another writer?"))
                raise WriterConflict(f"log {seq} already exists at {self.dest.url}: another writer?") from e
            except BaseException as e:
                self._fail(e)
                raise LogFailedError(f"creating log {seq} at {self.dest.url} failed: {e}") from e
            self._sw = sw
            self.seq = seq
            self._log_update_records = 0
            if old is not None:
                self._seal(old, first)
            self._complete_lsn = None
            for replica in self._replicas:
                if old is not None:
                    replica.seal()
                replica.start(seq, first, batch)
            return sw

    def _seal(self, sw: SegmentWriter, next_lsn: int) -> None:
        complete_lsn = self._complete_lsn
        self._guarded(lambda: sw.seal(seal_batch(next_lsn, complete_lsn)))

    def close(self) -> None:
        """Write what is pending and seal the current log.

        If an interruption (not an ``OSError``) stops it, the Log stays closed to updates
        but holds on to its records, writer and lock: calling it again finishes the job.
        """
        with self._io_lock:
            if self._let_go:
                return
            self._group.stop()
            with self._lock:
                # From here update() raises LogClosedError: every record it accepted before
                # is in the batch written below, none is accepted and then dropped.
                self._closed = True
                self._blocked = True
            try:
                if self._failed is None and self._sw is not None and not self._sw.sealed:
                    self._write_pending(flush=False)
                    self._seal(self._sw, self._written_lsn)
                    self._durable_lsn = self._written_lsn
            except Exception:
                self._let_everything_go()
                raise
            self._let_everything_go()

    def _let_everything_go(self) -> None:
        self._let_go = True
        for replica in self._replicas:
            replica.close(seal=self._failed is None)
        if self._sw is not None:
            try:
                self._sw.close()
            except OSError:
                pass
        self._release()

    @property
    def _current_writer(self) -> SegmentWriter | None:
        return self._sw

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def next_lsn(self) -> int:
        return self._next_lsn

    @property
    def durable_lsn(self) -> int:
        return self._durable_lsn - 1

    def _has_pending(self) -> bool:
        return self._pos > 0 or self._taking is not None


__all__ = ["LogCore", "PersistLogError"]

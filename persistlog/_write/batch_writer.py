"""The batch writer: batches from the buffer to the segment writer, syncs, the flush timer.

A :class:`BatchWriter` owns everything one Log writes to storage: the segment writer of
the log being written (one per log generation, ``_write.segment_writer``), the secondaries'
fan-out, the written and durable LSNs, the group commit (``_write.group_commit``) that shares
each sync among the threads waiting for durability, and the flush timer's state. It also
owns the Log's failed and closed state (:meth:`BatchWriter.check`), since a storage
error is what fails a Log.

Its lock, ``io_lock`` (re-entrant), serialises everything that touches storage, so
batches reach each destination in LSN order. A caller that needs its record written
takes it; whoever holds it writes *all* records appended so far in one batch
(:meth:`BatchWriter.write_pending`), and callers that queued behind it find their record
already covered. The buffer's lock (``_write.batch_buffer``) is only ever taken inside
``io_lock``, never the other way round.

Only an ``OSError`` from storage fails the writer (:meth:`BatchWriter.guarded`); anything
else raised in the middle of a write (a ``KeyboardInterrupt``) propagates as itself: the
detached records, and a control batch (a checkpoint, the completion marker) being handed
over, are handed over again by the next write, to the segment writer (which ignores a
batch it holds already) and to every secondary, before anything newer. Each batch links
to the chain head of the segment writer (``SegmentWriter.head``): the hash of the last
batch it holds, kept with its own bookkeeping, so an interruption anywhere in between
never leaves a batch linking to anything else.

The group commit, and its sync thread, are made when a first caller waits for
durability: a Log in ``buffered`` or local ``flush`` mode never has one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from destinations import Destination

from .._errors import HandedOver, LogClosedError, LogFailedError, WriterConflict
from .._format import encoder
from .._format import constants as F
from .._format.crypt import Keyring
from .._format.shared_values import SharedValues
from .._format.signing import Checkpoints
from .batch_buffer import BatchBuffer, Taking, snapshot_count, snapshot_offsets
from .group_commit import GroupCommit
from .segment_writer import ObjectSegments, SegmentWriter, note_closed, now_us, seal_batch, segment_writer

if TYPE_CHECKING:
    from .._runtime import Job
    from .secondaries import Secondary

logger = logging.getLogger("persistlog")

# Seconds a writer waits for a triggered rotation's switch to the new log; past it the
# writer goes on (into the old log) rather than hang on a storage that stalls.
SWITCH_WAIT = 30.0
# Seconds before a flush that found the I/O lock taken looks again: whoever holds it is
# writing, and a worker of the shared runtime does not wait for one Log's lock.
FLUSH_BUSY_RETRY = 0.01
# Records ``emit.many()`` encodes in one call: big enough to spread a call's cost thin,
# small enough that a chunk of wide records stays near one batch.
EMIT_CHUNK = 1024

# Guards the making of a writer's group commit (once per writer, at its first durable wait).
_making_group = threading.Lock()


class BatchWriter:
    """Writes one Log's batches and syncs them; see the module docstring."""

    __slots__ = (
        "io_lock", "_dest", "_buffer", "_compression", "_keys", "_segment_bytes", "_writer_id", "_metadata",
        "_sync_each", "_sw", "_seq", "_written_lsn", "_durable_lsn", "_failed", "_closed", "_handed_to",
        "_n_updates", "_n_snapshot_records", "_n_batches", "_n_bytes", "_n_syncs", "_log_update_records",
        "_complete_lsn", "_switching", "_secondaries", "_group",
        "_group_stopped", "_on_batch", "_job", "_flush_interval", "flush_armed", "_flush_at", "_chain_start", "_control",
        "_checkpoints", "_shared",
        "__weakref__",
    )

    def __init__(
        self,
        dest: Destination,
        buffer: BatchBuffer,
        *,
        compression: int,
        keys: Keyring | None = None,
        segment_bytes: int,
        sync_each: bool,
        writer_id: str,
        metadata: Any,
        last_seq: int,
        job: Job,
        flush_interval: float,
        chain_head: bytes | None = None,
        checkpoints: Checkpoints | None = None,
        share_values: bool = True,
    ) -> None:
        """A writer of ``buffer``'s records to ``dest``, which holds logs up to ``last_seq``.
        With ``sync_each`` every write waits for durability (``fsync`` mode, and ``flush``
        mode on an object store, where a batch reaches storage only with a PUT). ``job`` is
        the Log's background job, run ``flush_interval`` seconds after data gets pending.
        ``chain_head`` is where the hash chain of log ``last_seq`` ends (None: the logs
        written are not chained); ``checkpoints`` signs it. A chained log is written in
        format version 3, whose snapshot records store a large value they repeat once
        (unless not ``share_values``: version 2)."""
        self.io_lock = threading.RLock()
        self._dest = dest
        self._buffer = buffer
        self._compression = compression
        self._keys = keys
        self._segment_bytes = segment_bytes
        self._writer_id = writer_id
        self._metadata = metadata
        self._sync_each = sync_each
        self._sw: SegmentWriter | None = None
        self._seq = last_seq
        first = buffer.next_lsn
        self._written_lsn = first
        self._durable_lsn = first
        self._failed: BaseException | None = None
        self._closed = False
        self._handed_to: str | None = None  # the writer the log was handed over to
        # Figures for stats() and rotation triggers (fields, not a dict: one per open Log).
        self._n_updates = self._n_snapshot_records = self._n_batches = self._n_bytes = self._n_syncs = 0
        self._log_update_records = 0
        # Where the current log's ``complete`` record stands, once written: its seal says so.
        self._complete_lsn: int | None = None
        # Held (a plain lock, not an Event: see _wait_for_switch) while a fired trigger
        # holds the writers; released once the new log is started.
        self._switching: threading.Lock | None = None
        self._secondaries: list[Secondary] = []
        self._group: GroupCommit | None = None
        self._group_stopped = False
        self._on_batch: Callable[[], None] | None = None
        self._job = job
        self._flush_interval = flush_interval
        #: Whether a flush is due at ``_flush_at`` (pending data arms it). Read by the
        #: fronts' hot paths as a plain attribute; written by this class only.
        self.flush_armed = False
        self._flush_at = 0.0
        # Each batch framed links to the one before it (the hash chain, FORMAT.md): to the
        # segment writer's head, and before the first log to where the logs before end.
        if chain_head is not None and len(chain_head) != F.LINK_SIZE:
            raise ValueError(f"a chain head is {F.LINK_SIZE} bytes, not {len(chain_head)}")
        self._chain_start = chain_head
        # A control batch being handed over, and the LSN due there: handed over again by
        # the next write when an interruption cut it short.
        self._control: tuple[bytes, int] | None = None
        self._checkpoints = checkpoints or Checkpoints(None, 0.0)
        # The values the current log shares (chained logs, format version 3), and the
        # large values of the snapshot records staged: only under ``io_lock``.
        self._shared = SharedValues() if chain_head is not None and share_values else None

    # -- state ----------------------------------------------------------------------------

    @property
    def dest(self) -> Destination:
        return self._dest

    @property
    def seq(self) -> int:
        """The seq of the log being written."""
        return self._seq

    @property
    def written_lsn(self) -> int:
        """The first LSN not yet handed to the segment writer."""
        return self._written_lsn

    @property
    def durable_lsn(self) -> int:
        """The first LSN not yet durable."""
        return self._durable_lsn

    @property
    def sync_each(self) -> bool:
        """Whether every write waits for durability."""
        return self._sync_each

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def handed_to(self) -> str | None:
        return self._handed_to

    @property
    def current(self) -> SegmentWriter | None:
        """The segment writer of the log being written (None before the first log)."""
        return self._sw

    @property
    def log_update_records(self) -> int:
        """Updates (not snapshot records) written to the current log."""
        return self._log_update_records

    @property
    def secondaries(self) -> list[Secondary]:
        """The secondaries every batch goes to (a copy)."""
        return list(self._secondaries)

    def counts(self) -> dict[str, int]:
        """Records, batches, bytes and syncs written so far."""
        return {"updates": self._n_updates, "snapshot_records": self._n_snapshot_records,
                "batches": self._n_batches, "bytes": self._n_bytes, "syncs": self._n_syncs}

    def check(self) -> None:
        """Raise the Log's failed or closed state (:class:`LogFailedError`,
        :class:`HandedOver`, :class:`LogClosedError`)."""
        if self._failed is not None:
            raise LogFailedError(f"the log at {self._dest.url} failed earlier: {self._failed}") from self._failed
        if self._closed:
            if self._handed_to is not None:
                raise HandedOver(
                    f"the log at {self._dest.url} was handed over to {self._handed_to}; every update "
                    "acknowledged before is in the log it restored",
                    self._handed_to,
                )
            raise LogClosedError(f"the log at {self._dest.url} is closed")

    def watch_batches(self, on_batch: Callable[[], None]) -> None:
        """Call ``on_batch()`` after each batch is written (the rotator's trigger checks)."""
        self._on_batch = on_batch

    def add_secondary(self, secondary: Secondary) -> None:
        with self.io_lock:
            self._secondaries.append(secondary)

    def remove_secondary(self, url: str) -> Secondary:
        """Stop writing to the secondary at ``url``; ValueError if there is none."""
        with self.io_lock:
            for secondary in self._secondaries:
                if secondary.dest.url == url:
                    self._secondaries.remove(secondary)
                    return secondary
        raise ValueError(f"{url} is not a secondary destination of this log")

    def secondaries_complete(self, seq: int, complete_lsn: int) -> None:
        """Log ``seq`` is complete at ``complete_lsn``: tell the secondaries."""
        for secondary in list(self._secondaries):
            secondary.complete(seq, complete_lsn)

    # -- appending through the slow paths -------------------------------------------------

    def append_encoded(self, records: list[bytes], snapshot: bool, whole: bool = False) -> tuple[int, bool]:
        """:meth:`BatchBuffer.append_encoded`, writing what is buffered when the records
        need the room; the flush is armed."""
        staged = self._buffer.append_encoded(records, snapshot, whole, self._make_room)
        self.arm_flush()
        return staged

    def append_whole(self, items: list[Any]) -> tuple[int, bool]:
        """Append the records of an ``update_many()`` that do not fit beside what is
        buffered, as one batch (what is buffered is written first)."""
        encode = self._buffer.encode
        return self.append_encoded([encode(item) for item in items], False, whole=True)

    def waits(self, due: bool, sync: bool | None) -> bool:
        """The hand-over rule, once for every front: whether a call that appended a record
        waits for it to be written (``due``: the buffer's cut rule says so), durable if
        ``sync`` (or every write, :attr:`sync_each`); if not, its record goes out with the
        next flush, armed here."""
        if sync or due:
            return True
        if not self.flush_armed:
            self.arm_flush()
        return False

    def appended(self, lsn: int, due: bool, sync: bool) -> None:
        """A thread's call appended up to ``lsn``: return once :meth:`waits` is met."""
        if self.waits(due, sync):
            self.commit(lsn, durable=sync or self._sync_each)

    def emit(self, record: Any) -> None:
        """Append a snapshot record (from the enumerate callback)."""
        shared = self._shared
        if shared is None or shared.passes_over():
            staged = self._buffer.fast_stage(record, True)
        else:
            # Staged and hinted with no batch framed in between (framing holds io_lock).
            with self.io_lock:
                staged = self._buffer.fast_stage(record, True)
                if not isinstance(staged, bytes):
                    shared.hint(staged if isinstance(staged, int) else staged[0], (record,))
        if type(staged) is int:  # the usual case: buffered (staged() inlined)
            if not self.flush_armed:
                self.arm_flush()
            return
        lsn, full = self.staged(staged, True)
        if full:
            self.commit(lsn, durable=False)
        elif not self.flush_armed:
            self.arm_flush()

    def staged(self, staged: int | tuple[int] | bytes, snapshot: bool = False) -> tuple[int, bool]:
        """What :meth:`BatchBuffer.stage` returned, as (LSN, whether the call hands the batch
        over): a record it left for the slow path is appended here (which may write)."""
        if isinstance(staged, int):
            return staged, False
        if isinstance(staged, tuple):
            return staged[0], True
        return self.append_encoded([staged], snapshot)

    def emit_many(self, records: list[Any]) -> None:  # the list from records_list()
        """Append snapshot records at ``update_many()``'s cost per record (from
        ``emit.many``): encoded a chunk at a time, each chunk in one call; a record that
        cannot be encoded raises before anything of its chunk is appended."""
        buffer = self._buffer
        for i in range(0, len(records), EMIT_CHUNK):
            chunk = records if len(records) <= EMIT_CHUNK else records[i : i + EMIT_CHUNK]
            try:
                _, body = buffer.encode_many(chunk)
            except ValueError:
                # Too deep, or more than one batch holds: one record at a time says which.
                for record in chunk:
                    self.emit(record)
                continue
            shared = self._shared
            if shared is None or shared.passes_over():
                staged = buffer.stage_many(len(chunk), body, snapshot=True)
            else:
                with self.io_lock:
                    staged = buffer.stage_many(len(chunk), body, snapshot=True)
                    if staged is not None:
                        shared.hint(staged[0] - len(chunk) + 1, chunk, body)
            if staged is None:
                staged = self.append_encoded([buffer.encode(item) for item in chunk], snapshot=True)
            elif not self.flush_armed:
                self.arm_flush()
            lsn, full = staged
            if full:
                self.commit(lsn, durable=False)

    def _make_room(self) -> None:
        """What is buffered becomes a batch (a slow-path append needs the room)."""
        with self.io_lock:
            self.check()
            self.write_pending(flush=False)

    # -- writing --------------------------------------------------------------------------

    def commit(self, lsn: int, durable: bool) -> None:
        """Return once the record at ``lsn`` is written (and durable if asked)."""
        if durable:
            group = self._group
            if group is None:
                group = self._make_group()
            group.wait(lsn)
        elif self._written_lsn <= lsn:
            with self.io_lock:
                if self._written_lsn <= lsn:
                    self.check()
                    self.write_pending()
        switching = self._switching
        if switching is not None:
            # A size or count trigger fired: hold the writers who hand batches over until
            # the rotation job has switched to the new log, so that the old one grows
            # past its trigger by at most the batch buffered meanwhile.
            self._wait_for_switch(switching)

    def sync(self) -> None:
        """Make every record appended so far durable."""
        with self.io_lock:
            self.check()
            self.write_pending()
            self.sync_primary()

    def sync_through(self, lsn: int) -> None:
        """Make the records up to ``lsn`` durable, with every record appended so far (the
        group commit's sync)."""
        with self.io_lock:
            if self._durable_lsn > lsn:
                return
            # Not before the durable check: a close() that sealed the records made them
            # durable, and their callers must not be told they failed.
            self.check()
            self.write_pending()
            self.sync_primary()

    def write_pending(self, flush: bool = True) -> None:
        """Frame every appended record into one batch and hand it over. Holds ``io_lock``."""
        buffer = self._buffer
        if buffer.taking is not None:
            self._hand_over(flush)  # an interrupted hand-over: older, so first
        if self._control is not None:
            self._hand_over_control(*self._control, flush)  # an interrupted control batch
        if not buffer.detach():
            if flush and self._sw is not None and self._failed is None:
                self.guarded(self._sw.flush)
            return
        self._hand_over(flush)

    @property
    def _head(self) -> bytes | None:
        """What the next batch links to: the head of what the segment writer holds (None:
        not chained)."""
        sw = self._sw
        return self._chain_start if sw is None else sw.head

    def _frame(self, taking: Taking) -> bytes:
        payload, snaps, first, end = taking
        shared = self._shared
        share = None if shared is None or not snaps else (lambda raw: shared.share(raw, first, end))
        return encoder.record_batch(payload, end - first, snapshot_offsets(snaps), first, now_us(), self._compression,
                                     self._head, self._keys, share)

    def _hand_over(self, flush: bool) -> None:
        """Give the detached batch to the segment writer (and the secondaries)."""
        buffer = self._buffer
        taking = buffer.taking
        assert taking is not None
        _, snaps, first, end = taking
        data = buffer.framed(self._frame)
        try:
            self._append(data, first, end, flush)
        except BaseException:
            self.arm_flush()  # an interrupted hand-over is handed over again by the next flush
            raise
        n_snaps = snapshot_count(snaps)
        n_updates = end - first - n_snaps
        buffer.handed_over()
        if self._shared is not None:
            self._shared.handed_over(end)
        self._count_batch(data)
        self._n_updates += n_updates
        self._n_snapshot_records += n_snaps
        self._log_update_records += n_updates
        self._checkpoint(end, flush)
        if self._on_batch is not None:
            self._on_batch()

    def _hand_over_control(self, batch: bytes, pos: int, flush: bool = True) -> None:
        """Give a control batch (it takes no LSN; due at ``pos``) to the segment writer and
        the secondaries; an interruption leaves it to the next write to hand over again."""
        self._control = (batch, pos)
        try:
            self._append(batch, pos, pos, flush)
        except BaseException:
            if self._failed is None:
                self.arm_flush()
            raise
        self._control = None
        self._count_batch(batch)

    def _count_batch(self, data: bytes) -> None:
        """Count a batch once its hand-over is settled: one an interruption cut short is
        handed over again, and counted then, once."""
        self._n_batches += 1
        self._n_bytes += len(data)

    def _checkpoint(self, lsn: int, flush: bool) -> None:
        """A signed checkpoint after the batch handed over last, when one is due."""
        checkpoint = self._checkpoints.due(self._seq, lsn, self._head)
        if checkpoint is not None:
            self._hand_over_control(checkpoint, lsn, flush)

    def _append(self, data: bytes, first: int, end: int, flush: bool = True) -> None:
        sw = self._sw
        assert sw is not None

        def write() -> None:
            sw.append(data, first, end)
            if flush and (not isinstance(sw, ObjectSegments) or sw.pending_bytes >= self._segment_bytes):
                sw.flush()

        self.guarded(write)
        self._written_lsn = end
        for secondary in self._secondaries:
            secondary.batch(data, first, end)
        if not flush or isinstance(sw, ObjectSegments):
            self.arm_flush()  # bytes the writer may still hold go out at the next flush

    def append_control(self, record: dict[str, Any]) -> None:
        """Write a control batch at the current position. Holds ``io_lock``."""
        self.write_pending(flush=False)
        pos = self._written_lsn
        self._hand_over_control(encoder.control_batch([record], pos, now_us(), self._head), pos)
        self._checkpoint(pos, True)
        if self._on_batch is not None:
            self._on_batch()

    def sync_primary(self) -> None:
        sw = self._sw
        assert sw is not None
        self.guarded(sw.sync)
        self._durable_lsn = self._written_lsn
        self._n_syncs += 1

    def guarded(self, op: Callable[[], None]) -> None:
        """Run a storage operation; an ``OSError`` fails the Log for good. Anything else
        (an interruption) propagates as itself: the segment writer settles what it cut
        short at its next call."""
        try:
            op()
        except FileExistsError as e:
            # The segment name this writer takes next is taken: a writer that took the
            # destination over fenced this log. Nothing of this write is acknowledged.
            conflict = WriterConflict(f"another writer took {self._dest.url} over (its lease ran out?): {e}")
            self.fail(conflict)
            raise LogFailedError(f"writing to {self._dest.url} failed: {conflict}") from conflict
        except OSError as e:
            self.fail(e)
            raise LogFailedError(f"writing to {self._dest.url} failed: {e}") from e

    def fail(self, e: BaseException) -> None:
        """Fail the Log for good: every later call raises :class:`LogFailedError`."""
        if self._failed is None:
            self._failed = e
            self._buffer.refuse(self.check)
            logger.error("log at %s failed and refuses further writes: %s", self._dest.url, e)

    def _make_group(self) -> GroupCommit:
        with _making_group:
            group = self._group
            if group is None:
                group = GroupCommit(self.sync_through, self._durable, self.check, f"persistlog-sync {self._dest.url}")
                if self._group_stopped:
                    group.stop()
                self._group = group
            return group

    def _durable(self) -> int:
        return self._durable_lsn

    # -- log generations ------------------------------------------------------------------

    def start_log(self, seq: int) -> SegmentWriter:
        """Create log ``seq`` durably and make it the target of every later batch.

        Holds ``io_lock`` throughout: what was appended before is written (and synced) to
        the old log first, so the old log is complete before its successor exists.
        """
        with self.io_lock:
            self.check()
            old = self._sw
            if old is not None:
                self.write_pending(flush=False)
                self.sync_primary()
            first = self._written_lsn
            header = {
                "t": F.CONTROL_HEADER,
                "v": (F.FORMAT_VERSION if self._head is None
                      else F.CHAINED_VERSION if self._shared is None else F.SHARED_VERSION),
                "seq": seq,
                "first_lsn": first,
                "writer": self._writer_id,
                "created": now_us(),
                "metadata": self._metadata,
            }
            sw = segment_writer(self._dest, seq, self._segment_bytes)
            old_head = self._head
            batch = encoder.control_batch([header], first, now_us(), old_head)
            try:
                sw.start(first, batch)
            except FileExistsError as e:
                self.fail(WriterConflict(f"log {seq} already exists at {self._dest.url}: another writer?"))
                raise WriterConflict(f"log {seq} already exists at {self._dest.url}: another writer?") from e
            except BaseException as e:
                self.fail(e)
                if isinstance(e, KeyboardInterrupt):
                    # On the opening thread (the open's first log): as
                    # itself. The open lets the failed Log go; what is on storage is what a
                    # crash there leaves, which the next open reads.
                    raise
                raise LogFailedError(f"creating log {seq} at {self._dest.url} failed: {e}") from e
            self._sw = sw
            self._seq = seq
            if self._shared is not None:
                self._shared.reset()
            self._log_update_records = 0
            if old is not None:
                self._seal(old, first, old_head)
            self._complete_lsn = None
            for secondary in self._secondaries:
                if old is not None:
                    secondary.seal()
                secondary.start(seq, first, batch)
            return sw

    def complete_log(self, emitted: int) -> tuple[int, int]:
        """Write the current log's ``complete`` record (``emitted`` snapshot records) and
        make it durable: its seal will say so. Returns the LSN due there and the log's
        bytes so far."""
        with self.io_lock:
            self.check()
            self.append_control({"t": F.CONTROL_COMPLETE, "records": emitted})
            complete_lsn = self._complete_lsn = self._written_lsn  # control batches take no LSN
            self.sync_primary()
            sw = self._sw
            return complete_lsn, sw.bytes_written if sw is not None else 0

    def seal_signature(self, seq: int, next_lsn: int, head: bytes | None) -> dict[str, Any]:
        """What a seal of log ``seq`` ending at ``next_lsn`` and ``head`` adds when this
        writer signs (a secondary's seal too): the key id and signature; else nothing."""
        return self._checkpoints.seal_fields(seq, next_lsn, head)

    def _seal(self, sw: SegmentWriter, next_lsn: int, chain: bytes | None = None) -> None:
        """Seal ``sw``'s log, whose chain ends at ``chain`` (None: the chain head now)."""
        complete_lsn = self._complete_lsn
        head = self._head if chain is None else chain
        signed = self.seal_signature(sw.seq, next_lsn, head)
        self.guarded(lambda: sw.seal(seal_batch(next_lsn, complete_lsn, head, signed)))

    # -- holding writers while a trigger switches logs ------------------------------------

    def hold_writers_for_switch(self) -> None:
        """A size or count trigger fired: writers handing batches over wait (see
        :meth:`commit`) until :meth:`release_writers_held_for_switch`."""
        switching = threading.Lock()
        switching.acquire()
        self._switching = switching

    def release_writers_held_for_switch(self) -> None:
        """The new log is started (or will not be): let the held writers go."""
        switching, self._switching = self._switching, None
        if switching is not None:
            try:
                switching.release()
            except RuntimeError:
                pass  # two threads swapped it out at once: the other released it

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

    # -- the flush timer ------------------------------------------------------------------

    def arm_flush(self) -> None:
        """Flush what is pending one flush interval from now, unless a flush is armed
        already: called when the Log gets pending data (records buffered, bytes a segment
        writer holds), so that nothing runs for a Log with none."""
        if self.flush_armed:
            return
        at = self._flush_at = time.monotonic() + self._flush_interval
        # Scheduled, then marked armed: an interruption in between leaves it unarmed, and
        # the next append (or the job itself, finding records pending) arms it again.
        self._job.run_at(at)
        self.flush_armed = True

    def flush_due(self, now: float) -> None:
        """The flush timer's work, from the Log's background job: the armed flush when
        due, or an arming an interruption cut short."""
        if self.flush_armed:
            if now >= self._flush_at - 1e-3:
                self._flush_pending()
        elif self._pending():
            self.arm_flush()

    def next_flush(self) -> float | None:
        """When the armed flush is due (None: none is armed)."""
        return self._flush_at if self.flush_armed else None

    def _flush_pending(self) -> None:
        """The armed flush: pending records and an object store's pending segment go out,
        however busy the log is. Never waits for ``io_lock``: its holder is writing."""
        if not self.io_lock.acquire(blocking=False):
            self._flush_at = time.monotonic() + FLUSH_BUSY_RETRY
            return
        try:
            if self._failed is None and not self._closed:
                self.write_pending(flush=False)
                if self._sw is not None:
                    self.guarded(self._sw.flush)
        finally:
            self.io_lock.release()
        # Disarmed after the flush, then checked: a record appended meanwhile by a thread
        # that still saw the flush armed is pending here, and arms the next one.
        self.flush_armed = False
        if self._pending():
            self.arm_flush()

    def _pending(self) -> bool:
        sw = self._sw
        return self._buffer.pending or self._control is not None or (sw is not None and sw.holds_pending)

    # -- closing --------------------------------------------------------------------------

    def handed_over_to(self, by: str) -> None:
        """The log is being handed over to the writer ``by``: closed calls say so."""
        self._handed_to = by

    def stop_group(self) -> None:
        """Let the group commit's sync thread end (closing)."""
        with _making_group:
            self._group_stopped = True
            group = self._group
        if group is not None:
            group.stop()

    def close_to_updates(self) -> None:
        """From here appends raise :class:`LogClosedError`: every record accepted before is
        in the batch written at the seal, none is accepted and then dropped."""
        self._buffer.refuse(self.check, self._mark_closed)

    def _mark_closed(self) -> None:
        self._closed = True

    def seal(self) -> None:
        """Write what is pending and seal the current log (closing; holds ``io_lock``)."""
        sw = self._sw
        if self._failed is None and sw is not None and not sw.sealed:
            self.write_pending(flush=False)
            self._seal(sw, self._written_lsn)
            self.guarded(sw.confirm)
            self._durable_lsn = self._written_lsn
            note_closed(self._dest, self._seq, self._written_lsn)

    def let_go(self) -> None:
        """Close the secondaries (sealing them unless failed) and the segment writer."""
        for secondary in self._secondaries:
            secondary.close(seal=self._failed is None)
        if self._sw is not None:
            try:
                self._sw.close()
            except OSError:
                pass

    def refuse_after_failure(self) -> None:
        """Raise ``LogFailedError`` from the close of a failed Log that accepted records
        without waiting for their durability (``buffered`` mode, ``flush`` mode locally)
        and cannot make them durable now: the promise of a clean close is broken, and
        they may be missing from storage. Where every acknowledgement waited for
        durability (``fsync``; ``flush`` on an object store) the failure cost nothing
        acknowledged, and the close returns."""
        first, end = self._durable_lsn, self._buffer.next_lsn
        if self._failed is None or self._sync_each or first >= end:
            return
        raise LogFailedError(
            f"the log at {self._dest.url} failed earlier ({self._failed}): records {first}..{end - 1} it "
            f"accepted are not known to be durable, and may be missing from storage"
        ) from self._failed


__all__ = ["EMIT_CHUNK", "FLUSH_BUSY_RETRY", "SWITCH_WAIT", "BatchWriter"]

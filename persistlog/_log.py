"""The Log: one log being written, from ``update()`` to sealed segments at each destination.

:class:`Log` is one class, in sections: its public API; appending records to the batch
buffer; writing batches; log generations; secondaries; the writer lease; closing; the
background work. It composes a :class:`~persistlog._rotation.Rotator` (the triggers and
the rotation job), a :class:`~persistlog._group_commit.GroupCommit` (fsyncs shared by
waiting threads), one segment writer per log (``_segment_writer``) and one
:class:`~persistlog._secondaries.Secondary` per secondary destination. ``persistlog.open``
(``_api``) checks the options, takes the writer lock, restores, and builds the Log.
Its background work (flushes, the lease, the interval and signal triggers) and its
rotations run as jobs on the process's runtime (``_runtime``), shared by every Log: an
open Log has no thread of its own, and an idle one schedules nothing.

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
import signal
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from types import FrameType, TracebackType
from typing import Any, Union

from destinations import Destination, LockHeld, WriterLock, destination_url, open_destination

from . import _encoder, _exit
from . import _format as F
from ._chain import Chain
from ._codec import Codec, check_depth, encode_error, records_list
from ._crypt import Keyring
from ._errors import DestinationError, HandedOver, LogClosedError, LogFailedError, PersistLogError, WriterConflict
from ._group_commit import GroupCommit
from ._handover import HandoverRequest, HandoverWatch
from ._restore import RestoreResult
from ._retention import Retention
from ._rotation import NEVER, EnumerateAll, Hold, Rotator
from ._runtime import runtime, weak_method
from ._secondaries import ATTACH_WAIT, Secondary, SecondaryLag
from ._segment_writer import ObjectSegments, SegmentWriter, note_closed, now_us, seal_batch, segment_writer
from ._signing import Checkpoints

log = logging.getLogger("persistlog")

DURABILITY_MODES = ("buffered", "flush", "fsync")
COMPRESSIONS = {None: F.COMPRESSION_NONE, "gzip": F.COMPRESSION_GZIP, "zstd": F.COMPRESSION_ZSTD}
LOCAL_FLUSH_INTERVAL = 0.1
# Seconds before a flush that found the Log's I/O lock taken looks again: whoever holds
# it is writing, and a worker of the shared runtime does not wait for one Log's lock.
FLUSH_BUSY_RETRY = 0.01

_MAX_RECORD = F.MAX_RECORD_BYTES
_MAX_DEPTH = F.MAX_RECORD_DEPTH
# Record bytes one batch may hold, leaving room for a kind bitmap (at most 1/8 of them).
_BATCH_FILL = F.MAX_BATCH_BYTES // 9 * 8
# Records ``emit.many()`` encodes in one call: big enough to spread a call's cost thin,
# small enough that a chunk of wide records stays near one batch.
_EMIT_CHUNK = 1024

# Seconds a writer waits for a triggered rotation's switch to the new log; past it the
# writer goes on (into the old log) rather than hang on a storage that stalls.
SWITCH_WAIT = 30.0
# Seconds a call told that the log was handed over waits for the close under way to seal it.
HANDOVER_SEAL_WAIT = 60.0

#: A secondary destination as ``open(secondaries=...)`` takes it: a URL, or a
#: ``(url, storage_options)`` pair.
SecondaryEntry = Union[str, "os.PathLike[str]", tuple[Union[str, "os.PathLike[str]"], Union[dict[str, Any], None]]]


def _too_large(n: int) -> ValueError:
    return ValueError(f"record of {n} bytes exceeds the {_MAX_RECORD}-byte limit")


def _not_bool(sync: object) -> TypeError:
    return TypeError(f"sync must be True or False, not {sync!r}")


def _array_header_len(n: int) -> int:
    """Bytes of a definite-length CBOR array header for ``n`` items."""
    return 1 if n < 24 else 2 if n < 0x100 else 3 if n < 0x10000 else 5 if n < 0x100000000 else 9


def destination_at(url: str | os.PathLike[str], storage_options: dict[str, Any] | None) -> Destination:
    """The destination at ``url``, with ``storage_options`` checked to be a dict."""
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options must be a dict, not {type(storage_options).__name__}")
    return open_destination(url, **(storage_options or {}))


def release_writer_lock(handle: WriterLock, url: str) -> None:
    """Let go of a destination's writer lock; a failure is logged, not raised."""
    try:
        handle.release()
    except OSError as e:
        log.warning("releasing the writer lock on %s failed: %s", url, e)


class LogSettings:
    """Validated write options of one Log."""

    def __init__(
        self,
        *,
        durability: str,
        batch_bytes: int,
        segment_bytes: int,
        flush_interval: float | None,
        compression: str | None,
        keys: Keyring | None = None,
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
        #: The keys record batches are sealed with (None: not encrypted).
        self.keys = keys


class Log:
    """A log being written. Build it with :func:`persistlog.open`.

    ``update()`` appends one record, ``update_many()`` several at once; ``sync()`` makes all
    of them durable; ``rotate()`` starts a fresh log with a new enumeration; ``close()``
    writes what is pending and seals the log. A Log is safe to use from many threads.
    One left open is closed at the interpreter's exit (or, with a ``ResourceWarning``,
    once it is collected); ``restored`` is what ``open(..., replay=...)`` restored.
    """

    def __init__(
        self,
        dest: Destination,
        enumerate_all: EnumerateAll,
        *,
        settings: LogSettings,
        codec: Codec,
        metadata: Any,
        writer_id: str,
        writer_lock: WriterLock,
        lease_ttl: float,
        last_seq: int,
        next_lsn: int,
        complete_logs: list[int],
        rotate_bytes: int | None,
        rotate_records: int | None,
        rotate_interval: float | None,
        retention: Retention,
        on_error: Callable[[BaseException], None] | None,
        secondaries: Sequence[SecondaryEntry],
        rotate_on_signal: int | None,
        restored: RestoreResult | None,
        after_snapshot: bool = False,
        concurrent_enumeration: bool = False,
        secondary_close_wait: float | None = None,
        handover: bool = False,
        on_handover: Callable[[], Any] | None = None,
        chain_head: bytes | None = None,
        checkpoints: Checkpoints | None = None,
    ) -> None:
        """Open the log: start its threads and secondaries, write its first complete log.

        ``writer_lock`` is held already (taken with ``writer_id``); the logs at ``dest``
        end with log ``last_seq`` before LSN ``next_lsn``, and ``complete_logs`` are the
        complete ones among them. With ``after_snapshot`` (log ``last_seq`` holds a fresh
        snapshot and nothing after it, just replayed) the first log starts after it
        without an enumeration. ``close()`` waits up to ``secondary_close_wait`` seconds
        (default: ``lease_ttl`` plus :data:`ATTACH_WAIT`) for a secondary to answer. With
        ``handover`` the Log hands itself over when another process asks (``on_handover``
        called first). ``chain_head`` is where the hash chain of log ``last_seq`` ends
        (None: the logs written are not chained); ``checkpoints`` signs it. On failure
        everything is let go (the lock too) and the error is raised.
        """
        self.dest = dest
        self._chain = Chain(chain_head)
        self._checkpoints = checkpoints or Checkpoints(None, 0.0)
        self.settings = settings
        self.codec = codec
        self.metadata = metadata
        self.writer_id = writer_id
        #: What ``open(..., replay=...)`` restored before opening (None without ``replay``).
        self.restored = restored
        self._encode = codec.encode
        self._lock = threading.Lock()
        self._io_lock = threading.RLock()
        # The group commit's thread must not keep the Log alive: it reaches it weakly.
        ref = weakref.ref(self)

        def sync_through(lsn: int) -> None:
            lg = ref()
            if lg is None:
                raise LogClosedError("the log was closed")
            lg._sync_through(lsn)

        def durable() -> int:
            lg = ref()
            return lg._durable_lsn if lg is not None else 1 << 63

        def check() -> None:
            lg = ref()
            if lg is not None:
                lg._check()

        self._group = GroupCommit(sync_through, durable, check, f"persistlog-sync {dest.url}")
        # Records are encoded straight into one growing buffer (a CBOR sequence), which
        # saves a bytes object per record; _pos is the end of the last whole record.
        self._fp = io.BytesIO()
        self._enc_encode = codec.record_encoder(self._fp)  # returns the buffer's new end
        self._pos = 0
        self._buf_first = next_lsn
        self._snap: list[int] = []
        self._batch_bytes = settings.batch_bytes
        self._blocked = False  # failed, closed or interrupted: the slow path sorts it out
        # Records taken out of the buffer for a batch that the segment writer may not hold
        # yet: (payload, snapshot offsets, first LSN, next LSN), and the framed batch.
        self._taking: tuple[bytes, list[int], int, int] | None = None
        self._taking_batch: bytes | None = None
        self._next_lsn = next_lsn
        self._written_lsn = next_lsn
        self._durable_lsn = next_lsn
        self._sw: SegmentWriter | None = None
        self._seq = last_seq
        self._failed: BaseException | None = None
        self._closed = False
        self._let_go = False  # the writer, secondaries and lock were let go
        # On an object store a batch reaches storage only with the PUT of a segment object:
        # there flush mode waits for that PUT as fsync mode does, through the group commit
        # (concurrent callers share one PUT), so that it survives a process crash.
        self._sync_each = settings.durability == "fsync" or (settings.durability == "flush" and not dest.appendable)
        # update() hands its batch over once its LSN reaches this: at once in flush and
        # fsync modes, else at the record-count trigger's LSN (the rotator arms it), so that
        # a trigger is seen after the batch that crosses it, not at the next timer tick.
        self._eager = settings.durability != "buffered"
        self._cut_lsn = 0 if self._eager else NEVER
        # Held (a plain lock, not an Event: see _wait_for_switch) while a fired trigger
        # holds the writers; released once the new log is started.
        self._switching: threading.Lock | None = None
        self._lock_handle: WriterLock | None = writer_lock
        self._lease_ttl = lease_ttl
        # Figures for stats() and rotation triggers.
        self._counts = {"updates": 0, "snapshot_records": 0, "batches": 0, "bytes": 0, "syncs": 0}
        self._log_update_records = 0
        # Where the current log's ``complete`` record stands, once written: its seal says so.
        self._complete_lsn: int | None = None
        self._secondaries: list[Secondary] = []
        # Background work, run by the process's runtime (_runtime.py) when due: nothing
        # runs for a Log with nothing pending, no lease and no interval trigger.
        self._runtime = runtime()
        self._background = self._runtime.job(weak_method(self._run_background), f"persistlog-flush {dest.url}")
        self._flush_interval = LOCAL_FLUSH_INTERVAL  # set by _start_background
        self._flush_armed = False  # a flush is due at _flush_at (pending data arms it)
        self._flush_at = 0.0
        self._renew_every: float | None = None  # an object store's lease: renewed every this
        self._renew_at = 0.0
        # Requests to hand the log over, looked for by the background job (handover=True).
        self._handover = HandoverWatch(dest, writer_id, self._answer_handover) if handover else None
        self._on_handover = on_handover
        self._handed_to: str | None = None  # the writer this Log was handed over to
        self._gone = threading.Event()  # set once closing let the writers and the lock go
        # Closing, and the rotation signal.
        self._old_handler: Any = None
        self._signal: int | None = None
        self._signal_watch: int | None = None
        self._signalled = False
        self._opened_at = time.time()
        self._close_lock = threading.Lock()
        self._close_done = False
        self._secondary_close_wait = lease_ttl + ATTACH_WAIT if secondary_close_wait is None else secondary_close_wait
        # The secondaries the close left behind the primary, by URL (close() returns them).
        self._behind: dict[str, SecondaryLag] = {}
        self._registered = False  # sealed at exit / when collected (opening succeeded)
        try:
            self._rotator = Rotator(
                self,
                enumerate_all,
                rotate_bytes=rotate_bytes,
                rotate_records=rotate_records,
                rotate_interval=rotate_interval,
                retention=retention,
                on_error=on_error,
                known_complete=complete_logs,
                on_complete=self._on_complete,
                concurrent=concurrent_enumeration,
                runtime=self._runtime,
            )
            for entry in secondaries:
                # A pair is a tuple, or a list as JSON (a config file) gives it.
                if isinstance(entry, (tuple, list)) and len(entry) == 2:
                    self._secondaries.append(self._make_secondary(entry[0], entry[1]))
                elif isinstance(entry, (str, os.PathLike)):
                    self._secondaries.append(self._make_secondary(entry, None))
                else:
                    raise TypeError(f"secondaries entries are URLs or (url, storage_options) pairs, not {entry!r}")
            interval = settings.flush_interval or dest.default_flush_interval or LOCAL_FLUSH_INTERVAL
            self._start_background(interval, None if dest.appendable else lease_ttl / 3)
            if rotate_on_signal is not None:
                self._install_signal(rotate_on_signal)
            if after_snapshot:
                self._rotator.start_after_snapshot()
            else:
                self._rotator.wait(self._rotator.request(coalesce=False), retention=False)
        except BaseException:
            self._abandon()
            raise
        self._registered = True
        _exit.register(self)

    # -- public API ---------------------------------------------------------------------

    def update(self, record: Any, sync: bool = False) -> int:
        """Append ``record``; returns its LSN.

        Raises ``TypeError`` before anything is written if the record cannot be encoded, or
        if ``sync`` is not ``True`` or ``False``; ``ValueError`` if it encodes to more than
        32 MiB or nests more than 256 levels deep (lists, tuples, dicts, sets and tags on its
        deepest path, with what a ``Codec``'s encode functions return counted in). A value
        that contains itself raises ``TypeError``, as any value CBOR cannot hold.
        In ``buffered`` mode (the default) the record reaches the OS within the flush
        interval (and at ``close()`` or the interpreter's exit); in ``flush`` mode before this
        returns (on an object store: once the PUT of its segment object succeeded, shared
        with concurrent callers); in ``fsync`` mode (or with ``sync=True``) it is durable before this returns,
        sharing one fsync with concurrent callers. A ``KeyboardInterrupt`` raised meanwhile
        propagates as itself: the record may or may not be logged, the Log stays usable.
        """
        # One identity test for the usual sync=False (a truthy "yes" must not pass).
        if sync is not False and sync is not True:
            raise _not_bool(sync)
        try:
            if self._rotator.gated:
                self._rotator.pass_gate()  # a rotation starts here, or holds this call
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
            if sync or end >= self._batch_bytes or lsn >= self._cut_lsn:  # _hand_over_due, inlined
                self._commit(lsn, durable=sync or self._sync_each)
            elif not self._flush_armed:
                self._arm_flush()  # flushed one interval from now
            return lsn
        except HandedOver:
            self._wait_until_let_go()  # told only once the new writer can have it all
            raise

    def update_many(self, records: Iterable[Any], sync: bool = False) -> int | None:
        """Append several records as one unit; returns the LSN of the last (``None`` for no
        records: nothing is written).

        ``records`` is an iterable of records (a list...); a ``str``, ``bytes`` or mapping is a
        ``TypeError``, since each would iterate into characters, integers or keys. The records
        go into one batch, so a crash keeps all of them or none. Every record is encoded first:
        if any cannot be, ``TypeError`` is raised and none is written; if together they are
        more than one batch holds (about 56 MiB), ``ValueError``. Each record has
        ``update()``'s limits (32 MiB, 256 levels deep).
        """
        if sync is not False and sync is not True:
            raise _not_bool(sync)
        try:
            items, body = self._encode_many(records)
            if not items:
                return None
            if self._rotator.gated:
                self._rotator.pass_gate()
            staged = self._stage_many(len(items), body)
            if staged is None:
                # Too big for the buffer as it stands: check each record's size, and write what
                # is buffered first if the call does not fit beside it.
                staged = self._append_encoded([self._encode(item) for item in items], snapshot=False, whole=True)
            lsn, end = staged
            if sync or self._hand_over_due(lsn, end):
                self._commit(lsn, durable=sync or self._sync_each)
            else:
                self._arm_flush()
            return lsn
        except HandedOver:
            self._wait_until_let_go()  # told only once the new writer can have it all
            raise

    def sync(self) -> None:
        """Make every record appended so far durable (fsync locally; remotely a PUT, then a
        listing showing that no other writer took the destination over).

        An ``OSError`` from storage fails the Log (:class:`LogFailedError`); an
        interruption (``KeyboardInterrupt``) propagates as itself and leaves it usable.
        """
        with self._io_lock:
            self._check()
            self._write_pending()
            self._sync_primary()

    def rotate(self, wait: bool = True, timeout: float | None = None) -> int | None:
        """Start a new log now; returns its seq once complete (``wait=True``).

        If ``enumerate_all`` raises, this raises :class:`EnumerateError` (the app's
        exception is its cause) and the log keeps working in the incomplete log. Called
        from inside ``enumerate_all`` it raises ``RuntimeError`` (it would wait for itself).
        """
        self._rotator.refuse_from_rotation_thread("rotate()")
        self._check()
        fut = self._rotator.request(coalesce=False, hold=None if self._rotator.concurrent else Hold())
        if not wait:
            return None
        return self._rotator.wait(fut, timeout)

    def add_destination(
        self,
        url: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        wait: bool = True,
        timeout: float | None = None,
    ) -> None:
        """Attach a secondary destination and rotate so that it holds a complete log.

        Returns once that log is complete at the newcomer (``wait=True``). Every later
        record goes to it too, through its own writer thread and bounded queue. Raises
        ``RuntimeError`` if called from inside ``enumerate_all``.
        """
        self._rotator.refuse_from_rotation_thread("add_destination()")
        self._check()
        url = destination_url(url)
        if any(r.dest.url == url for r in self._secondaries) or url == self.dest.url:
            raise ValueError(f"{url} is already a destination of this log")
        secondary = self._make_secondary(url, storage_options)
        if secondary.error is not None:
            # Asked for by name, so unlike a secondary given to open() it is not kept.
            secondary.close()
            if isinstance(secondary.error, WriterConflict):
                raise secondary.error
            raise DestinationError(f"cannot open secondary {url} for writing: {secondary.error}") from secondary.error
        with self._io_lock:
            self._secondaries.append(secondary)
        seq = self.rotate(wait=wait, timeout=timeout)
        if wait and seq is not None and not secondary.wait_complete(seq, timeout):
            raise DestinationError(f"secondary {url} did not complete log {seq}: {secondary.error!r}") from secondary.error

    def remove_destination(self, url: str) -> None:
        """Detach a secondary destination (its current log is sealed and left in place)."""
        with self._io_lock:
            for secondary in self._secondaries:
                if secondary.dest.url == url:
                    self._secondaries.remove(secondary)
                    break
            else:
                raise ValueError(f"{url} is not a secondary destination of this log")
        secondary.close(seal=True)

    @property
    def seq(self) -> int:
        """The seq of the log being written."""
        return self._seq

    @property
    def url(self) -> str:
        """The primary destination's URL."""
        return self.dest.url

    @property
    def next_lsn(self) -> int:
        """The LSN the next record appended will get."""
        return self._next_lsn

    @property
    def durable_lsn(self) -> int:
        """The LSN up to which every record is durable."""
        return self._durable_lsn - 1

    @property
    def failed(self) -> BaseException | None:
        """The error that failed the Log (a storage error, a lost lease), after which it
        refuses writes; None while it is healthy."""
        return self._failed

    @property
    def handed_over(self) -> str | None:
        """The writer this Log was handed over to (both opened with ``handover=True``), or
        None: once set, the Log is closed and its calls raise :class:`HandedOver`."""
        return self._handed_to if self._closed else None

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called (the Log then refuses updates)."""
        return self._closed

    def stats(self) -> dict[str, Any]:
        """Counts, bytes, logs, the last rotation, the last error, destination health.

        ``rotation_due`` is True while a fired trigger's rotation waits for the app's next
        ``update()`` (the default; see ``concurrent_enumeration`` in :func:`persistlog.open`),
        ``rotating`` while a new log is started and enumerated, ``retaining`` while old logs
        are deleted after it.
        """
        r = self._rotator
        sw = self._sw
        return {
            **self._counts,
            "durability": self.settings.durability,
            "next_lsn": self._next_lsn,
            "durable_lsn": self.durable_lsn,
            "log_seq": self._seq,
            "log_bytes": sw.bytes_written if sw is not None else 0,
            "records_per_sync": round(
                (self._counts["updates"] + self._counts["snapshot_records"]) / max(1, self._counts["syncs"]), 2
            ),
            "rotations": r.rotations,
            "rotation_failures": r.failures,
            "rotation_due": r.due,
            "rotating": r.rotating and not r.retaining,
            "retaining": r.retaining,
            "last_rotation": r.last_rotation,
            "complete_logs": sorted(r.known_complete),
            "last_error": repr(self._failed or r.last_error) if (self._failed or r.last_error) else None,
            "failed": self._failed is not None,
            "closed": self._closed,
            "destinations": [
                {
                    "url": self.dest.url,
                    "role": "primary",
                    "healthy": self._failed is None,
                    "error": repr(self._failed) if self._failed else None,
                }
            ]
            + [
                {**r.stats(), "behind_at_close": asdict(lag) if (lag := self._behind.get(r.dest.url)) else None}
                for r in list(self._secondaries)
            ],
        }

    def close(self, rotate: bool = False) -> list[SecondaryLag]:
        """Wait for a running enumeration, write what is pending, seal, release the lock.

        Returns the secondaries left behind the primary (an empty list when each one holds
        exactly the primary's state, as it should). A secondary that would not (detached,
        taken back mid-log, behind a gap) is waited for up to ``secondary_close_wait``
        seconds (see :func:`persistlog.open`) and given a new log with an enumeration
        before the seal; one still short after that is warned about and listed, as a
        :class:`SecondaryLag`, here and in ``stats()["destinations"]`` (``behind_at_close``).

        Calls from several threads return once the log is sealed; later calls do nothing
        but return the same list. If the Log failed earlier (``failed``), this lets
        everything go and raises :class:`LogFailedError` when records it accepted without
        waiting for their durability (``buffered``, or ``flush`` locally) are not known to
        be durable: a close that returns means every accepted record is.
        With ``rotate=True`` a rotation runs first (``enumerate_all`` writes every live
        resource into a new log), so that the next restore reads one fresh snapshot and
        none of the updates before it, and the next ``open(..., replay=)`` starts writing
        after that snapshot instead of enumerating again (see :func:`persistlog.open`): a
        slower shutdown for a faster next start. If
        that enumeration raises, the log is still closed (restore then reads the previous
        complete log as usual) and :class:`EnumerateError` is raised after.
        Called from inside ``enumerate_all`` it raises ``RuntimeError`` (it would wait for
        the enumeration it is part of). A Log still open when the interpreter exits is
        closed then; one collected unclosed warns (``ResourceWarning``) and is closed.
        """
        self._rotator.refuse_from_rotation_thread("close()")
        if rotate and not self._close_done:
            try:
                self.rotate(wait=True)
            except PersistLogError:
                self._close(None)
                raise
        return self._close(None)

    def __enter__(self) -> Log:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "failed" if self._failed else "closed" if self._closed else "open"
        return f"<persistlog.Log {self.dest.url!r} log={self._seq} next_lsn={self._next_lsn} {state}>"

    def __del__(self) -> None:
        if self.__dict__.get("_close_done", True) or not self.__dict__.get("_registered", False):
            return  # closed, or never opened (a failed opening lets everything go)
        warnings.warn(
            f"{self!r} was never closed; closing it now (call close(), or use 'with')",
            ResourceWarning,
            source=self,
        )
        _exit.close_collected(self)

    # -- appending ----------------------------------------------------------------------

    def _check(self) -> None:
        if self._failed is not None:
            raise LogFailedError(f"the log at {self.dest.url} failed earlier: {self._failed}") from self._failed
        if self._closed:
            if self._handed_to is not None:
                raise HandedOver(
                    f"the log at {self.dest.url} was handed over to {self._handed_to}; every update acknowledged "
                    "before is in the log it restored",
                    self._handed_to,
                )
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
            if end > _MAX_RECORD:
                # A big record, or a buffer grown past a record's limit: check the size and
                # cut batches on the slow path (the limit is below a batch's).
                self._blocked = True  # cut by the next append if interrupted from here
                return self._take_back(pos, end)
            self._pos = end
            lsn = self._next_lsn
            if snapshot:
                self._snap.append(lsn - self._buf_first)
            self._next_lsn = lsn + 1
        if not self._flush_armed:
            self._arm_flush()
        return lsn, end

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
        self._arm_flush()
        return lsn, end

    def _encode_many(self, records: Iterable[Any]) -> tuple[list[Any], memoryview]:
        """The records of an ``update_many()`` (or a chunk of ``emit.many()``'s) as a list,
        and their encoded bytes one after another; raises before anything is appended."""
        items = records_list(records, "update_many()", "update()")
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

    def _stage_many(self, n: int, body: memoryview, snapshot: bool = False) -> tuple[int, int] | None:
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
            if snapshot:
                first = self._next_lsn - self._buf_first
                self._snap.extend(range(first, first + n))
            self._next_lsn += n
            self._blocked = False
            if self._failed is not None or self._closed:
                self._blocked = True
            lsn = self._next_lsn - 1
        if not self._flush_armed:
            self._arm_flush()
        return lsn, end

    def _emit(self, record: Any) -> None:
        """Append a snapshot record (from the enumerate callback)."""
        staged = self._stage(record, True)
        lsn, end = self._append_encoded([staged], True) if type(staged) is bytes else staged
        if end >= self._batch_bytes:
            self._commit(lsn, durable=False)

    def _emit_many(self, records: list[Any]) -> None:  # the list from records_list()
        """Append snapshot records at ``update_many()``'s cost per record (from
        ``emit.many``): encoded a chunk at a time, each chunk in one call; a record that
        cannot be encoded raises before anything of its chunk is appended."""
        for i in range(0, len(records), _EMIT_CHUNK):
            chunk = records[i : i + _EMIT_CHUNK]
            try:
                _, body = self._encode_many(chunk)
            except ValueError:
                # Too deep, or more than one batch holds: one record at a time says which.
                for record in chunk:
                    self._emit(record)
                continue
            staged = self._stage_many(len(chunk), body, snapshot=True)
            if staged is None:
                staged = self._append_encoded([self._encode(item) for item in chunk], snapshot=True)
            lsn, end = staged
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
            # the rotation job has switched to the new log, so that the old one grows
            # past its trigger by at most the batch buffered meanwhile.
            self._wait_for_switch(switching)

    # -- the cut rule, as the rotator sets it -------------------------------------------

    def _hand_over_due(self, lsn: int, end: int) -> bool:
        """Whether the call that appended up to ``lsn`` (``end`` bytes buffered) hands the
        batch over itself: a full batch, or the record-count trigger's cut (in flush and
        fsync modes every call's; ``update()`` inlines this)."""
        return end >= self._batch_bytes or lsn >= self._cut_lsn

    def _cut_batches_at(self, left: int | None) -> None:
        """Hand batches over once they hold ``left`` bytes (what the size trigger leaves in
        this log, at most ``batch_bytes``; None: whole batches)."""
        full = self.settings.batch_bytes
        self._batch_bytes = full if left is None else max(1, min(full, left))

    def _cut_at_lsn(self, lsn: int) -> None:
        """Have ``update()`` hand its batch over at ``lsn`` (the record-count trigger's; in
        flush and fsync modes every batch is handed over at once anyway)."""
        if not self._eager:
            self._cut_lsn = lsn

    def _hold_writers_for_switch(self) -> None:
        """A size or count trigger fired: writers handing batches over wait (see
        ``_commit``) until :meth:`_release_writers_held_for_switch`."""
        switching = threading.Lock()
        switching.acquire()
        self._switching = switching

    def _release_writers_held_for_switch(self) -> None:
        """The new log is started (or will not be): let the held writers go."""
        switching, self._switching = self._switching, None
        if switching is not None:
            try:
                switching.release()
            except RuntimeError:
                pass  # two threads swapped it out at once: the other released it

    def _mark_complete(self) -> int:
        """The current log's ``complete`` record was just written (holds ``_io_lock``):
        its seal will say so. Returns the LSN due there."""
        self._complete_lsn = self._written_lsn  # control batches take no LSN
        return self._complete_lsn

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
            data = _encoder.record_batch(
                payload, end - first, snaps, first, now_us(), self.settings.compression, self._chain.head,
                self.settings.keys,
            )
            self._taking_batch = data
        try:
            self._append(data, first, end, flush)
        except BaseException:
            self._arm_flush()  # an interrupted hand-over is handed over again by the next flush
            raise
        n_updates = end - first - len(snaps)
        self._taking = None
        self._taking_batch = None
        c = self._counts
        c["updates"] += n_updates
        c["snapshot_records"] += len(snaps)
        self._log_update_records += n_updates
        self._rotator.check_triggers()

    def _append(self, data: bytes, first: int, end: int, flush: bool = True) -> None:
        sw = self._sw
        assert sw is not None

        def write() -> None:
            sw.append(data, first, end)
            if flush and (not isinstance(sw, ObjectSegments) or sw.pending_bytes >= self.settings.segment_bytes):
                sw.flush()

        self._guarded(write)
        self._chain.advance(data)
        self._written_lsn = end
        c = self._counts
        c["batches"] += 1
        c["bytes"] += len(data)
        for secondary in self._secondaries:
            secondary.batch(data, first, end)
        if not flush or isinstance(sw, ObjectSegments):
            self._arm_flush()  # bytes the writer may still hold go out at the next flush
        checkpoint = self._checkpoints.due(self._seq, end, self._chain.head)
        if checkpoint is not None:
            self._append(checkpoint, end, end, flush)

    def _flush_writer(self) -> None:
        """Hand the current segment writer's buffered bytes to storage. Holds ``_io_lock``."""
        if self._sw is not None:
            self._guarded(self._sw.flush)

    def _append_control(self, record: dict[str, Any]) -> None:
        """Write a control batch at the current position. Holds ``_io_lock``."""
        self._write_pending(flush=False)
        pos = self._written_lsn
        self._append(_encoder.control_batch([record], pos, now_us(), self._chain.head), pos, pos)
        self._rotator.check_triggers()

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
        except FileExistsError as e:
            # The segment name this writer takes next is taken: a writer that took the
            # destination over fenced this log. Nothing of this write is acknowledged.
            conflict = WriterConflict(f"another writer took {self.dest.url} over (its lease ran out?): {e}")
            self._fail(conflict)
            raise LogFailedError(f"writing to {self.dest.url} failed: {conflict}") from conflict
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
                "v": F.FORMAT_VERSION if self._chain.head is None else F.CHAINED_VERSION,
                "seq": seq,
                "first_lsn": first,
                "writer": self.writer_id,
                "created": now_us(),
                "metadata": self.metadata,
            }
            sw = segment_writer(self.dest, seq, self.settings.segment_bytes)
            old_head = self._chain.head
            batch = _encoder.control_batch([header], first, now_us(), old_head)
            try:
                sw.start(first, batch)
            except FileExistsError as e:
                self._fail(WriterConflict(f"log {seq} already exists at {self.dest.url}: another writer?"))
                raise WriterConflict(f"log {seq} already exists at {self.dest.url}: another writer?") from e
            except BaseException as e:
                self._fail(e)
                raise LogFailedError(f"creating log {seq} at {self.dest.url} failed: {e}") from e
            self._sw = sw
            self._seq = seq
            self._chain.advance(batch)
            self._log_update_records = 0
            if old is not None:
                self._seal(old, first, old_head)
            self._complete_lsn = None
            for secondary in self._secondaries:
                if old is not None:
                    secondary.seal()
                secondary.start(seq, first, batch)
            return sw

    def _seal(self, sw: SegmentWriter, next_lsn: int, chain: bytes | None = None) -> None:
        """Seal ``sw``'s log, whose chain ends at ``chain`` (None: the chain head now)."""
        complete_lsn = self._complete_lsn
        head = self._chain.head if chain is None else chain
        signed = self._checkpoints.seal_fields(sw.seq, next_lsn, head)
        self._guarded(lambda: sw.seal(seal_batch(next_lsn, complete_lsn, head, signed)))

    @property
    def _current_writer(self) -> SegmentWriter | None:
        """The segment writer of the log being written (None before the first log)."""
        return self._sw

    def _on_complete(self, seq: int, complete_lsn: int) -> None:
        for secondary in list(self._secondaries):
            secondary.complete(seq, complete_lsn)

    # -- secondaries --------------------------------------------------------------------

    def _make_secondary(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None) -> Secondary:
        dest = destination_at(url, storage_options)
        secondary = Secondary(
            dest,
            writer_id=self.writer_id,
            segment_bytes=self.settings.segment_bytes,
            retention=self._rotator.retention,
            flush_interval=self.settings.flush_interval or dest.default_flush_interval or LOCAL_FLUSH_INTERVAL,
            lease_ttl=self._lease_ttl,
            # Weakly, like the Log's jobs: a Log nobody holds is collected (and
            # warned about and sealed) even while its secondaries' threads run.
            on_ready=weak_method(self._secondary_ready),
        )
        secondary.attach()
        return secondary

    def _secondary_ready(self) -> None:
        # A secondary taken back mid-log gets the next log whole: start one now rather
        # than at a size trigger that may be hours away.
        if not self._closed and self._failed is None:
            self._rotator.trigger()

    # -- the writer lease ---------------------------------------------------------------

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
            release_writer_lock(self._lock_handle, self.dest.url)
            self._lock_handle = None

    # -- closing ------------------------------------------------------------------------

    def _close(self, rotation_wait: float | None) -> list[SecondaryLag]:
        with self._close_lock:
            if self._close_done:
                return list(self._behind.values())
            waited: dict[str, str] = {}
            if self._registered and self._failed is None and not self._closed and self._secondaries:
                wait = self._secondary_close_wait
                waited = self._catch_up_secondaries(
                    wait if rotation_wait is None else min(wait, rotation_wait), rotation_wait)
            self._stop_background()
            self._rotator.close(rotation_wait)
            self._restore_signal()
            # An interruption (a KeyboardInterrupt, not an Exception) leaves the close
            # unfinished: calling close() again, or the interpreter's exit, finishes it.
            try:
                self._seal_and_let_go()
            except Exception:
                self._closed_for_good()
                raise
            self._report_behind(waited)
            self._closed_for_good()
            return list(self._behind.values())

    def _catch_up_secondaries(self, wait: float, rotation_wait: float | None) -> dict[str, str]:
        """Before the seal: give each secondary that would not hold the primary's history
        whole a new log (a rotation, waited for up to ``rotation_wait``), waiting up to
        ``wait`` seconds for it to answer (its lease to run out, its storage to come back).
        Returns, by URL, why it fell short.
        """
        deadline = time.monotonic() + wait

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        rotator = self._rotator
        announced = False
        while True:
            # A rotation running now (one a secondary taken back asked for, say) may be
            # the log it needs: judge once that log is complete.
            while rotator.rotating and not rotator.retaining and left():
                time.sleep(0.01)
            behind = [s for s in list(self._secondaries) if s.behind(self._seq, left())]
            if not behind:
                return {}
            if not announced:
                announced = True
                log.info("closing %s: waiting up to %.1fs for secondary(ies) %s to take a complete log",
                         self.dest.url, left(), ", ".join(s.dest.url for s in behind))
            answering = [s for s in behind if s.wait_answer(left())]
            if not answering:
                return {s.dest.url: f"close() waited {wait:g}s for it to answer" for s in behind}
            if rotator.rotating and left():
                continue  # one started meanwhile
            try:
                rotator.wait(rotator.request(), rotation_wait)
            except (PersistLogError, TimeoutError) as e:
                return {s.dest.url: f"the rotation close() started for it failed: {e!r}" for s in behind}
            if not left():
                return {}

    def _report_behind(self, waited: dict[str, str]) -> None:
        """Keep and warn about each secondary the closed log leaves behind the primary."""
        if not self._registered or self._failed is not None:
            return
        for secondary in self._secondaries:
            lag = secondary.lag(self._written_lsn, waited.get(secondary.dest.url))
            if lag is None:
                continue
            self._behind[lag.url] = lag
            log.warning(
                "secondary %s is behind the primary after close: a restore of it reaches LSN %s of the "
                "primary's %d (%s)", lag.url, "unknown" if lag.last_lsn is None else lag.last_lsn,
                lag.primary_last_lsn, lag.reason,
            )

    def _seal_and_let_go(self) -> None:
        """Write what is pending, seal the current log, let go of the writers and the lock.

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
                    self._guarded(self._sw.confirm)
                    self._durable_lsn = self._written_lsn
                    note_closed(self.dest, self._seq, self._written_lsn)
            except Exception:
                self._let_everything_go()
                raise
            self._let_everything_go()
            self._refuse_after_failure()

    def _refuse_after_failure(self) -> None:
        """Raise ``LogFailedError`` from the close of a failed Log that accepted records
        without waiting for their durability (``buffered`` mode, ``flush`` mode locally)
        and cannot make them durable now: the promise of a clean close is broken, and
        they may be missing from storage. Where every acknowledgement waited for
        durability (``fsync``; ``flush`` on an object store) the failure cost nothing
        acknowledged, and the close returns."""
        first, end = self._durable_lsn, self._next_lsn
        if self._failed is None or self._sync_each or first >= end:
            return
        raise LogFailedError(
            f"the log at {self.dest.url} failed earlier ({self._failed}): records {first}..{end - 1} it "
            f"accepted are not known to be durable, and may be missing from storage"
        ) from self._failed

    def _wait_until_let_go(self) -> None:
        """Wait (bounded) until closing has sealed the log and let the lock go: a call told
        that the log was handed over may end the process at once."""
        self._gone.wait(HANDOVER_SEAL_WAIT)

    def _let_everything_go(self) -> None:
        self._let_go = True
        for secondary in self._secondaries:
            secondary.close(seal=self._failed is None)
        if self._sw is not None:
            try:
                self._sw.close()
            except OSError:
                pass
        self._release()
        self._gone.set()

    def _closed_for_good(self) -> None:
        self._close_done = True
        self.dest.close()
        _exit.forget(self)

    def _close_left_open(self, rotation_wait: float | None) -> None:
        """Close on behalf of an app that did not (at exit, or once collected)."""
        if self._close_done:
            return
        log.info("closing the log at %s, which was left open", self.dest.url)
        self._close(rotation_wait)

    def _abandon(self) -> None:
        """Let everything go after a failed opening; what closing raises is only logged."""
        try:
            if hasattr(self, "_rotator"):
                self.close()
            else:
                self._release()
                self.dest.close()
        except Exception as e:
            log.debug("closing after a failed open: %s", e)

    # -- background work ----------------------------------------------------------------

    def _start_background(self, flush_interval: float, lease_renew: float | None) -> None:
        """Schedule the Log's background job (``_run_background``) on the runtime."""
        self._flush_interval = flush_interval
        if lease_renew is not None:
            # Renewed on time whether the Log writes or not, idle included: a lapsed lease
            # lets a second writer in while this one still writes.
            self._renew_every = lease_renew
            self._renew_at = time.monotonic() + lease_renew
        when = self._next_background()
        if when is not None:
            self._background.run_at(when)

    def _stop_background(self) -> None:
        """Run the background job no more, and wait for a run under way (it takes
        ``_io_lock``, which closing takes next)."""
        self._background.cancel()
        self._background.wait_idle()

    def _run_background(self) -> float | None:
        """The background job, run by a runtime worker when due: flush what is pending,
        renew the lease, fire the signal and interval triggers. Returns when it is next
        due (None: not until pending data or a signal asks)."""
        if self._failed is not None or self._closed:
            return None
        try:
            now = time.monotonic()
            if self._flush_armed and now >= self._flush_at - 1e-3:
                self._flush_pending()
            elif not self._flush_armed and (self._has_pending() or self._sw_pending()):
                self._arm_flush()  # an arming an interruption cut short
            if self._renew_every is not None and now >= self._renew_at - 1e-3:
                self._renew_lock()
                self._renew_at = time.monotonic() + self._renew_every
            if self._signalled:
                self._signalled = False
                self._rotator.trigger()
            self._rotator.check_interval()
            if self._handover is not None and now >= self._handover.due - 1e-3:
                self._handover.look()
        except PersistLogError as e:
            log.debug("background flush stopped: %s", e)
            return None
        except Exception:
            log.exception("background flush failed")
        return self._next_background()

    def _next_background(self) -> float | None:
        """When the background job is next due: the armed flush, the lease renewal, the
        interval trigger's next check, whichever comes first."""
        when = self._rotator.next_interval_check()
        handover = self._handover
        for due, at in (
            (self._flush_armed, self._flush_at),
            (self._renew_every is not None, self._renew_at),
            (handover is not None, handover.due if handover is not None else 0.0),
        ):
            if due and (when is None or at < when):
                when = at
        return when

    def _answer_handover(self, request: HandoverRequest) -> None:
        """Hand the log over to the writer that asked (on a thread of its own): the app's
        ``on_handover``, then a close, which lets the lock go. With concurrent enumeration
        the close writes a fresh snapshot first (the app's locks make an enumeration from
        this thread safe); in the default mode it does not: this thread is no quiet point,
        since an app thread may be between logging a change and applying it."""
        log.info("handing the log at %s over to %s", self.dest.url, request.by)
        self._handed_to = request.by
        if self._on_handover is not None:
            try:
                self._on_handover()
            except Exception:
                log.exception("on_handover raised; handing the log over all the same")
        try:
            self.close(rotate=self._rotator.concurrent)
        except PersistLogError as e:
            # Closed all the same (a failed enumeration keeps the last complete log).
            log.warning("handing the log at %s over: %s", self.dest.url, e)
        except Exception:
            log.exception("handing the log at %s over failed", self.dest.url)

    def _arm_flush(self) -> None:
        """Flush what is pending one flush interval from now, unless a flush is armed
        already: called when the Log gets pending data (records buffered, bytes a segment
        writer holds), so that nothing runs for a Log with none."""
        if self._flush_armed:
            return
        at = self._flush_at = time.monotonic() + self._flush_interval
        # Scheduled, then marked armed: an interruption in between leaves it unarmed, and
        # the next append (or the job itself, finding records pending) arms it again.
        self._background.run_at(at)
        self._flush_armed = True

    def _flush_pending(self) -> None:
        """The armed flush: pending records and an object store's pending segment go out,
        however busy the log is. Never waits for ``_io_lock``: its holder is writing."""
        if not self._io_lock.acquire(blocking=False):
            self._flush_at = time.monotonic() + FLUSH_BUSY_RETRY
            return
        try:
            if self._failed is None and not self._closed:
                self._write_pending(flush=False)
                self._flush_writer()
        finally:
            self._io_lock.release()
        # Disarmed after the flush, then checked: a record appended meanwhile by a thread
        # that still saw the flush armed is pending here, and arms the next one.
        self._flush_armed = False
        if self._has_pending() or self._sw_pending():
            self._arm_flush()

    def _has_pending(self) -> bool:
        return self._pos > 0 or self._taking is not None

    def _sw_pending(self) -> bool:
        sw = self._sw
        return bool(sw is not None and getattr(sw, "_pending", None))

    def _install_signal(self, signum: int) -> None:
        ref = weakref.ref(self)

        def handler(num: int, frame: FrameType | None) -> None:
            lg = ref()
            if lg is not None:
                lg._signal_raised()

        self._old_handler = signal.signal(signum, handler)
        self._signal = signum
        # A handler may take no lock (it runs between two bytecodes of a thread that may
        # hold any lock), so it cannot schedule: the runtime's timer thread reads the flag
        # every SIGNAL_POLL seconds while this watch is installed, and runs the job.
        self._signal_watch = self._runtime.watch(weak_method(self._signal_pending), self._background)

    def _signal_raised(self) -> None:
        """The rotation signal arrived (in a signal handler): set a flag and nothing more."""
        self._signalled = True

    def _signal_pending(self) -> bool:
        """Whether a rotation signal waits for the background job (read by the timer thread)."""
        return self._signalled

    def _signal_from_loop(self) -> None:
        """The rotation signal, delivered by an event loop (``AsyncLog``): not in a signal
        handler, so the background job is scheduled at once."""
        self._signalled = True
        self._background.run_soon()

    def _restore_signal(self) -> None:
        if self._signal_watch is not None:
            self._runtime.unwatch(self._signal_watch)
            self._signal_watch = None
        if self._signal is not None:
            try:
                signal.signal(self._signal, self._old_handler)
            except (ValueError, TypeError):
                pass
            self._signal = None


__all__ = ["Log", "LogSettings", "SecondaryEntry", "destination_at", "release_writer_lock"]

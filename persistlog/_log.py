"""``persistlog.open`` and the public :class:`Log` object."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from destinations import Destination, destination_url, open_destination

from . import _encoder, _exit
from . import _format as F
from ._api import restore, restored_here
from ._codec import Codec, check_depth
from ._errors import DestinationError, ExistingLogError, LogClosedError, PersistLogError, WriterConflict
from ._reader import end_of_logs as _end_of_logs
from ._reader import list_logs, log_header, newest_seal, read_pointer
from ._replicas import Replica
from ._restore import RestoreResult
from ._rotation import EnumerateAll, Rotator
from ._writer import LogCore, _Settings

log = logging.getLogger("persistlog")

DEFAULT_ROTATE_BYTES = 64 * 1024 * 1024
DEFAULT_SEGMENT_BYTES = 16 * 1024 * 1024
DEFAULT_BATCH_BYTES = 1024 * 1024
LOCAL_FLUSH_INTERVAL = 0.1
LEASE_TTL = 30.0


def _destination(url: str | os.PathLike[str], storage_options: dict[str, Any] | None) -> Destination:
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options must be a dict, not {type(storage_options).__name__}")
    return open_destination(url, **(storage_options or {}))


class Log(LogCore):
    """A log being written. Build it with :func:`persistlog.open`.

    ``update()`` appends one record, ``update_many()`` several at once; ``sync()`` makes all
    of them durable; ``rotate()`` starts a fresh log with a new enumeration; ``close()``
    writes what is pending and seals the log. A Log is safe to use from many threads.
    One left open is closed at the interpreter's exit (or, with a ``ResourceWarning``,
    once it is collected); ``restored`` is what ``open(..., replay=...)`` restored.
    """

    _rotator: Rotator

    def __init__(self, dest: Destination, settings: _Settings, codec: Codec, metadata: Any) -> None:
        super().__init__(dest, settings, codec, metadata)
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        self._old_handler: Any = None
        self._signal: int | None = None
        self._signalled = False
        self._opened_at = time.time()
        self._close_lock = threading.Lock()
        self._close_done = False
        self._lease_ttl = LEASE_TTL
        self._registered = False  # sealed at exit / when collected (open() succeeded)
        #: What ``open(..., replay=...)`` restored before opening (None without ``replay``).
        self.restored: RestoreResult | None = None

    # -- public API ---------------------------------------------------------------------

    # update(), update_many() come from LogCore; they are documented here for readers.
    update = LogCore.update
    update.__doc__ = """Append ``record``; returns its LSN.

    Raises ``TypeError`` before anything is written if the record cannot be encoded, or
    if ``sync`` is not ``True`` or ``False``; ``ValueError`` if it encodes to more than
    32 MiB or nests more than 256 levels deep (lists, tuples, dicts, sets and tags on its
    deepest path, with what a ``Codec``'s encode functions return counted in). A value
    that contains itself raises ``TypeError``, as any value CBOR cannot hold.
    In ``buffered`` mode (the default) the record reaches the OS within the flush
    interval (and at ``close()`` or the interpreter's exit); in ``flush`` mode before this
    returns; in ``fsync`` mode (or with ``sync=True``) it is durable before this returns,
    sharing one fsync with concurrent callers. A ``KeyboardInterrupt`` raised meanwhile
    propagates as itself: the record may or may not be logged, the Log stays usable.
    """
    update_many = LogCore.update_many
    update_many.__doc__ = """Append several records as one unit; returns the LSN of the last
    (``None`` for no records: nothing is written).

    ``records`` is an iterable of records (a list...); a ``str``, ``bytes`` or mapping is a
    ``TypeError``, since each would iterate into characters, integers or keys. The records
    go into one batch, so a crash keeps all of them or none. Every record is encoded first:
    if any cannot be, ``TypeError`` is raised and none is written; if together they are
    more than one batch holds (about 56 MiB), ``ValueError``. Each record has
    ``update()``'s limits (32 MiB, 256 levels deep).
    """

    def sync(self) -> None:
        """Make every record appended so far durable (fsync locally, PUT remotely).

        An ``OSError`` from storage fails the Log (:class:`LogFailedError`); an
        interruption (``KeyboardInterrupt``) propagates as itself and leaves it usable.
        """
        with self._io_lock:
            self._check()
            self._write_pending()
            self._sync_primary()

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
        if any(r.dest.url == url for r in self._replicas) or url == self.dest.url:
            raise ValueError(f"{url} is already a destination of this log")
        replica = self._make_replica(url, storage_options)
        if replica.error is not None:
            # Asked for by name, so unlike a secondary given to open() it is not kept.
            replica.close()
            if isinstance(replica.error, WriterConflict):
                raise replica.error
            raise DestinationError(f"cannot open secondary {url} for writing: {replica.error}") from replica.error
        with self._io_lock:
            self._replicas.append(replica)
        seq = self.rotate(wait=wait, timeout=timeout)
        if wait and seq is not None and not replica.wait_complete(seq, timeout):
            raise DestinationError(f"secondary {url} did not complete log {seq}: {replica.error!r}") from replica.error

    def remove_destination(self, url: str) -> None:
        """Detach a secondary destination (its current log is sealed and left in place)."""
        with self._io_lock:
            for replica in self._replicas:
                if replica.dest.url == url:
                    self._replicas.remove(replica)
                    break
            else:
                raise ValueError(f"{url} is not a secondary destination of this log")
        replica.close(seal=True)

    def _make_replica(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None) -> Replica:
        dest = _destination(url, storage_options)
        replica = Replica(
            dest,
            writer_id=self.writer_id,
            segment_bytes=self.settings.segment_bytes,
            retain=self._rotator.retain,
            flush_interval=self.settings.flush_interval or dest.default_flush_interval or LOCAL_FLUSH_INTERVAL,
            lease_ttl=self._lease_ttl,
            # Weakly, like the Log's other threads: a Log nobody holds is collected (and
            # warned about and sealed) even while its secondaries' threads run.
            on_ready=_weak_call(weakref.WeakMethod(self._secondary_ready)),
        )
        replica.attach()
        return replica

    def _secondary_ready(self) -> None:
        # A secondary taken back mid-log gets the next log whole: start one now rather
        # than at a size trigger that may be hours away.
        if not self._closed and self._failed is None:
            self._rotator.request()

    def rotate(self, wait: bool = True, timeout: float | None = None) -> int | None:
        """Start a new log now; returns its seq once complete (``wait=True``).

        If ``enumerate_all`` raises, this raises :class:`EnumerateError` (the app's
        exception is its cause) and the log keeps working in the incomplete log. Called
        from inside ``enumerate_all`` it raises ``RuntimeError`` (it would wait for itself).
        """
        self._rotator.refuse_from_rotation_thread("rotate()")
        self._check()
        fut = self._rotator.request(coalesce=False)
        if not wait:
            return None
        return self._rotator.wait(fut, timeout)

    @property
    def seq(self) -> int:
        """The seq of the log being written."""
        return self._seq

    @seq.setter
    def seq(self, value: int) -> None:
        self._seq = value

    @property
    def url(self) -> str:
        return self.dest.url

    def stats(self) -> dict[str, Any]:
        """Counts, bytes, logs, the last rotation, the last error, destination health.

        ``rotating`` is True while a new log is started and enumerated, ``retaining`` while
        old logs are deleted after it.
        """
        r = self._rotator
        sw = self._current_writer
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
            + [r.stats() for r in list(self._replicas)],
        }

    def close(self, rotate: bool = False) -> None:
        """Wait for a running enumeration, write what is pending, seal, release the lock.

        Calls from several threads return once the log is sealed; later calls do nothing.
        With ``rotate=True`` a rotation runs first (``enumerate_all`` writes every live
        resource into a new log), so that the next restore reads one fresh snapshot and
        none of the updates before it, and the next ``open(..., replay=)`` starts writing
        after that snapshot instead of enumerating again (see :func:`open`): a slower
        shutdown for a faster next start. If
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
        self._close(None)

    def _close(self, rotation_wait: float | None) -> None:
        with self._close_lock:
            if self._close_done:
                return
            self._stop.set()
            self._rotator.close(rotation_wait)
            if self._ticker is not None and self._ticker is not threading.current_thread():
                self._ticker.join()
            self._restore_signal()
            # An interruption (a KeyboardInterrupt, not an Exception) leaves the close
            # unfinished: calling close() again, or the interpreter's exit, finishes it.
            try:
                super().close()
            except Exception:
                self._closed_for_good()
                raise
            self._closed_for_good()

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

    def __del__(self) -> None:
        if self.__dict__.get("_close_done", True) or not self.__dict__.get("_registered", False):
            return  # closed, or never opened (open() closes what it fails to open)
        warnings.warn(
            f"{self!r} was never closed; closing it now (call close(), or use 'with')",
            ResourceWarning,
            source=self,
        )
        _exit.close_collected(self)

    def __enter__(self) -> Log:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "failed" if self._failed else "closed" if self._closed else "open"
        return f"<persistlog.Log {self.dest.url!r} log={self._seq} next_lsn={self._next_lsn} {state}>"

    # -- background work ----------------------------------------------------------------

    def _start_background(self, flush_interval: float, lease_renew: float | None) -> None:
        # The lease must be renewed on time whatever the flush interval: a lapsed lease
        # lets a second writer in while this one still writes.
        period = flush_interval if lease_renew is None else min(flush_interval, lease_renew / 2)
        self._ticker = threading.Thread(
            target=_tick, args=(weakref.ref(self), self._stop, period, flush_interval, lease_renew),
            name="persistlog-flush", daemon=True,
        )
        self._ticker.start()

    def _on_complete(self, seq: int, complete_lsn: int) -> None:
        for replica in list(self._replicas):
            replica.complete(seq, complete_lsn)

    def _sw_pending(self) -> bool:
        sw = self._current_writer
        return bool(sw is not None and getattr(sw, "_pending", None))

    def _install_signal(self, signum: int) -> None:
        ref = weakref.ref(self)

        def handler(num: int, frame: FrameType | None) -> None:
            lg = ref()
            if lg is not None:
                lg._signalled = True  # the flush thread starts the rotation; no I/O here

        self._old_handler = signal.signal(signum, handler)
        self._signal = signum

    def _restore_signal(self) -> None:
        if self._signal is not None:
            try:
                signal.signal(self._signal, self._old_handler)
            except (ValueError, TypeError):
                pass
            self._signal = None


def _weak_call(method: weakref.WeakMethod[Callable[[], None]]) -> Callable[[], None]:
    """A callable that calls ``method`` while its object is alive, and does nothing after."""

    def call() -> None:
        bound = method()
        if bound is not None:
            bound()

    return call


def open(
    url: str | os.PathLike[str],
    enumerate_all: EnumerateAll,
    *,
    durability: str = "buffered",
    rotate_bytes: int | None = DEFAULT_ROTATE_BYTES,
    rotate_records: int | None = None,
    rotate_interval: float | None = None,
    retain: int = 2,
    rotate_on_signal: int | None = None,
    metadata: Any = None,
    codec: Codec | None = None,
    storage_options: dict[str, Any] | None = None,
    compression: str | None = None,
    on_error: Callable[[BaseException], None] | None = None,
    secondaries: list[str | os.PathLike[str] | tuple[str | os.PathLike[str], dict[str, Any] | None]] | None = None,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    flush_interval: float | None = None,
    lease_ttl: float = LEASE_TTL,
    replay: Callable[[Any], Any] | None = None,
    replay_batch: Callable[[list[Any]], Any] | None = None,
    recovery: str = "strict",
    discard_existing: bool = False,
) -> Log:
    """Open the log at ``url`` for writing and start a new log with a full enumeration.

    Opening calls ``enumerate_all(emit)``, which must call ``emit(record)`` once per live
    resource, and returns once that first log is complete (if it raises, the log is closed
    and :class:`EnumerateError` is raised). A second writer on the same destination gets
    :class:`WriterConflict`. Emitted records and ``metadata`` nest at most 256 levels deep,
    as ``update()``'s records do (``ValueError``).

    The new log replaces what the destination holds, so the app must have replayed it:
    with ``replay=`` (or ``replay_batch=``) open restores first, holding the writer lock,
    with :func:`persistlog.restore`'s meaning and options (``recovery``, ``codec``,
    ``storage_options``) and keeps the :class:`RestoreResult` in ``log.restored``; or call
    ``restore(url, ...)`` first in the same process, with nothing written in between.
    Otherwise a destination holding records raises :class:`ExistingLogError`, unless
    ``discard_existing=True`` (start over; the old logs go by retention).

    One open skips the enumeration: when it replays (``replay=``/``replay_batch=``) a
    newest log that is complete and holds its snapshot and nothing after it, as
    ``close(rotate=True)`` leaves it, opened with the same ``metadata`` and without
    ``secondaries``, the new log starts after that snapshot without calling
    ``enumerate_all``: the snapshot stays the restore point until the next rotation (a
    trigger, or ``rotate()``) writes a new one. The state it holds is the one just
    replayed, so an enumeration would write the same records again. (After
    ``restore()`` then ``open()`` the app may have changed its state in between: that
    open enumerates.)

    ``url`` (and each secondary's) is a string or an ``os.PathLike``. Triggers (``None``
    turns one off): ``rotate_bytes`` (default 64 MiB of log), ``rotate_records`` (updates
    in the current log), ``rotate_interval`` (seconds), ``rotate_on_signal`` (e.g.
    ``signal.SIGUSR1``; main thread only; the previous handler is restored on close). A
    log ends within about one batch (``batch_bytes``) of its size or count trigger; one
    crossed while the log's own enumeration is still written fires when it ends. ``retain`` complete
    logs are kept (minimum 1). ``durability`` is ``"buffered"``, ``"flush"`` or ``"fsync"``.
    ``compression`` is None, ``"gzip"`` or ``"zstd"`` (per batch). ``secondaries`` are
    more destinations (URLs or ``(url, storage_options)`` pairs) that receive every record
    through their own writer threads; ``storage_options`` apply to the primary.
    ``lease_ttl`` is how long an object-store writer lease lasts without renewal (a
    crashed writer's destination can be taken over after it).
    """
    if not callable(enumerate_all):
        raise TypeError("enumerate_all must be a callable taking emit")
    if not isinstance(retain, int) or isinstance(retain, bool) or retain < 1:
        raise ValueError(f"retain must be an integer >= 1, not {retain!r}")
    for name, value in (("rotate_bytes", rotate_bytes), ("rotate_records", rotate_records)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be a positive integer or None, not {value!r}")
    if rotate_interval is not None and (not isinstance(rotate_interval, (int, float)) or rotate_interval <= 0):
        raise ValueError(f"rotate_interval must be a positive number of seconds or None, not {rotate_interval!r}")
    if codec is not None and not isinstance(codec, Codec):
        raise TypeError(f"codec must be a persistlog.Codec, not {type(codec).__name__}")
    if replay is not None and replay_batch is not None:
        raise TypeError("open() takes replay= or replay_batch=, not both")
    if recovery not in ("strict", "skip"):
        raise ValueError(f"recovery must be 'strict' or 'skip', not {recovery!r}")
    if not isinstance(discard_existing, bool):
        raise TypeError(f"discard_existing must be True or False, not {discard_existing!r}")
    settings = _Settings(
        durability=durability,
        batch_bytes=batch_bytes,
        segment_bytes=segment_bytes,
        flush_interval=flush_interval,
        compression=compression,
    )
    codec = codec or Codec()
    check_depth(metadata, "metadata")
    try:
        # Exactly as the log header will hold it: plain CBOR, which every reader decodes
        # without the app's codec, so a Codec-registered object cannot go in it.
        _encoder.control_batch([{"metadata": metadata}], F.FIRST_LSN, 0)
    except Exception as e:
        raise TypeError(f"metadata must be a plain CBOR value (no Codec-registered objects): {e}") from None
    dest = _destination(url, storage_options)
    lg = Log(dest, settings, codec, metadata)
    if not isinstance(lease_ttl, (int, float)) or lease_ttl <= 0:
        raise ValueError(f"lease_ttl must be a positive number of seconds, not {lease_ttl!r}")
    lg._acquire(lease_ttl)
    lg._lease_ttl = float(lease_ttl)
    try:
        if replay is not None or replay_batch is not None:
            # Under the writer lock: nothing can be written between the replay and the
            # new log that takes its place.
            lg.restored = restore(
                url, replay, replay_batch=replay_batch, recovery=recovery, codec=codec,
                storage_options=storage_options,
            )
        try:
            logs = list_logs(dest)
            pointer = read_pointer(dest)
            last_seq, next_lsn = _end_of_logs(dest, logs)
        except OSError as e:
            raise DestinationError(f"cannot read {dest.url}: {e}") from e
        holds_records = next_lsn > F.FIRST_LSN
        if holds_records and not discard_existing and not restored_here(dest, (last_seq, next_lsn)):
            raise ExistingLogError(
                f"{dest.url} holds logs up to log {last_seq} (next LSN {next_lsn}) that this "
                "process did not restore; opening would start a new log without them and "
                "retention would delete them. Restore first: persistlog.open(url, "
                "enumerate_all, replay=apply) (or replay_batch=), or persistlog.restore(url, "
                "apply) then persistlog.open(url, ...) with nothing written in between; "
                "pass discard_existing=True to start over on purpose"
            )
        lg._set_position(next_lsn, last_seq)
        known = [pointer] if pointer is not None and pointer in logs else []
        lg._rotator = Rotator(
            lg,
            enumerate_all,
            rotate_bytes=rotate_bytes,
            rotate_records=rotate_records,
            rotate_interval=rotate_interval,
            retain=retain,
            on_error=on_error,
            known_complete=known,
            on_complete=lg._on_complete,
        )
        for entry in secondaries or []:
            if isinstance(entry, tuple) and len(entry) == 2:
                lg._replicas.append(lg._make_replica(entry[0], entry[1]))
            elif isinstance(entry, (str, os.PathLike)):
                lg._replicas.append(lg._make_replica(entry, None))
            else:
                raise TypeError(f"secondaries entries are URLs or (url, storage_options) pairs, not {entry!r}")
        lg._after_batch = lg._rotator.check_triggers
        interval = flush_interval or dest.default_flush_interval or LOCAL_FLUSH_INTERVAL
        renew = None if dest.appendable else lease_ttl / 3
        lg._start_background(interval, renew)
        if rotate_on_signal is not None:
            lg._install_signal(rotate_on_signal)
        if not discard_existing and not secondaries and _fresh_snapshot(dest, logs, pointer, lg.restored, metadata):
            lg._rotator.start_after_snapshot()
        else:
            lg._rotator.wait(lg._rotator.request(coalesce=False))
    except BaseException:
        _close_quietly(lg)
        raise
    lg._registered = True
    _exit.register(lg)
    log.info("opened %s for writing at log %d (next LSN %d)", dest.url, lg.seq, lg.next_lsn)
    return lg


def _fresh_snapshot(
    dest: Destination, logs: dict[int, list[tuple[int, str]]], pointer: int | None,
    restored: RestoreResult | None, metadata: Any,
) -> bool:
    """Whether the newest log, just replayed by open() itself, is a complete log holding its
    snapshot and nothing after it (as ``close(rotate=True)`` leaves it), with the metadata
    the app opens with: then it can stay the restore point, and an opening enumeration
    would write the same state again."""
    if restored is None or not restored.complete or restored.skipped or not logs:
        return False
    seq = max(logs)
    if restored.logs != [seq] or pointer != seq:
        return False
    seal = newest_seal(dest, logs)
    if seal is None or seal.get(F.SEAL_COMPLETE_LSN) != seal["next_lsn"]:
        return False
    header = log_header(dest, logs[seq])
    return header is not None and header.get("metadata") == metadata


def _tick(
    ref: weakref.ReferenceType[Log],
    stop: threading.Event,
    period: float,
    flush_interval: float,
    lease_renew: float | None,
) -> None:
    """The flush thread: flushes, renews the lease, fires the time and signal triggers.

    It holds the Log only during a tick, so that a Log the app dropped can be collected.
    """
    last_renew = time.monotonic()
    last_flush = time.monotonic()
    while not stop.wait(period):
        lg = ref()
        if lg is None:
            return
        try:
            if lg._failed is not None:
                return
            due = time.monotonic() - last_flush >= flush_interval - 1e-3
            if due:
                last_flush = time.monotonic()
            if due and (lg._has_pending() or lg._sw_pending()):
                with lg._io_lock:
                    if lg._failed is None and not lg._closed:
                        # Pending records and an object store's pending segment both go
                        # out on every tick, however busy the log is.
                        lg._write_pending(flush=False)
                        lg._flush_writer()
            if lease_renew is not None and time.monotonic() - last_renew >= lease_renew:
                lg._renew_lock()
                last_renew = time.monotonic()
            if lg._signalled:
                lg._signalled = False
                lg._rotator.request()
            lg._rotator.check_interval()
        except PersistLogError as e:
            log.debug("background flush stopped: %s", e)
            return
        except Exception:
            log.exception("background flush failed")
        finally:
            del lg


def _close_quietly(lg: Log) -> None:
    try:
        if hasattr(lg, "_rotator"):
            lg.close()
        else:
            lg._release()
            lg.dest.close()
    except Exception as e:
        log.debug("closing after a failed open: %s", e)


__all__ = ["Log", "LogClosedError", "open"]

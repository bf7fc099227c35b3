"""The Log: one log being written, from ``update()`` to sealed segments at each destination.

:class:`Log` is the front of a set of parts, each owning its state (docs/INTERNALS.md,
"Threads and locks"): a :class:`~persistlog._write.batch_buffer.BatchBuffer` (records appended,
their LSNs, and the cut rule saying when a call hands its batch over), a
:class:`~persistlog._write.batch_writer.BatchWriter` (batches to the segment writer and the
secondaries, syncs and their group commit, the flush timer, the failed and closed
state), a :class:`~persistlog._write.rotation.Rotator` (the triggers and the rotation job) and a
:class:`~persistlog._write.writer_lease.WriterLease` (the writer lock). :class:`AsyncLog` is a
second front over the same parts (:func:`parts_of`). ``persistlog.open`` (``_api``)
checks the options, takes the writer lock, restores, and builds the Log. Its background
work (flushes, the lease, the interval and signal triggers) and its rotations run as
jobs on the process's runtime (``_runtime``), shared by every Log: an open Log has no
thread of its own, and an idle one schedules nothing.

Interruptions. Only an ``OSError`` from storage fails the Log. Anything else raised in
the middle of a write (a ``KeyboardInterrupt`` in the main thread, ``SystemExit`` from a
signal handler) propagates as itself and leaves the Log consistent (see the buffer's and
the writer's modules). Bookkeeping that must happen together is written without a call
in between, where CPython never raises a pending signal's exception.
"""

from __future__ import annotations

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
from typing import Any, NamedTuple, Union

from destinations import Destination, WriterLock, destination_url

from .._errors import DestinationError, HandedOver, PersistLogError, WriterConflict
from .._format import constants as F
from .._format.codec import Codec
from .._format.signing import Checkpoints
from .._read.restore import RestoreResult
from .._runtime import runtime, weak_method
from . import at_exit
from .batch_buffer import BatchBuffer
from .batch_writer import BatchWriter
from .handover import HandoverRequest, HandoverWatch
from .retention import Retention
from .rotation import EnumerateAll, Hold, Rotator
from .secondaries import ATTACH_WAIT, Secondary, SecondaryLag
from .settings import LogSettings, destination_at
from .writer_lease import WriterLease

logger = logging.getLogger("persistlog")

LOCAL_FLUSH_INTERVAL = 0.1

# Seconds a call told that the log was handed over waits for the close under way to seal it.
HANDOVER_SEAL_WAIT = 60.0

#: A secondary destination as ``open(secondaries=...)`` takes it: a URL, or a
#: ``(url, storage_options)`` pair.
SecondaryEntry = Union[str, "os.PathLike[str]", tuple[Union[str, "os.PathLike[str]"], Union[dict[str, Any], None]]]


def _not_bool(sync: object) -> TypeError:
    return TypeError(f"sync must be True or False, not {sync!r}")


class LogParts(NamedTuple):
    """The parts a Log is made of, for a second front over the same calls (``AsyncLog``)."""

    buffer: BatchBuffer
    writer: BatchWriter
    rotator: Rotator
    lease: WriterLease
    #: The rotation signal, delivered by an event loop (not in a signal handler).
    signal_from_loop: Callable[[], None]


class Log:
    """A log being written. Build it with :func:`persistlog.open`.

    ``update()`` appends one record, ``update_many()`` several at once; ``sync()`` makes all
    of them durable; ``rotate()`` starts a fresh log with a new enumeration; ``close()``
    writes what is pending and seals the log. A Log is safe to use from many threads.
    One left open is closed at the interpreter's exit (or, with a ``ResourceWarning``,
    once it is collected); ``restored`` is what ``open(..., replay=...)`` restored.
    """

    __slots__ = (
        "dest", "settings", "codec", "metadata", "writer_id", "restored", "_buffer", "_stage", "_writer",
        "_lease", "_rotator", "_sync_each", "_lease_ttl", "_runtime", "_background", "_handover",
        "_on_handover", "_old_handler", "_signal", "_signal_watch", "_signalled", "_close_lock", "_close_done",
        "_let_go", "_secondary_close_wait", "_behind", "_registered", "__weakref__",
    )

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
        """Open the log: start its background job and secondaries, write its first complete log.

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
        self.settings = settings
        self.codec = codec
        self.metadata = metadata
        self.writer_id = writer_id
        #: What ``open(..., replay=...)`` restored before opening (None without ``replay``).
        self.restored = restored
        self._registered = False  # sealed at exit / when collected (opening succeeded)
        self._close_done = False
        self._let_go = False  # the writer, secondaries and lock were let go
        self._close_lock = threading.Lock()
        # Background work, run by the process's runtime (_runtime.py) when due: nothing
        # runs for a Log with nothing pending, no lease and no interval trigger.
        self._runtime = runtime()
        self._background = self._runtime.job(weak_method(self._run_background), "persistlog-flush", dest.url)
        # On an object store a batch reaches storage only with the PUT of a segment object:
        # there flush mode waits for that PUT as fsync mode does, through the group commit
        # (concurrent callers share one PUT), so that it survives a process crash.
        self._sync_each = settings.durability == "fsync" or (settings.durability == "flush" and not dest.appendable)
        # In flush and fsync modes every call hands its batch over at once ("eager").
        self._buffer = buffer = BatchBuffer(codec, next_lsn, settings.batch_bytes, settings.durability != "buffered")
        # The hot path of update(): the buffer's one fast append (see BatchBuffer.stage).
        self._stage = buffer.fast_stage
        self._writer = writer = BatchWriter(
            dest,
            buffer,
            compression=settings.compression,
            keys=settings.keys,
            segment_bytes=settings.segment_bytes,
            sync_each=self._sync_each,
            writer_id=writer_id,
            metadata=metadata,
            last_seq=last_seq,
            job=self._background,
            flush_interval=settings.flush_interval or dest.default_flush_interval or LOCAL_FLUSH_INTERVAL,
            chain_head=chain_head,
            checkpoints=checkpoints,
            share_values=settings.share_values,
        )
        # Renewed on time whether the Log writes or not, idle included: a lapsed lease
        # lets a second writer in while this one still writes.
        self._lease = WriterLease(writer_lock, dest.url, None if dest.appendable else lease_ttl / 3, writer.fail)
        self._lease_ttl = lease_ttl
        # Requests to hand the log over, looked for by the background job (handover=True).
        self._handover = HandoverWatch(dest, writer_id, self._answer_handover) if handover else None
        self._on_handover = on_handover
        # The rotation signal.
        self._old_handler: Any = None
        self._signal: int | None = None
        self._signal_watch: int | None = None
        self._signalled = False
        self._secondary_close_wait = lease_ttl + ATTACH_WAIT if secondary_close_wait is None else secondary_close_wait
        # The secondaries the close left behind the primary, by URL (close() returns them);
        # None until one is.
        self._behind: dict[str, SecondaryLag] | None = None
        try:
            self._rotator = Rotator(
                buffer,
                writer,
                enumerate_all,
                rotate_bytes=rotate_bytes,
                rotate_records=rotate_records,
                rotate_interval=rotate_interval,
                retention=retention,
                on_error=on_error,
                known_complete=complete_logs,
                concurrent=concurrent_enumeration,
                runtime=self._runtime,
            )
            writer.watch_batches(self._rotator.check_triggers)
            for entry in secondaries:
                # A pair is a tuple, or a list as JSON (a config file) gives it.
                if isinstance(entry, (tuple, list)) and len(entry) == 2:
                    writer.add_secondary(self._make_secondary(entry[0], entry[1]))
                elif isinstance(entry, (str, os.PathLike)):
                    writer.add_secondary(self._make_secondary(entry, None))
                else:
                    raise TypeError(f"secondaries entries are URLs or (url, storage_options) pairs, not {entry!r}")
            self._start_background()
            if rotate_on_signal is not None:
                self._install_signal(rotate_on_signal)
            if after_snapshot:
                self._rotator.start_after_snapshot()
            elif dest.appendable:
                # On a local disk the first log is made on this thread, which waits for it
                # anyway (retention there is an unlink or two).
                self._rotator.rotate_here()
            else:
                # An object store's retention takes a request per segment: the open returns
                # once the log is complete, and the rotation job deletes meanwhile.
                self._rotator.wait(self._rotator.request(coalesce=False), retention=False)
        except BaseException:
            self._abandon()
            raise
        self._registered = True
        at_exit.register(self)

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
            # The hot path: the buffer's one fast append (BatchBuffer.stage, which applies
            # the cut rule), then the writer's hand-over rule (BatchWriter.appended and
            # waits), inlined here: two calls fewer per update (bench: update() against
            # the naive loop).
            staged = self._stage(record)
            if type(staged) is int and not sync:  # the usual case: the batch stays buffered
                if not self._writer.flush_armed:
                    self._writer.arm_flush()  # flushed one interval from now
                return staged
            writer = self._writer
            # A full batch, or a big record (the slow path may write a batch first).
            lsn, due = (staged, False) if isinstance(staged, int) else writer.staged(staged)
            if sync or due:
                writer.commit(lsn, durable=sync or self._sync_each)
            elif not writer.flush_armed:
                writer.arm_flush()
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
            writer = self._writer
            items, body = self._buffer.encode_many(records)
            if not items:
                return None
            if self._rotator.gated:
                self._rotator.pass_gate()
            staged = self._buffer.stage_many(len(items), body)
            if staged is None:
                # Too big for the buffer as it stands: check each record's size, and write what
                # is buffered first if the call does not fit beside it.
                staged = writer.append_whole(items)
            lsn, due = staged
            writer.appended(lsn, due, sync)
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
        self._writer.sync()

    def rotate(self, wait: bool = True, timeout: float | None = None) -> int | None:
        """Start a new log now; returns its seq once complete (``wait=True``).

        If ``enumerate_all`` raises, this raises :class:`EnumerateError` (the app's
        exception is its cause) and the log keeps working in the incomplete log. Called
        from inside ``enumerate_all`` it raises ``RuntimeError`` (it would wait for itself).
        """
        self._rotator.refuse_from_rotation_thread("rotate()")
        self._writer.check()
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
        self._writer.check()
        url = destination_url(url)
        if any(r.dest.url == url for r in self._writer.secondaries) or url == self.dest.url:
            raise ValueError(f"{url} is already a destination of this log")
        secondary = self._make_secondary(url, storage_options)
        if secondary.error is not None:
            # Asked for by name, so unlike a secondary given to open() it is not kept.
            secondary.close()
            if isinstance(secondary.error, WriterConflict):
                raise secondary.error
            raise DestinationError(f"cannot open secondary {url} for writing: {secondary.error}") from secondary.error
        self._writer.add_secondary(secondary)
        seq = self.rotate(wait=wait, timeout=timeout)
        if wait and seq is not None and not secondary.wait_complete(seq, timeout):
            raise DestinationError(f"secondary {url} did not complete log {seq}: {secondary.error!r}") from secondary.error

    def remove_destination(self, url: str) -> None:
        """Detach a secondary destination (its current log is sealed and left in place)."""
        self._writer.remove_secondary(url).close(seal=True)

    @property
    def seq(self) -> int:
        """The seq of the log being written."""
        return self._writer.seq

    @property
    def url(self) -> str:
        """The primary destination's URL."""
        return self.dest.url

    @property
    def next_lsn(self) -> int:
        """The LSN the next record appended will get."""
        return self._buffer.next_lsn

    @property
    def durable_lsn(self) -> int:
        """The LSN up to which every record is durable."""
        return self._writer.durable_lsn - 1

    @property
    def failed(self) -> BaseException | None:
        """The error that failed the Log (a storage error, a lost lease), after which it
        refuses writes; None while it is healthy."""
        return self._writer.failed

    @property
    def handed_over(self) -> str | None:
        """The writer this Log was handed over to (both opened with ``handover=True``), or
        None: once set, the Log is closed and its calls raise :class:`HandedOver`."""
        writer = self._writer
        return writer.handed_to if writer.closed else None

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called (the Log then refuses updates)."""
        return self._writer.closed

    def stats(self) -> dict[str, Any]:
        """Counts, bytes, logs, the last rotation, the last error, destination health.

        ``rotation_due`` is True while a fired trigger's rotation waits for the app's next
        ``update()`` (the default; see ``concurrent_enumeration`` in :func:`persistlog.open`),
        ``rotating`` while a new log is started and enumerated, ``retaining`` while old logs
        are deleted after it.
        """
        r = self._rotator
        writer = self._writer
        sw = writer.current
        counts = writer.counts()
        failed = writer.failed
        return {
            **counts,
            "durability": self.settings.durability,
            "next_lsn": self._buffer.next_lsn,
            "durable_lsn": self.durable_lsn,
            "log_seq": writer.seq,
            "log_bytes": sw.bytes_written if sw is not None else 0,
            "records_per_sync": round((counts["updates"] + counts["snapshot_records"]) / max(1, counts["syncs"]), 2),
            "rotations": r.rotations,
            "rotation_failures": r.failures,
            "rotation_due": r.due,
            "rotating": r.rotating and not r.retaining,
            "retaining": r.retaining,
            "last_rotation": r.last_rotation,
            "complete_logs": sorted(r.known_complete),
            "last_error": repr(failed or r.last_error) if (failed or r.last_error) else None,
            "failed": failed is not None,
            "closed": writer.closed,
            "destinations": [
                {
                    "url": self.dest.url,
                    "role": "primary",
                    "healthy": failed is None,
                    "error": repr(failed) if failed else None,
                }
            ]
            + [
                {**s.stats(), "behind_at_close": asdict(lag) if (lag := (self._behind or {}).get(s.dest.url)) else None}
                for s in writer.secondaries
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
        writer = self._writer
        state = "failed" if writer.failed else "closed" if writer.closed else "open"
        return f"<persistlog.Log {self.dest.url!r} log={writer.seq} next_lsn={self._buffer.next_lsn} {state}>"

    def __del__(self) -> None:
        if getattr(self, "_close_done", True) or not getattr(self, "_registered", False):
            return  # closed, or never opened (a failed opening lets everything go)
        # The source named is the Log's writer, made in its constructor (tracemalloc shows
        # where the app opened the Log): a warning kept (by a filter, a recorder) must not
        # keep the Log itself alive once its close below is done.
        warnings.warn(
            f"{self!r} was never closed; closing it now (call close(), or use 'with')",
            ResourceWarning,
            source=self._writer,
        )
        at_exit.close_collected(self)

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
            sign_seal=self._writer.seal_signature,
        )
        secondary.attach()
        return secondary

    def _secondary_ready(self) -> None:
        # A secondary taken back mid-log gets the next log whole: start one now rather
        # than at a size trigger that may be hours away.
        writer = self._writer
        if not writer.closed and writer.failed is None:
            self._rotator.trigger()

    # -- closing ------------------------------------------------------------------------

    def _close(self, rotation_wait: float | None) -> list[SecondaryLag]:
        with self._close_lock:
            if self._close_done:
                return list((self._behind or {}).values())
            writer = self._writer
            waited: dict[str, str] = {}
            if self._registered and writer.failed is None and not writer.closed and writer.secondaries:
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
            return list((self._behind or {}).values())

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
        writer = self._writer
        announced = False
        while True:
            # A rotation running now (one a secondary taken back asked for, say) may be
            # the log it needs: judge once that log is complete.
            while rotator.rotating and not rotator.retaining and left():
                time.sleep(0.01)
            behind = [s for s in writer.secondaries if s.behind(writer.seq, left())]
            if not behind:
                return {}
            if not announced:
                announced = True
                logger.info("closing %s: waiting up to %.1fs for secondary(ies) %s to take a complete log",
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
        writer = self._writer
        if not self._registered or writer.failed is not None:
            return
        for secondary in writer.secondaries:
            lag = secondary.lag(writer.written_lsn, waited.get(secondary.dest.url))
            if lag is None:
                continue
            if self._behind is None:
                self._behind = {}
            self._behind[lag.url] = lag
            logger.warning(
                "secondary %s is behind the primary after close: a restore of it reaches LSN %s of the "
                "primary's %d (%s)", lag.url, "unknown" if lag.last_lsn is None else lag.last_lsn,
                lag.primary_last_lsn, lag.reason,
            )

    def _seal_and_let_go(self) -> None:
        """Write what is pending, seal the current log, let go of the writers and the lock.

        If an interruption (not an ``OSError``) stops it, the Log stays closed to updates
        but holds on to its records, writer and lock: calling it again finishes the job.
        """
        writer = self._writer
        with writer.io_lock:
            if self._let_go:
                return
            writer.stop_group()
            writer.close_to_updates()
            try:
                writer.seal()
            except Exception:
                self._let_everything_go()
                raise
            self._let_everything_go()
            writer.refuse_after_failure()

    def _wait_until_let_go(self) -> None:
        """Wait (bounded) until closing has sealed the log and let the lock go: a call told
        that the log was handed over may end the process at once."""
        self._lease.wait_let_go(HANDOVER_SEAL_WAIT)

    def _let_everything_go(self) -> None:
        # Marked let go only once all of it is (each step may be taken twice): a
        # KeyboardInterrupt in between must leave the next close() to let go of the rest,
        # not to return with the writer lock still held.
        try:
            self._writer.let_go()
        finally:
            self._lease.let_go()
        self._let_go = True

    def _closed_for_good(self) -> None:
        self._close_done = True
        self.dest.close()
        at_exit.forget(self)

    def _close_left_open(self, rotation_wait: float | None) -> None:
        """Close on behalf of an app that did not (at exit, or once collected)."""
        if self._close_done:
            return
        logger.info("closing the log at %s, which was left open", self.dest.url)
        self._close(rotation_wait)

    def _abandon(self) -> None:
        """Let everything go after a failed opening; what closing raises is only logged."""
        try:
            if hasattr(self, "_rotator"):
                self.close()
            else:
                self._lease.release()
                self.dest.close()
        except Exception as e:
            logger.debug("closing after a failed open: %s", e)

    # -- background work ----------------------------------------------------------------

    def _start_background(self) -> None:
        """Schedule the Log's background job (``_run_background``) on the runtime."""
        when = self._next_background()
        if when is not None:
            self._background.run_at(when)

    def _stop_background(self) -> None:
        """Run the background job no more, and wait for a run under way (it takes the
        writer's I/O lock, which closing takes next)."""
        self._background.cancel()
        self._background.wait_idle()

    def _run_background(self) -> float | None:
        """The background job, run by a runtime worker when due: flush what is pending,
        renew the lease, fire the signal and interval triggers. Returns when it is next
        due (None: not until pending data or a signal asks)."""
        writer = self._writer
        if writer.failed is not None or writer.closed:
            return None
        try:
            now = time.monotonic()
            writer.flush_due(now)
            self._lease.renew_due(now)
            if self._signalled:
                self._signalled = False
                self._rotator.trigger()
            self._rotator.check_interval()
            if self._handover is not None and now >= self._handover.due - 1e-3:
                self._handover.look()
        except PersistLogError as e:
            logger.debug("background flush stopped: %s", e)
            return None
        except Exception:
            logger.exception("background flush failed")
        return self._next_background()

    def _next_background(self) -> float | None:
        """When the background job is next due: the armed flush, the lease renewal, the
        interval trigger's next check, the handover watch's next look, whichever comes first."""
        handover = self._handover
        times = (
            self._rotator.next_interval_check(),
            self._writer.next_flush(),
            self._lease.next_renewal(),
            handover.due if handover is not None else None,
        )
        return min((t for t in times if t is not None), default=None)

    def _answer_handover(self, request: HandoverRequest) -> None:
        """Hand the log over to the writer that asked (on a thread of its own): the app's
        ``on_handover``, then a close, which lets the lock go. With concurrent enumeration
        the close writes a fresh snapshot first (the app's locks make an enumeration from
        this thread safe); in the default mode it does not: this thread is no quiet point,
        since an app thread may be between logging a change and applying it."""
        logger.info("handing the log at %s over to %s", self.dest.url, request.by)
        self._writer.handed_over_to(request.by)
        if self._on_handover is not None:
            try:
                self._on_handover()
            except Exception:
                logger.exception("on_handover raised; handing the log over all the same")
        try:
            self.close(rotate=self._rotator.concurrent)
        except PersistLogError as e:
            # Closed all the same (a failed enumeration keeps the last complete log).
            logger.warning("handing the log at %s over: %s", self.dest.url, e)
        except Exception:
            logger.exception("handing the log at %s over failed", self.dest.url)

    # -- the rotation signal ------------------------------------------------------------

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


def parts_of(lg: Log) -> LogParts:
    """The parts ``lg`` is made of: what a second front (``AsyncLog``) calls, the same
    calls as the Log's own."""
    return LogParts(lg._buffer, lg._writer, lg._rotator, lg._lease, lg._signal_from_loop)


__all__ = ["Log", "LogParts", "SecondaryEntry", "parts_of"]

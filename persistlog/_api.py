"""The entry points: ``persistlog.open`` (the write side) and ``persistlog.restore`` (the read
side), and what this process restored, which decides whether ``open`` may start a new log
over what a destination holds."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple, TypedDict, TypeVar

from destinations import Destination, LockHeld, WriterLock
from destinations.local import LocalDestination

from ._errors import DestinationError, ExistingLogError, PersistLogError, WriterConflict
from ._format import encoder
from ._format import constants as F
from ._format.chain import GENESIS
from ._format.codec import Codec, check_depth
from ._format.crypt import Keyring, keyring
from ._format.signing import SIGN_INTERVAL, Checkpoints, Signer
from ._read.reader import LogState, end_after_seal, end_and_chain, list_logs, log_header, newest_seal, read_pointer
from ._read.restore import RestoreResult, restore_from
from ._read.seek import lsn_at_time, utc_micros
from ._write.handover import HANDOVER_TIMEOUT, ask_for_handover
from ._write.log import Log
from ._write.retention import Retention
from ._write.rotation import EnumerateAll
from ._write.segment_writer import fence_newest_log
from ._write.settings import LogSettings, destination_at
from ._write.writer_lease import release_writer_lock

logger = logging.getLogger("persistlog")

DEFAULT_ROTATE_BYTES = 64 * 1024 * 1024
DEFAULT_SEGMENT_BYTES = 16 * 1024 * 1024
DEFAULT_BATCH_BYTES = 1024 * 1024
LEASE_TTL = 30.0


class StoreOptions(TypedDict, total=False):
    """The keyword options of :func:`open` that ``ResourceStore.open`` passes on (it sets
    ``replay_batch`` and ``concurrent_enumeration`` itself): named, so that a type checker
    catches a misspelt one."""

    durability: str
    rotate_bytes: int | None
    rotate_records: int | None
    rotate_interval: float | None
    retain: int
    retain_seconds: float | None
    retain_max_logs: int | None
    keep_for_consumers: bool
    rotate_on_signal: int | None
    metadata: Any
    codec: Codec | None
    storage_options: dict[str, Any] | None
    compression: str | None
    on_error: Callable[[BaseException], None] | None
    secondaries: list[str | os.PathLike[str] | tuple[str | os.PathLike[str], dict[str, Any] | None]] | None
    segment_bytes: int
    batch_bytes: int
    flush_interval: float | None
    lease_ttl: float
    recovery: str
    discard_existing: bool
    secondary_close_wait: float | None
    handover: bool
    handover_timeout: float
    on_handover: Callable[[], Any] | None
    hash_chain: bool
    share_values: bool
    signing_key: Any
    sign_interval: float
    key_provider: Callable[[str], Any] | None
    key_id: str | Callable[[], str] | None


class OpenOptions(StoreOptions, total=False):
    """Every keyword option of :func:`open` (what ``open_async`` takes too)."""

    replay: Callable[[Any], Any] | None
    replay_batch: Callable[[list[Any]], Any] | None
    concurrent_enumeration: bool


# Where restore() left each destination in this process: key -> (newest log seq, next LSN).
T = TypeVar("T")


class RestoredEnd(NamedTuple):
    """Where this process's last restore of a destination ended: its newest log ``seq``
    and ``next_lsn``. Where it read that log to its end unsealed, on a local disk,
    ``segments`` (its segment names), ``extent`` (how far it read the last one, a torn
    tail included) and ``chain_head`` (where its hash chain ends) let open() take that
    end as it is if nothing was written since, instead of scanning the last segment again
    (:func:`unchanged_end`); ``segments`` is None otherwise."""

    seq: int
    next_lsn: int
    segments: tuple[str, ...] | None = None
    extent: int = 0
    chain_head: bytes = GENESIS


# open() accepts a destination holding records only if it is still exactly there, i.e. this
# process replayed everything it holds and nothing was written since. One RestoredEnd per
# destination ever restored, private to the process; nothing else is kept.
_restored_at: dict[str, RestoredEnd] = {}


def destination_key(dest: Destination) -> str:
    """One name per place: a local directory by its real path, others by their URL."""
    if isinstance(dest, LocalDestination):
        return "local:" + os.path.realpath(dest.path)
    return dest.url.rstrip("/")


def restored_here(known: RestoredEnd | None, position: tuple[int, int]) -> bool:
    """Whether this process's last restore of a destination (``known``, from
    :data:`_restored_at`) ended at ``position`` (newest log seq, next LSN): then open() may
    start a new log over what is there."""
    return known is not None and (known.seq, known.next_lsn) == position


def restored_end(dest: Destination, result: RestoreResult, states: list[LogState]) -> RestoredEnd:
    """What :data:`_restored_at` keeps of a restore of ``dest`` to its end (``states``:
    what the scan learned of each log it read)."""
    seq, next_lsn = result.logs[-1], result.next_lsn
    st = states[-1] if states else None
    if (
        st is None or st.seq != seq or st.next_lsn != next_lsn or not dest.appendable or result.after_gap
        or result.skipped or st.skipped or st.sealed or st.fence is not None or not st.segments
    ):
        return RestoredEnd(seq, next_lsn)
    number, name = st.segments[-1]
    if st.position[0] != number:
        return RestoredEnd(seq, next_lsn)
    extent = st.position[1]
    if st.torn is not None:
        if st.torn.segment != name:
            return RestoredEnd(seq, next_lsn)
        extent = max(extent, st.torn.offset + st.torn.length)
    head = st.chain_head if st.chained else GENESIS
    if head is None:
        return RestoredEnd(seq, next_lsn)
    return RestoredEnd(seq, next_lsn, tuple(n for _, n in st.segments), extent, head)


def unchanged_end(
    dest: Destination, logs: dict[int, list[tuple[int, str]]], known: RestoredEnd | None
) -> tuple[int, int, bytes] | None:
    """``(newest seq, next LSN, chain head)`` of ``dest`` (listed as ``logs``, its newest log
    unsealed) as this process's last restore of it found them (``known``), if nothing was
    written there since: the newest log is the one it read, with the same segments, the
    last one no longer than it read (a local segment only grows, and any other writer
    starts a log of its own). None: scan for them."""
    if known is None or known.segments is None or not logs or max(logs) != known.seq:
        return None
    segments = logs[known.seq]
    if tuple(name for _, name in segments) != known.segments or dest.size(segments[-1][1]) != known.extent:
        return None
    return known.seq, known.next_lsn, known.chain_head


def restore(
    url: str | os.PathLike[str],
    replay: Callable[[Any], Any] | None = None,
    *,
    replay_batch: Callable[[list[Any]], Any] | None = None,
    recovery: str = "strict",
    missing_ok: bool = True,
    codec: Codec | None = None,
    storage_options: dict[str, Any] | None = None,
    to_lsn: int | None = None,
    to_time: datetime | None = None,
    key_provider: Callable[[str], Any] | Keyring | None = None,
) -> RestoreResult:
    """Replay the newest complete log at ``url`` and every newer one, in LSN order.

    ``replay(record)`` is called once per record (or ``replay_batch(records)`` with lists
    of records in LSN order: a stored batch comes as one list or several, slices that fit
    in the CPU cache). The cyclic GC is paused while the logs are replayed: the records
    decode acyclic, and only cycles the app makes meanwhile wait for it. A torn tail left by a crash is dropped and reported in the result; any other
    damage raises :class:`CorruptLogError` naming destination, log, segment and offset
    (``recovery="skip"`` passes over damage and lists it in ``result.skipped``). A missing
    or empty destination returns ``found=False`` and logs so: the default suits an app's
    first start, which restores a location it is about to create; a tool reading a log that
    must exist passes ``missing_ok=False`` and gets :class:`LogNotFoundError` for a
    mistyped path. Memory stays bounded by the largest batch.

    The process remembers where the restore ended, so that a later ``open(url, ...)`` in
    the same process, with nothing written in between, may start a new log there.

    Point in time: ``to_lsn=n`` rebuilds the state as of LSN ``n`` (record ``n`` applied,
    nothing after it), ``to_time=t`` (an aware datetime) as of commit time ``t`` (every
    batch committed at or before ``t``; a time after the last batch is the whole log). The
    replay starts at the newest log whose snapshot completed at or before that point and
    stops there; ``result.last_lsn`` is the point. A point the logs do not hold (an LSN
    before the oldest record retained or past the last, a time before the oldest record
    retained, no complete snapshot left before it) raises :class:`PositionError`, which
    names what is there. A point-in-time restore is not where the log ends, so ``open()``
    does not treat it as a restore of the destination.

    ``key_provider`` is the key provider of an encrypted log (``open(key_provider=)``); an encrypted batch
    without it, or whose key id it does not know, raises :class:`KeyUnavailableError`.
    """
    if to_lsn is not None and to_time is not None:
        raise TypeError("restore() takes to_lsn= or to_time=, not both")
    if to_lsn is not None and (isinstance(to_lsn, bool) or not isinstance(to_lsn, int)):
        raise TypeError(f"to_lsn must be an int, not {type(to_lsn).__name__}")
    if to_lsn is not None and to_lsn < 0:
        raise ValueError(f"to_lsn must be >= 0, not {to_lsn}")
    if to_time is not None:
        utc_micros(to_time)  # a naive or non-datetime value is refused before any I/O
    dest = destination_at(url, storage_options)
    try:
        if to_time is not None:
            to_lsn = lsn_at_time(dest, to_time)
        if to_lsn is not None and to_lsn < F.FIRST_LSN:
            # Before the first record ever written (nothing was deleted): the empty state.
            return RestoreResult(destination=dest.url, found=True, complete=True, next_lsn=F.FIRST_LSN)
        result, states = restore_from(
            dest, replay, replay_batch=replay_batch, recovery=recovery, missing_ok=missing_ok, codec=codec,
            to_lsn=to_lsn, keys=keyring(key_provider),
        )
    except FileNotFoundError as e:
        if isinstance(e, PersistLogError):
            raise
        raise DestinationError(
            f"a file vanished while restoring from {url} (retention by a running writer?): {e}"
        ) from e
    finally:
        dest.close()
    if result.logs and to_lsn is None:
        _restored_at[destination_key(dest)] = restored_end(dest, result, states)
    return result


def open_log(
    url: str | os.PathLike[str],
    enumerate_all: EnumerateAll,
    *,
    durability: str = "buffered",
    rotate_bytes: int | None = DEFAULT_ROTATE_BYTES,
    rotate_records: int | None = None,
    rotate_interval: float | None = None,
    retain: int = 2,
    retain_seconds: float | None = None,
    retain_max_logs: int | None = None,
    keep_for_consumers: bool = False,
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
    concurrent_enumeration: bool = False,
    secondary_close_wait: float | None = None,
    handover: bool = False,
    handover_timeout: float = HANDOVER_TIMEOUT,
    on_handover: Callable[[], Any] | None = None,
    hash_chain: bool = True,
    share_values: bool = True,
    signing_key: Any = None,
    sign_interval: float = SIGN_INTERVAL,
    key_provider: Callable[[str], Any] | None = None,
    key_id: str | Callable[[], str] | None = None,
) -> Log:
    """Open the log at ``url`` for writing and start a new log with a full enumeration.

    Opening calls ``enumerate_all(emit)``, which must call ``emit(record)`` once per live
    resource (or ``emit.many(records)`` for several at once: :class:`Emit`), and returns once that first log is complete (if it raises, the log is closed
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
    logs are kept (minimum 1), and older ones as well: those a registered consumer
    (:func:`persistlog.consumers`) has not read, with ``keep_for_consumers=True`` (the
    stored positions are read at each retention), and those holding records younger than
    ``retain_seconds``; ``retain_max_logs`` caps the logs kept in all (at least
    ``retain``), so that a consumer that stopped reading cannot fill the storage: past it
    the oldest go, and that consumer resets. ``durability`` is ``"buffered"``, ``"flush"`` or ``"fsync"``.
    ``compression`` is None, ``"gzip"`` or ``"zstd"`` (per batch). ``secondaries`` are
    more destinations (URLs or ``(url, storage_options)`` pairs) that receive every record
    through their own writer threads; ``storage_options`` apply to the primary.
    ``lease_ttl`` is how long an object-store writer lease lasts without renewal (a
    crashed writer's destination can be taken over after it). ``secondary_close_wait``
    bounds how long ``close()`` waits for a secondary that would not hold the primary's
    state (detached, or still leased by a crashed writer) to answer before it gives that
    secondary a new complete log, or gives up on it and reports it (default: ``lease_ttl``
    plus 5 s; 0 waits for none).

    When a rotation's enumeration runs: by default a fired trigger starts the rotation at
    the app's next call into the Log (``update()``, ``update_many()``; ``rotate()`` and
    ``close(rotate=True)`` start one at once), and updates from every thread wait until
    ``enumerate_all`` has returned. So ``enumerate_all`` reads a state to which every
    acknowledged update was applied: the *log, then apply* pattern is safe with no locking
    at all, from one thread (or callers serialised by one lock that ``enumerate_all`` does
    not take). An app that keeps per-resource locks, held across ``update()`` and its
    apply and taken by ``enumerate_all`` around each ``emit`` (the concurrency contract),
    passes ``concurrent_enumeration=True``: a trigger then starts the rotation at once on
    a persistlog worker thread and updates keep flowing beside the enumeration. (Without it such
    an app would wait for an enumeration that waits for the app's lock: after 10 s of
    that, the held call raises :class:`EnumerationStalled`, having logged nothing.)

    Handing over (a rolling deploy): with ``handover=True``, a log whose writer lock or
    lease another live process holds is asked of it (a ``HANDOVER`` request beside the
    lock), and ``open`` waits up to ``handover_timeout`` seconds for that writer to let go
    (else :class:`WriterConflict`); and this Log hands itself over when another process
    asks so: it calls ``on_handover()`` (on a persistlog thread; the app stops taking
    requests there), then closes (writes what is pending, seals) and lets go. With
    ``concurrent_enumeration=True`` (``ResourceStore``) it closes with ``rotate=True``,
    leaving a fresh snapshot, so that the new writer's ``open(..., replay=)`` restores one
    snapshot and needs no enumeration; in the default mode the new writer enumerates (the
    old one's enumeration would run on a persistlog thread, which is no quiet point).
    Its calls raise :class:`HandedOver` from then on, once the log is sealed: every update
    it acknowledged before is in the log the new writer restores, so the process may end
    as soon as it is told. A writer opened without ``handover=True`` ignores requests.

    ``hash_chain`` (default True) writes format version 2: every batch carries the SHA-256
    of the batch before it, across segments and logs, and each seal names the chain head
    (docs/SECURITY.md says what that proves); ``hash_chain=False`` writes version 1.
    ``share_values`` (default True, chained logs) writes format version 3: a string or byte
    string of 128 bytes or more that snapshot records repeat (one message queued for many
    subscribers) is stored once per log and referenced after that; every reader gets the
    records back as they were logged. ``share_values=False`` writes version 2.
    ``signing_key`` (an Ed25519 private key from the ``cryptography`` package, PEM bytes
    of one, or the path of a PEM file; ``pip install 'persistlog[audit]'``) signs the
    chain head in every seal and in a checkpoint written with the first batch
    ``sign_interval`` seconds or more after the last one, so that ``persistlog verify
    --public-key`` can prove the history up to the newest signed head unchanged.

    ``key_provider`` (a callable ``key_id -> 32-byte key``) with ``key_id`` (a str,
    or a callable returning the id to write with, asked at every batch) encrypts every
    record batch with AES-256-GCM under that key (``pip install 'persistlog[crypto]'``);
    the same provider reads the logs back (``restore(key_provider=)``, ``follow(key_provider=)``,
    ``--key-provider``). Control records (log headers, seals, checkpoints) stay clear;
    docs/SECURITY.md says what encryption hides and what it does not.
    """
    if not callable(enumerate_all):
        raise TypeError("enumerate_all must be a callable taking emit")
    retention = _shared(Retention(retain, keep_for_consumers, retain_seconds, retain_max_logs))
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
    if not isinstance(concurrent_enumeration, bool):
        raise TypeError(f"concurrent_enumeration must be True or False, not {concurrent_enumeration!r}")
    if (key_provider is None) != (key_id is None):
        raise TypeError("open() encrypts with key_provider= and key_id= together, or neither")
    settings = _settings(
        durability=durability,
        batch_bytes=batch_bytes,
        segment_bytes=segment_bytes,
        flush_interval=flush_interval,
        compression=compression,
        keys=None if key_provider is None else Keyring(key_provider, key_id),
        share_values=share_values,
    )
    codec = codec or Codec()
    check_depth(metadata, "metadata")
    try:
        # Exactly as the log header will hold it: plain CBOR, which every reader decodes
        # without the app's codec, so a Codec-registered object cannot go in it.
        encoder.control_batch([{"metadata": metadata}], F.FIRST_LSN, 0)
    except Exception as e:
        raise TypeError(f"metadata must be a plain CBOR value (no Codec-registered objects): {e}") from None
    dest = destination_at(url, storage_options)
    if not isinstance(lease_ttl, (int, float)) or lease_ttl <= 0:
        raise ValueError(f"lease_ttl must be a positive number of seconds, not {lease_ttl!r}")
    if secondary_close_wait is not None and (
        not isinstance(secondary_close_wait, (int, float)) or isinstance(secondary_close_wait, bool)
        or secondary_close_wait < 0
    ):
        raise ValueError(f"secondary_close_wait must be a number of seconds >= 0 or None, not {secondary_close_wait!r}")
    if not isinstance(handover, bool):
        raise TypeError(f"handover must be True or False, not {handover!r}")
    if not isinstance(hash_chain, bool):
        raise TypeError(f"hash_chain must be True or False, not {hash_chain!r}")
    if not isinstance(sign_interval, (int, float)) or isinstance(sign_interval, bool) or sign_interval <= 0:
        raise ValueError(f"sign_interval must be a positive number of seconds, not {sign_interval!r}")
    signer = None
    if signing_key is not None:
        if not hash_chain:
            raise ValueError("signing_key signs the hash chain: it needs hash_chain=True")
        signer = Signer(signing_key)
    if not isinstance(handover_timeout, (int, float)) or isinstance(handover_timeout, bool) or handover_timeout <= 0:
        raise ValueError(f"handover_timeout must be a positive number of seconds, not {handover_timeout!r}")
    if on_handover is not None and not callable(on_handover):
        raise TypeError(f"on_handover must be a callable taking no arguments, not {on_handover!r}")
    writer_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    writer_lock = _take_writer_lock(dest, writer_id, lease_ttl, float(handover_timeout) if handover else None)
    restored = None
    lg: Log | None = None
    try:
        if not dest.appendable:
            # The writer that held the lease before may be alive and about to write: its
            # log is fenced before anything is read (docs/DESIGN.md, "One writer").
            try:
                fence_newest_log(dest, writer_id)
            except OSError as e:
                raise DestinationError(f"cannot fence the newest log at {dest.url}: {e}") from e
        if replay is not None or replay_batch is not None:
            # Under the writer lock: nothing can be written between the replay and the
            # new log that takes its place.
            restored = restore(
                url, replay, replay_batch=replay_batch, recovery=recovery, codec=codec,
                storage_options=storage_options, key_provider=settings.keys,
            )
        try:
            logs = list_logs(dest)
            pointer = read_pointer(dest)
            seal = newest_seal(dest, logs)
            # A log a restore just read to its unsealed end is not scanned again.
            known = _restored_at.get(destination_key(dest))
            end = unchanged_end(dest, logs, known) if seal is None else None
            if end is not None:
                last_seq, next_lsn, chain_head = end if hash_chain else (*end[:2], None)
            elif hash_chain:
                last_seq, next_lsn, chain_head = end_and_chain(dest, logs, seal)
            else:
                (last_seq, next_lsn), chain_head = end_after_seal(dest, logs, seal), None
            after_snapshot = (
                not discard_existing and not secondaries
                and _fresh_snapshot(dest, logs, pointer, seal, restored, metadata)
            )
        except OSError as e:
            raise DestinationError(f"cannot read {dest.url}: {e}") from e
        holds_records = next_lsn > F.FIRST_LSN
        if holds_records and not discard_existing and not restored_here(known, (last_seq, next_lsn)):
            raise ExistingLogError(
                f"{dest.url} holds logs up to log {last_seq} (next LSN {next_lsn}) that this "
                "process did not restore; opening would start a new log without them and "
                "retention would delete them. Restore first: persistlog.open(url, "
                "enumerate_all, replay=apply) (or replay_batch=), or persistlog.restore(url, "
                "apply) then persistlog.open(url, ...) with nothing written in between; "
                "pass discard_existing=True to start over on purpose"
            )
        # In the try: a Ctrl-C before the Log's own clean-up takes over (building its
        # arguments, entering its constructor) lets the lock go too (a second release is
        # a no-op).
        lg = Log(
            dest,
            enumerate_all,
            settings=settings,
            codec=codec,
            metadata=metadata,
            writer_id=writer_id,
            writer_lock=writer_lock,
            lease_ttl=float(lease_ttl),
            last_seq=last_seq,
            next_lsn=next_lsn,
            complete_logs=[pointer] if pointer is not None and pointer in logs else [],
            rotate_bytes=rotate_bytes,
            rotate_records=rotate_records,
            rotate_interval=rotate_interval,
            retention=retention,
            on_error=on_error,
            secondaries=secondaries or [],
            rotate_on_signal=rotate_on_signal,
            restored=restored,
            after_snapshot=after_snapshot,
            concurrent_enumeration=concurrent_enumeration,
            secondary_close_wait=None if secondary_close_wait is None else float(secondary_close_wait),
            handover=handover,
            on_handover=on_handover,
            chain_head=chain_head,
            checkpoints=Checkpoints(signer, float(sign_interval)),
        )
        logger.info("opened %s for writing at log %d (next LSN %d)", dest.url, lg.seq, lg.next_lsn)
    except BaseException:
        try:
            if lg is not None:
                lg.close()  # opened, then interrupted before the caller had it
            else:
                release_writer_lock(writer_lock, dest.url)
                dest.close()
        except Exception as e:
            logger.debug("closing after a failed open: %s", e)
        raise
    return lg


# Logs opened with the same options share one (immutable) Retention and LogSettings: a
# process may hold thousands of Logs opened alike (a LogSet). A few kinds are kept.
_SHARED_KINDS = 64
_retentions: dict[Any, Any] = {}
_settings_by_options: dict[Any, Any] = {}


def _one_of(kinds: dict[Any, Any], key: Any, value: T) -> T:
    """The value ``kinds`` holds under ``key``, else ``value`` (kept there while few are)."""
    shared: T | None = kinds.get(key)
    if shared is not None:
        return shared
    if len(kinds) < _SHARED_KINDS:
        kinds[key] = value
    return value


def _shared(retention: Retention) -> Retention:
    """An equal Retention made before, if any (else this one)."""
    return _one_of(_retentions, retention, retention)


def _settings(*, keys: Keyring | None, **options: Any) -> LogSettings:
    """The checked LogSettings of ``options``: one made before with the same options
    (without encryption keys, whose provider is the app's object), if any."""
    settings = LogSettings(keys=keys, **options)  # checked (and refused) as given
    if keys is not None:
        return settings
    # By type too: a refused True must not find the settings of an accepted 1.
    key = tuple((name, type(value), value) for name, value in sorted(options.items()))
    return _one_of(_settings_by_options, key, settings)


def _fresh_snapshot(
    dest: Destination, logs: dict[int, list[tuple[int, str]]], pointer: int | None,
    seal: dict[str, Any] | None, restored: RestoreResult | None, metadata: Any,
) -> bool:
    """Whether the newest log (sealed with ``seal``, if it is), just replayed by open()
    itself, is a complete log holding its snapshot and nothing after it (as
    ``close(rotate=True)`` leaves it), with the metadata the app opens with: then it can
    stay the restore point, and an opening enumeration would write the same state again."""
    if restored is None or not restored.complete or restored.skipped or not logs:
        return False
    seq = max(logs)
    if restored.logs != [seq] or pointer != seq:
        return False
    if seal is None or seal.get(F.SEAL_COMPLETE_LSN) != seal["next_lsn"]:
        return False
    header = log_header(dest, logs[seq])
    return header is not None and header.get("metadata") == metadata


def _take_writer_lock(dest: Destination, writer_id: str, ttl: float, handover_timeout: float | None) -> WriterLock:
    """The destination's writer lock; a held one is asked for (``handover_timeout``
    seconds at most) when the caller opens with ``handover=True``."""
    try:
        dest.ensure()
        try:
            return dest.lock(writer_id, ttl)
        except LockHeld as e:
            if handover_timeout is None:
                raise WriterConflict(
                    f"{e}; a destination has one writer at a time (open with handover=True to ask "
                    "a live writer that opened with it to hand the log over)"
                ) from e
            return ask_for_handover(dest, writer_id, ttl, handover_timeout, e)
    except OSError as e:
        raise DestinationError(f"cannot open {dest.url} for writing: {e}") from e


__all__ = ["OpenOptions", "StoreOptions", "open_log", "restore"]

"""Reading logs from a destination, batch by batch, in bounded memory.

This is where the decoder meets storage and where damage is classified: the last batch of
the last segment of an unsealed log on an appendable destination may be torn by a crash (it
is dropped and reported); anything else that fails a check is corruption. Every reader of
logs (restore, follower, CLI, Spark) goes through :class:`LogScanner`.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from destinations import Destination, open_destination, subdirectories

from .._errors import CorruptLogError, DestinationError, KeyUnavailableError, LogNotFoundError, MissingDependencyError
from .._format import constants as F
from .._format.chain import OFFLOAD_BYTES, hash_soon
from .._format.crypt import OPAQUE, Keyring
from .._format.decoder import (
    BatchHeader,
    CheckedBatch,
    Damage,
    RecordKinds,
    RecordSlices,
    check_payload,
    checked_run,
    key_id_of,
    control_records,
    parse_batch_header,
    parse_closed_note,
    parse_log_set_marker,
    parse_pointer,
    parse_segment_header,
    parse_trailer,
    record_slices,
    split_records,
)
from .._format.encoder import seal_trailer
from .._format.log_set_layout import key_name, name_key, shards
from .._format.shared_values import ValueTable

logger = logging.getLogger("persistlog")

READ_CHUNK = 4 * 1024 * 1024
# A log header batch is small unless the app's metadata is big: one read usually holds it.
HEADER_PEEK = 1024

RECOVERY_MODES = ("strict", "skip")

#: How many times a reader that starts again from the newest complete log (a follower's
#: reset, a stream's ``onRetentionGap=restore``) tries when retention deletes that log
#: under it too, before it gives up with :func:`outrun`.
RESYNC_ATTEMPTS = 5

#: Where a scan resumes: (segment number, byte offset, the LSN due there). The LSN is None
#: at a segment's start, whose header names it.
ScanStart = tuple[int, int, int | None]

# Filesystems zero-fill what a crash lost in whole blocks.
_FS_BLOCK = 4096


@dataclass(slots=True)
class Batch:
    """One decoded-on-demand batch and where it sits."""

    log: int
    segment: int
    offset: int
    header: BatchHeader
    raw: bytes
    controls: list[dict[str, Any]] | None = None
    #: The hash link the batch carries (format version 2), None in a version 1 log.
    link: bytes | None = None

    @property
    def first_lsn(self) -> int:
        return self.header.first_lsn

    @property
    def end(self) -> int:
        return self.offset + self.header.size

    @property
    def is_control(self) -> bool:
        return self.controls is not None

    def records(self, loads: Callable[[bytes], Any]) -> list[Any]:
        """The app records, decoded with ``loads`` (a Codec's)."""
        return split_records(self.header, self.raw, self.offset, loads)[0]

    def record_slices(self, loads: Callable[[bytes], Any], *, plain: bool = True) -> RecordSlices:
        """The app records in cache-sized slices (decoded with ``loads``, a Codec's) as
        they are iterated: how readers that apply records and drop them decode.
        ``plain=False`` for a ``loads`` whose values differ from cbor2's on tag-free CBOR."""
        return record_slices(self.header, self.raw, self.offset, loads, plain=plain)

    def numbered_records(self, loads: Callable[[bytes], Any]) -> Iterator[tuple[int, str, Any]]:
        """``(LSN, kind, record)`` of each app record, decoded slice by slice as iterated
        (``kind``: ``"update"`` or ``"snapshot"``)."""
        slices = self.record_slices(loads)
        kinds = slices.kinds()
        for first, records in slices:
            for j, record in enumerate(records, first):
                yield self.header.first_lsn + j, kinds[j], record

    def records_and_kinds(self, loads: Callable[[bytes], Any]) -> tuple[list[Any], RecordKinds]:
        """The app records, and the kind of each (``"update"`` or ``"snapshot"``)."""
        records, bitmap = split_records(self.header, self.raw, self.offset, loads)
        return records, RecordKinds(self.header.kind, bitmap, len(records))


@dataclass(slots=True)
class TornTail:
    """A crash artefact that was dropped: ``length`` bytes from ``offset`` of ``segment``."""

    log: int
    segment: str
    offset: int
    length: int
    reason: str


@dataclass(slots=True)
class Skipped:
    """Damage passed over in ``recovery="skip"`` mode."""

    log: int
    segment: str
    offset: int
    length: int
    reason: str


@dataclass(slots=True)
class LogState:
    """What a scan learned about one log."""

    seq: int
    segments: list[tuple[int, str]]
    header: dict[str, Any] | None = None
    first_lsn: int | None = None
    next_lsn: int | None = None
    complete_lsn: int | None = None
    sealed: bool = False
    seal: dict[str, Any] | None = None
    # The fence record that ends the log: a writer that took the destination over wrote
    # it where this log's writer would have written its next segment.
    fence: dict[str, Any] | None = None
    records: int = 0
    first_commit_us: int | None = None
    last_commit_us: int | None = None
    torn: TornTail | None = None
    skipped: list[Skipped] = field(default_factory=list)
    # The log does not chain to the one before it, and its header says the writer left
    # that gap (it read nothing of the log: what follows a gap is no continuation).
    after_gap: bool = False
    # Where the scan stopped: segment number and offset of the next byte to read.
    position: tuple[int, int] = (0, 0)
    # Format version 2: the log's batches carry hash links (docs/FORMAT.md, "Hash chain").
    chained: bool = False
    # The format version of the log's segments (None: not read, the scan resumed inside a
    # segment).
    version: int | None = None
    # The link of the log's first batch (its header): the chain head of the log before it.
    first_link: bytes | None = None
    # The chain head where the scan stopped (the hash of the last batch that moves it):
    # :attr:`chain_head`, which a big batch's hash still being computed makes wait.
    _head: bytes | Future[bytes] | None = None
    # Encrypted batches read, and how many of them were not opened (structure-only keys):
    # their CRCs and links were checked, their GCM tags not.
    encrypted: int = 0
    unopened: int = 0
    # The key ids those batches name, in the order first met (never the keys).
    key_ids: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.complete_lsn is not None

    @property
    def chain_head(self) -> bytes | None:
        """The chain head where the scan stopped: the hash of the last batch that moves it."""
        head = self._head
        if isinstance(head, Future):
            head = self._head = head.result()
        return head

    def move_head(self, head: bytes | Future[bytes] | None) -> None:
        """Move the chain head (a hash, or one being computed: :func:`chain.hash_soon`)."""
        self._head = head


class SegmentGone(FileNotFoundError):
    """Segment ``segment`` of log ``seq`` is not there: a scan was reading it or about to.

    A ``FileNotFoundError``, so that callers that only know "a file vanished" keep working;
    :func:`retention_gap` tells a reader what it means."""

    def __init__(self, url: str, seq: int, segment: int) -> None:
        name = F.segment_name(seq, segment)
        super().__init__(errno.ENOENT, f"log {seq} segment {segment} is gone", f"{url}/{name}")
        self.seq = seq
        self.segment = segment


@dataclass(frozen=True)
class RetentionGap:
    """Retention deleted log ``seq`` from segment ``segment`` on; ``newest`` is the
    complete log CURRENT names now."""

    seq: int
    segment: int
    newest: int

    def __str__(self) -> str:
        return (f"log {self.seq} segment {self.segment} was deleted by retention "
                f"(the newest complete log is {self.newest})")


def retention_gap(dest: Destination, seq: int, segment: int) -> RetentionGap | None:
    """Why segment ``segment`` of log ``seq`` is missing, for a reader that found it gone
    (or was pointed at it): the one place where "vanished under me" is told apart.

    A :class:`RetentionGap` when retention deleted it: CURRENT names a later log
    (retention deletes only after CURRENT moved past what it deletes) and no segment of
    log ``seq`` after ``segment`` is left (retention deletes a log's segments last first,
    so a deletion under way leaves a prefix). Raises :class:`CorruptLogError` when a later
    segment of the log is still there: a segment missing in the middle of a log is damage.
    None otherwise: the log ends before that segment (a cursor ahead of the log)."""
    left = list_logs(dest).get(seq, [])
    later = [name for number, name in left if number > segment]
    if later:
        raise CorruptLogError(
            f"segment {segment} is missing from the middle of the log ({later[0]} is there)",
            destination=dest.url, log=seq, segment=F.segment_name(seq, segment), offset=0,
        )
    newest = read_pointer(dest)
    if newest is not None and newest > seq:
        return RetentionGap(seq, segment, newest)
    return None


def outrun(url: str, attempts: int) -> DestinationError:
    """The error of a reader that started again from the newest complete log ``attempts``
    times and saw retention delete it under it each time."""
    return DestinationError(
        f"cannot catch up with {url}: retention deleted the newest complete log while it was "
        f"read, {attempts} times in a row (the writer rotates faster than this reader reads "
        "one log: keep more logs with a larger retain, or read faster)"
    )


def list_logs(dest: Destination) -> dict[int, list[tuple[int, str]]]:
    """``{seq: [(segment number, name), ...]}`` in order, from one fresh listing."""
    try:
        names = dest.list()
    except OSError as e:
        raise DestinationError(f"cannot list {dest.url}: {e}") from e
    return _logs_named(names)


def list_logs_sized(dest: Destination) -> tuple[dict[int, list[tuple[int, str]]], dict[str, int]]:
    """:func:`list_logs` and the size of every segment it lists, by name, from the same
    listing (``Destination.list_sizes``: on S3 the sizes come with the names, where a HEAD
    per segment would cost a request each)."""
    try:
        sizes = dest.list_sizes()
    except OSError as e:
        raise DestinationError(f"cannot list {dest.url}: {e}") from e
    logs = _logs_named(sizes)
    return logs, {name: sizes[name] for segments in logs.values() for _number, name in segments}


def _logs_named(names: Iterable[str]) -> dict[int, list[tuple[int, str]]]:
    logs: dict[int, list[tuple[int, str]]] = {}
    for name in names:
        parsed = F.parse_segment_name(name)
        if parsed is not None:
            logs.setdefault(parsed[0], []).append((parsed[1], name))
    return dict(sorted(logs.items()))


def why_no_log(dest: Destination) -> str | None:
    """None when ``dest`` holds a log (a segment or CURRENT), else what it holds instead, in
    a few words for an error message ("the directory does not exist", "it is empty", ...).
    Reads only: one listing, and when it is empty an existence check and a listing of the
    directories."""
    try:
        names = dest.list()
    except FileNotFoundError:
        return _missing(dest)
    if any(F.parse_segment_name(n) is not None for n in names) or F.CURRENT_NAME in names:
        return None
    if F.LOG_SET_NAME in names:
        return (f"it is the root of a log set ({F.LOG_SET_NAME}); name one log of it, a key's "
                "(persistlog.LogSet(root).url(key)), or read the whole set with Spark")
    if names:
        return f"it holds {len(names)} other file{'s' if len(names) != 1 else ''} ({_first_few(names)}) and no log segment"
    if not dest.exists():
        return _missing(dest)
    try:
        dirs = subdirectories(dest.url, dest.storage_options)
    except (OSError, ValueError):
        dirs = []
    if dirs:
        return (f"it holds {len(dirs)} director{'ies' if len(dirs) != 1 else 'y'} ({_first_few([f'{d}/' for d in dirs])}) "
                "and no log segment: a directory above a log (a log set's shard?); name the log's own directory")
    return "it is empty"


def _missing(dest: Destination) -> str:
    """What a missing location is: the destination's words, and where the log is when the
    location names a key of a log set without its shards (``root/alice`` for the log at
    ``root/2b/alice``)."""
    missing = dest.describe_missing()
    parent, _, name = dest.url.rstrip("/").rpartition("/")
    if not parent or not name:
        return missing
    key = name_key(name) or name
    try:
        root = open_destination(parent, **dest.storage_options)
    except (OSError, ValueError):
        return missing
    try:
        depth = parse_log_set_marker(root.read(F.LOG_SET_NAME, 0, F.LOG_SET_SIZE + 1))
        there = "/".join([parent, *shards(key, depth), key_name(key)])
        log = open_destination(there, **dest.storage_options)
        try:
            found = log.exists()
        finally:
            log.close()
    except (OSError, ValueError, Damage):
        return missing
    finally:
        root.close()
    where = f"the log of key {key!r} is {there}" if found else f"key {key!r} has no log in it (it would be {there})"
    return f"{missing}; {parent} is the root of a log set ({F.LOG_SET_NAME}): {where}"


def _first_few(names: list[str]) -> str:
    """The first three of ``names``, and "..." for the rest, for a message."""
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def no_log(dest: Destination, advice: str = "") -> LogNotFoundError:
    """The error for a reader of a log at ``dest`` that holds none: names the URL and what
    is there instead (:func:`why_no_log`), then the reader's own ``advice`` if given, so
    that a mistyped path never reads as an empty history."""
    why = why_no_log(dest) or "it holds no log segment"
    return LogNotFoundError(f"no persistlog log at {dest.url}: {why}" + (f"; {advice}" if advice else ""))


def newer_log(dest: Destination, seq: int) -> int | None:
    """The oldest log at ``dest`` newer than log ``seq``, None if there is none: from a
    listing of the names after every name log ``seq`` can have (one request on S3 while
    there is none). Storage errors propagate as they are (``OSError``)."""
    after = dest.list(start_after=F.segment_name(seq, 10**F.SEGMENT_DIGITS - 1))
    seqs = [parsed[0] for parsed in map(F.parse_segment_name, after) if parsed is not None]
    return min(seqs, default=None)


def read_pointer(dest: Destination) -> int | None:
    """The seq CURRENT names, or None when it is missing or damaged (never fatal)."""
    try:
        data = dest.read(F.CURRENT_NAME, 0, F.MAX_POINTER_BYTES)
    except FileNotFoundError:
        return None
    except OSError as e:
        logger.warning("cannot read %s/CURRENT (%s); falling back to listing", dest.url, e)
        return None
    seq = parse_pointer(data)
    if seq is None:
        logger.warning("%s/CURRENT is damaged; falling back to listing", dest.url)
    return seq


def closed_end(dest: Destination, seq: int) -> int | None:
    """The next LSN of log ``seq`` if CLOSED says a clean close sealed it there (a file
    that is missing, damaged or names another log says nothing)."""
    try:
        note = parse_closed_note(dest.read(F.CLOSED_NAME, 0, F.CLOSED_SIZE + 1))
    except OSError:
        return None
    return note[1] if note is not None and note[0] == seq else None


def header_record(batch: bytes, offset: int = F.SEGMENT_HEADER_SIZE) -> dict[str, Any] | None:
    """The log header control record framed in ``batch`` (None if it holds none)."""
    try:
        head = parse_batch_header(batch[:F.BATCH_HEADER_SIZE], offset)
        if head.kind != F.KIND_CONTROL or len(batch) < head.size:
            return None
        raw = check_payload(head, batch[F.BATCH_HEADER_SIZE:head.size], offset)
        records = control_records(head, raw, offset)
    except Damage:
        return None
    return next((c for c in records if c["t"] == F.CONTROL_HEADER), None)


def log_header(dest: Destination, segments: list[tuple[int, str]]) -> dict[str, Any] | None:
    """The header record of the log made of ``segments``; None if it cannot be read.

    Reads the start of its first segment only (one small read, two for a big header)."""
    if not segments or segments[0][0] != 0:
        return None
    seg = SegmentBytes(dest, segments[0][1], 0, chunk=HEADER_PEEK)
    try:
        seg.size = dest.size(seg.name) if dest.appendable else F.SEGMENT_HEADER_SIZE + F.MAX_BATCH_BYTES
        return _header_in(seg)
    except OSError:
        return None


def declares_gap(dest: Destination, segments: list[tuple[int, str]]) -> bool:
    """Whether the log made of ``segments`` says in its header that it follows a gap."""
    header = log_header(dest, segments)
    return bool(header and header.get(F.HEADER_AFTER_GAP) is True)


def _header_in(seg: SegmentBytes) -> dict[str, Any] | None:
    head = seg.get(F.SEGMENT_HEADER_SIZE, F.BATCH_HEADER_SIZE)
    try:
        size = parse_batch_header(head, F.SEGMENT_HEADER_SIZE).size
    except Damage:
        return None
    if size > F.MAX_BATCH_BYTES:
        return None
    return header_record(seg.get(F.SEGMENT_HEADER_SIZE, size))


#: Reads while walking batch headers: small, since most of a window is payload skipped.
WALK_CHUNK = 64 * 1024


@dataclass(slots=True)
class HeaderWalk:
    """What one pass over a segment's batch headers found, reading the payloads of control
    batches only: the segment's first LSN, the log's header record (in segment 0), the
    snapshot-complete marker, and where each batch starts (when asked for).

    Damage ends a walk quietly (``damage`` says what and where): planning reads little and
    trusts nothing it did not check; a :class:`LogScanner` reads every byte and reports it.
    """

    first_lsn: int | None = None
    header: dict[str, Any] | None = None
    #: The last LSN of the snapshot (the complete marker's first LSN minus one).
    complete_lsn: int | None = None
    #: The hash link of the log's first batch (segment 0 of a chained log only): the chain
    #: head of the log before it, as this log's writer saw it.
    first_link: bytes | None = None
    #: ``(offset, first LSN, size)`` of every batch walked, when asked for.
    batches: list[tuple[int, int, int]] | None = None
    #: The walk reached the end of the segment, or damage: nothing after it is left to walk.
    done: bool = False
    damage: Damage | None = None

    @property
    def after_gap(self) -> bool:
        """Whether the log's header says that its writer left a gap before it."""
        return self.header is not None and self.header.get(F.HEADER_AFTER_GAP) is True


def walk_headers(
    dest: Destination,
    seq: int,
    number: int,
    name: str,
    size: int | None,
    *,
    whole: bool = False,
    limit: int | None = None,
) -> HeaderWalk:
    """One pass over the batch headers of segment ``number`` of log ``seq`` (``size``
    bytes; None: not known, the reads find the end).

    It stops at the complete marker unless ``whole`` (then it notes every batch), and
    before the first batch after the log's header that starts at or past ``limit`` bytes
    (then ``done`` is False): a plan reads the start of every log once (one read of up to
    ``limit`` bytes), and walks on only where it must."""
    walk = HeaderWalk(batches=[] if whole else None)
    end = F.SEGMENT_HEADER_SIZE + F.MAX_BATCH_BYTES if size is None else size
    chunk = WALK_CHUNK if limit is None else max(min(limit, WALK_CHUNK), F.SEGMENT_HEADER_SIZE + F.BATCH_HEADER_SIZE)
    w = SegmentBytes(dest, name, end, chunk=chunk)
    pos = 0
    try:
        sh = parse_segment_header(w.get(0, F.SEGMENT_HEADER_SIZE))
        if sh.seq != seq or sh.segment != number:
            raise Damage(f"segment header says log {sh.seq} segment {sh.segment}", 0)
        walk.first_lsn = sh.first_lsn
        pos = F.SEGMENT_HEADER_SIZE
        while pos < end:
            if limit is not None and pos >= limit and pos > F.SEGMENT_HEADER_SIZE and not whole:
                return walk
            head = w.get(pos, F.BATCH_HEADER_SIZE)
            if size is None and len(head) < F.BATCH_HEADER_SIZE and not any(head):
                break  # the end of a segment whose size was not known
            h = parse_batch_header(head, pos)
            if pos + h.size > end:
                break
            if walk.batches is not None:
                walk.batches.append((pos, h.first_lsn, h.size))
            if number == 0 and pos == F.SEGMENT_HEADER_SIZE and h.linked and h.stored_len >= F.LINK_SIZE:
                walk.first_link = bytes(w.get(pos + F.BATCH_HEADER_SIZE, F.LINK_SIZE))
            if h.kind == F.KIND_CONTROL and walk.complete_lsn is None:
                raw = check_payload(h, w.get(pos + F.BATCH_HEADER_SIZE, h.stored_len), pos)
                for c in control_records(h, raw, pos):
                    if c["t"] == F.CONTROL_HEADER and number == 0 and walk.header is None:
                        walk.header = c
                    elif c["t"] == F.CONTROL_COMPLETE:
                        walk.complete_lsn = h.first_lsn - 1
                if walk.complete_lsn is not None and not whole:
                    walk.done = True
                    return walk
            pos += h.size
    except Damage as d:
        walk.damage = d
        logger.debug("walk of %s/%s stopped at %d: %s", dest.url, name, d.offset, d.reason)
    walk.done = True
    return walk


class SegmentBytes:
    """A sliding window over one segment, refilled in large reads."""

    def __init__(self, dest: Destination, name: str, size: int, chunk: int = READ_CHUNK) -> None:
        self.dest = dest
        self.name = name
        self.size = size
        self.chunk = chunk
        self.base = 0
        self.buf = b""

    @classmethod
    def open(
        cls, dest: Destination, name: str, offset: int, chunk: int = READ_CHUNK, size: int | None = None
    ) -> SegmentBytes:
        """The window over segment ``name`` from ``offset`` (``size``: its size if known)."""
        if size is not None:
            return cls(dest, name, size, chunk)
        if dest.appendable:
            return cls(dest, name, dest.size(name), chunk)
        # Objects never change once written: one ranged GET both sizes a small object and
        # reads it, where a HEAD first would double the requests of every poll.
        data = dest.read(name, offset, chunk)
        size = offset + len(data) if len(data) < chunk else dest.size(name)
        seg = cls(dest, name, size, chunk)
        seg.base, seg.buf = offset, data
        return seg

    def get(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset`` (short only at the end of the segment)."""
        end = min(offset + length, self.size)
        if offset < self.base or end > self.base + len(self.buf):
            keep = self.buf[offset - self.base:] if self.base <= offset < self.base + len(self.buf) else b""
            start = offset + len(keep)
            want = max(end - start, self.chunk)
            want = min(want, self.size - start)
            more = self.dest.read(self.name, start, want) if want > 0 else b""
            self.buf = keep + more
            self.base = offset
        lo = offset - self.base
        return self.buf[lo: lo + (end - offset)]


class LogScanner:
    """Iterates the batches of one log, checking every byte and the LSN chain.

    After iteration ``state`` says whether the log is complete or sealed, where it ends,
    and what torn tail (if any) was dropped. In strict mode any corruption raises
    :class:`CorruptLogError`; in ``"skip"`` mode it is recorded in ``state.skipped`` and
    the scan goes on. With ``tail_ok`` (followers), a torn-looking end of the last segment
    is treated as "not written yet": the scan stops before it without reporting it.
    ``read_chunk`` is the least a read of storage asks for: a reader that stops after a
    batch or two (a point read at a known position) asks for less than a whole scan.
    ``sizes`` (by segment name) are sizes the caller listed already (a plan's listing):
    each segment named there is read up to that size without asking the destination, so a
    segment that grew since is read as it was listed (its end, cut inside a batch being
    written, reads as a torn tail).
    """

    def __init__(
        self,
        dest: Destination,
        seq: int,
        segments: list[tuple[int, str]],
        *,
        recovery: str = "strict",
        expect_first_lsn: int | None = None,
        expect_link: bytes | None = None,
        start: ScanStart | None = None,
        tail_ok: bool = False,
        more_segments: bool = False,
        read_chunk: int = READ_CHUNK,
        keys: Keyring | None = None,
        values: ValueTable | None = None,
        stop_at: tuple[int, int] | None = None,
        sizes: Mapping[str, int] | None = None,
    ) -> None:
        if recovery not in RECOVERY_MODES:
            raise ValueError(f"recovery must be one of {RECOVERY_MODES}, not {recovery!r}")
        self.dest = dest
        self.seq = seq
        self.segments = segments
        self.recovery = recovery
        self.expect_first_lsn = expect_first_lsn
        # What the first batch read must link to: the chain head of the log before this
        # one, or with ``start`` the hash of the batch before that position (None: not
        # known, or not chained; the first link is taken as given).
        self.expect_link = expect_link
        self.start = start
        # The link the next batch must carry (None: taken as given; a future: the hash of a
        # big batch being computed, see _next_link), and where the batch it is the hash of sits.
        self._link: bytes | Future[bytes] | None = None
        self._linked_from: tuple[str, int] | None = None
        self._version: int | None = None
        self.tail_ok = tail_ok
        # True when the caller knows a later segment exists beyond those given, so that
        # none of them may end in a torn tail.
        self.more_segments = more_segments
        self.read_chunk = read_chunk
        # The keys of an encrypted log (None: a batch that is encrypted raises
        # KeyUnavailableError; ``crypt.OPAQUE``: structure only, payloads stay shut).
        self.keys = keys
        # The values the log shares (format version 3), defined before where the scan is:
        # a scan that starts inside the log takes ``values`` if they reach its start, and
        # otherwise reads the log from its start to there the first time it needs them.
        if start is None or (start[0] == 0 and start[1] <= F.SEGMENT_HEADER_SIZE):
            self.values = ValueTable((seq, 0, 0))
        elif values is not None and values.resume(seq, start[0], start[1]):
            self.values = values
        else:
            self.values = ValueTable()
        # A scan that stops before the batch at (segment, offset): priming a table.
        self.stop_at = stop_at
        # Segment sizes the caller listed (by name): each is read up to there, unasked.
        self.sizes = sizes
        self.state = LogState(seq=seq, segments=segments)

    # -- errors -------------------------------------------------------------------------

    def _corrupt(self, reason: str, name: str, offset: int, length: int = 0) -> None:
        if self.recovery == "skip":
            logger.warning("skipping damage in %s log %d %s at %d: %s", self.dest.url, self.seq, name, offset, reason)
            self.state.skipped.append(Skipped(self.seq, name, offset, length, reason))
            return
        raise CorruptLogError(reason, destination=self.dest.url, log=self.seq, segment=name, offset=offset)

    def _read_error(self, name: str, e: OSError) -> DestinationError:
        return DestinationError(f"cannot read {self.dest.url}/{name}: {e}")

    # -- scanning -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        st = self.state
        expected_numbers = list(range(self.segments[0][0], self.segments[0][0] + len(self.segments)))
        numbers = [n for n, _ in self.segments]
        if self.start is None and numbers and numbers[0] != 0:
            self._corrupt(f"log starts at segment {numbers[0]}, segment 0 is missing", self.segments[0][1], 0)
        if numbers != expected_numbers:
            missing = sorted(set(expected_numbers) - set(numbers))
            self._corrupt(f"segment(s) {missing} missing from the middle of the log", self.segments[-1][1], 0)
        next_lsn = self.expect_first_lsn
        self._link = self.expect_link
        if self.start is not None:
            next_lsn = self.start[2]
        last_index = len(self.segments) - 1
        for index, (number, name) in enumerate(self.segments):
            if self.start is not None and number < self.start[0]:
                continue
            if self.stop_at is not None and number > self.stop_at[0]:
                break
            resume = self.start[1] if self.start is not None and number == self.start[0] else 0
            try:
                seg = SegmentBytes.open(
                    self.dest, name, resume, self.read_chunk, None if self.sizes is None else self.sizes.get(name)
                )
                yield from self._scan_segment(
                    seg, number, index == last_index and not self.more_segments, resume, next_lsn
                )
            except FileNotFoundError as e:
                raise SegmentGone(self.dest.url, self.seq, number) from e
            except OSError as e:
                raise self._read_error(name, e) from e
            if st.after_gap:
                break
            next_lsn = st.next_lsn
            if st.sealed or st.torn is not None or st.fence is not None:
                if index != last_index:
                    end = "fence" if st.fence is not None else "seal or torn tail"
                    self._corrupt(f"log continues after its {end}", self.segments[index + 1][1], 0)
                break

    def _scan_segment(
        self, seg: SegmentBytes, number: int, last: bool, resume: int, next_lsn: int | None
    ) -> Iterator[Batch]:
        st = self.state
        name = seg.name
        if resume == 0:
            try:
                sh = parse_segment_header(seg.get(0, F.SEGMENT_HEADER_SIZE))
            except Damage as d:
                if self.tail_ok and last and seg.size < F.SEGMENT_HEADER_SIZE:
                    st.position = (number, 0)
                    return
                self._corrupt(d.reason, name, d.offset, seg.size)
                st.position = (number, seg.size)
                return
            if sh.seq != self.seq or sh.segment != number:
                self._corrupt(
                    f"segment header says log {sh.seq} segment {sh.segment}", name, 0, seg.size
                )
            if next_lsn is not None and sh.first_lsn != next_lsn:
                log_head = _header_in(seg) if number == 0 else None
                if log_head is not None and log_head.get(F.HEADER_AFTER_GAP) is True:
                    st.after_gap = True
                    st.position = (number, 0)
                    return
                self._corrupt(f"segment starts at LSN {sh.first_lsn}, expected {next_lsn}", name, 0)
            if next_lsn is None:
                next_lsn = sh.first_lsn
                st.first_lsn = sh.first_lsn
            if self._version is None or st.version is None:
                if self._version is not None and (self._version >= F.CHAINED_VERSION) != (sh.version >= F.CHAINED_VERSION):
                    self._corrupt(f"segment of format version {sh.version} in a log of version {self._version}", name, 0)
                self._version = st.version = sh.version
                st.chained = sh.version >= F.CHAINED_VERSION
            elif sh.version != self._version:
                self._corrupt(f"segment of format version {sh.version} in a log of version {self._version}", name, 0)
            pos = F.SEGMENT_HEADER_SIZE
        else:
            pos = resume
        st.next_lsn = next_lsn
        st.position = (number, pos)
        size = seg.size
        values = self.values
        stop = self.stop_at[1] if self.stop_at is not None and self.stop_at[0] == number else size
        # The batches ahead that the decoder checked in C in one call (checked_run),
        # and how many of them were taken. The first batch it does not vouch for is read
        # here one check at a time, and the next run starts after it.
        run: list[CheckedBatch] = []
        taken = 0
        while pos < size:
            if self.stop_at is not None and (number, pos) >= self.stop_at:
                return
            end = size
            link: bytes | None
            digest: bytes | Future[bytes] | None
            controls: list[dict[str, Any]] | None
            try:
                if taken == len(run) and not isinstance(self._link, Future):
                    run = checked_run(seg.buf, seg.base, pos, stop, size, self._link, st.chained, OFFLOAD_BYTES)
                    taken = 0
                if taken < len(run):
                    # Checked in C: what is left is what follows the checks.
                    end, header, raw, link, digest = run[taken]
                    taken += 1
                    stored, vouched = raw, True
                    if values.at is not None:
                        values.reading(self.seq, number, pos)
                else:
                    vouched = False
                    head_bytes = seg.get(pos, F.BATCH_HEADER_SIZE)
                    header = parse_batch_header(head_bytes, pos)
                    end = pos + header.size
                    if end > size:
                        raise Damage(
                            f"batch of {header.size} bytes runs past the end of the segment ({size} bytes)",
                            pos,
                            torn_shape=True,
                        )
                    parts: tuple[bytes, ...]
                    if header.linked and not header.flags & F.FLAG_ENCRYPTED:
                        # The link read apart from what follows it: cutting it off would copy the
                        # payload. (An encrypted batch is opened whole: its link is in the AAD.)
                        link = seg.get(pos + F.BATCH_HEADER_SIZE, F.LINK_SIZE)
                        stored = seg.get(pos + F.BATCH_HEADER_SIZE + F.LINK_SIZE, max(0, header.stored_len - F.LINK_SIZE))
                        apart, parts = link, (head_bytes, link, stored)
                    else:
                        stored = seg.get(pos + F.BATCH_HEADER_SIZE, header.stored_len)
                        link = stored[: F.LINK_SIZE] if header.linked else None
                        apart, parts = None, (head_bytes, stored)
                    # A big batch is hashed on another thread while this one checks and decodes it.
                    digest = hash_soon(*parts) if header.linked else None
                    shared = header.flags & F.FLAG_SHARED
                    if shared:
                        if st.version is not None and st.version < F.SHARED_VERSION:
                            raise Damage(f"batch shares values in a segment of format version {st.version}", pos)
                        if values.at is None and self.keys is not OPAQUE:
                            values = self._prime(number, pos)
                    if values.at is not None:
                        values.reading(self.seq, number, pos)
                    raw = check_payload(header, stored, pos, self.keys, values if values.at is not None else None, apart)
                    if shared and self.keys is OPAQUE and header.flags & F.FLAG_ENCRYPTED:
                        values.lost()  # its definitions stayed shut: the table ends here
                controls = control_records(header, raw, pos) if header.flags & F.KIND_MASK == F.KIND_CONTROL else None
            except MissingDependencyError as e:
                raise MissingDependencyError(
                    f"{self.dest.url} log {self.seq} segment {name}: {e}", package=e.package, extra=e.extra
                ) from None
            except KeyUnavailableError as e:
                # Never damage, never skipped: the bytes are fine, the key is not here.
                raise KeyUnavailableError(
                    e.reason, key_id=e.key_id, destination=self.dest.url, log=self.seq, segment=name, offset=pos
                ) from None
            except Damage as d:
                # A crash can leave only the end of the last segment unfinished: a short or
                # zero-filled header, a batch running past the end, or a last batch whose
                # payload never fully reached the disk -- where "the end" ignores a run of
                # zeros that a file extended by the crash shows before its data reached disk.
                if last and self._torn_shape(seg, pos, d, end):
                    if self.tail_ok:
                        return  # a write in progress: come back later
                    if self.dest.appendable and not self._segment_sealed(seg):
                        st.torn = TornTail(self.seq, name, pos, size - pos, d.reason)
                        logger.info(
                            "dropped torn tail of %s log %d: %d bytes at %s:%d (%s)",
                            self.dest.url, self.seq, size - pos, name, pos, d.reason,
                        )
                        return
                skip_to = self._skip_target(seg, pos)
                self._corrupt(d.reason, name, pos, skip_to - pos)
                pos = skip_to
                st.position = (number, pos)
                # Skip mode: the LSNs of what was skipped are unknown; the chain resumes at
                # the next intact batch instead of reporting the same damage twice.
                next_lsn = None
                self._link = None
                run, taken = [], 0
                continue
            if next_lsn is not None and header.first_lsn != next_lsn:
                self._corrupt(f"batch starts at LSN {header.first_lsn}, expected {next_lsn}", name, pos)
            next_lsn = header.first_lsn + header.lsn_count
            st.next_lsn = next_lsn
            if vouched and controls is None and pos != F.SEGMENT_HEADER_SIZE:
                if st.chained:  # its link was checked in the run
                    self._chain_moves(digest, name, pos)
            elif header.linked or st.chained:
                self._check_link(header, link, digest, controls, name, pos)
            if header.flags & F.FLAG_ENCRYPTED:
                st.encrypted += 1
                st.unopened += self.keys is OPAQUE
                kid = key_id_of(header, stored)
                if kid not in st.key_ids:
                    st.key_ids.append(kid)
            batch = Batch(self.seq, number, pos, header, raw, controls, link)
            if values.at is not None:
                values.read_to(self.seq, number, end)
            if controls is not None:
                self._apply_controls(controls, header, name, pos)
            else:
                st.records += header.count
                if st.first_commit_us is None:
                    st.first_commit_us = header.commit_us
                st.last_commit_us = header.commit_us
            pos = end
            st.position = (number, pos)
            yield batch
            if st.sealed:
                self._check_trailer(seg, batch, name)
                st.position = (number, size)
                return
            if st.fence is not None:
                if pos < size:
                    self._corrupt("the fence batch is not the end of its segment", name, pos, size - pos)
                st.position = (number, size)
                return

    def _prime(self, number: int, pos: int) -> ValueTable:
        """The values the log defined before the batch at ``pos`` of segment ``number``,
        read from the log's start (a scan that started inside the log meets a batch that
        shares values): what reading by position costs in a log that shares values."""
        segments = [(n, F.segment_name(self.seq, n)) for n in range(number + 1)]
        primer = LogScanner(self.dest, self.seq, segments, recovery=self.recovery, more_segments=True,
                            read_chunk=self.read_chunk, keys=self.keys, stop_at=(number, pos))
        for _ in primer:
            pass
        if not primer.values.reaches(self.seq, number, pos):
            raise Damage(f"the log's start does not reach this batch (read to {primer.state.position})", pos)
        self.values = primer.values
        self.values.read_to(self.seq, number, pos)
        return self.values

    def _check_link(
        self, header: BatchHeader, link: bytes | None, digest: bytes | Future[bytes] | None,
        controls: list[dict[str, Any]] | None, name: str, pos: int,
    ) -> None:
        """Check ``link``, the hash link of the batch at ``pos`` (None: it carries none),
        and move the chain head past it to ``digest``, the batch's hash (being computed,
        :func:`chain.hash_soon`)."""
        st = self.state
        if self._version is None:  # a scan resumed inside a segment: its batches say
            self._version = F.CHAINED_VERSION if header.linked else F.FORMAT_VERSION
            st.chained = header.linked
        if not header.linked or not st.chained:
            why = "without a hash link in a chained log" if st.chained else "with a hash link in an unchained log"
            self._corrupt(f"batch {why}", name, pos)
            self._link = None
            return
        assert link is not None and digest is not None, "a linked batch is hashed as it is read"
        expect = self._next_link()
        if st.first_link is None and pos == F.SEGMENT_HEADER_SIZE and self.start is None and name == self.segments[0][1]:
            st.first_link = link
        # A header declaring a gap (a secondary's, docs/FORMAT.md) says this log does not
        # continue the chain before it here: its own link is the writer's, not checked.
        declares_gap = controls is not None and any(
            c["t"] == F.CONTROL_HEADER and c.get(F.HEADER_AFTER_GAP) is True for c in controls
        )
        if expect is not None and link != expect and not declares_gap:
            if self._linked_from is None and (self.start is None or (self.start[0] == 0 and self.start[1] <= F.SEGMENT_HEADER_SIZE)):
                before = f"the log before it ends at chain head {expect.hex()[:16]}"
            elif self._linked_from is None:
                before = f"the batch before it, where the scan started, hashes to {expect.hex()[:16]}"
            else:
                before = f"the batch before it ({self._linked_from[0]} offset {self._linked_from[1]}) hashes to {expect.hex()[:16]}"
            self._corrupt(
                f"hash chain broken: the batch at LSN {header.first_lsn} links to {link.hex()[:16]}, but {before} "
                "(a batch was changed, removed or inserted)", name, pos,
            )
        ends = controls is not None and any(c["t"] in (F.CONTROL_SEAL, F.CONTROL_FENCE) for c in controls)
        if ends:
            # A seal or fence links to the head and leaves it there: the next log was linked
            # to that head before its seal was written.
            if st.chain_head is None:
                st.move_head(link)
            for c in controls or ():
                if c["t"] == F.CONTROL_SEAL and c.get(F.SEAL_CHAIN) != link:
                    self._corrupt("the seal names another chain head than its link", name, pos)
            self._link = link
            return
        for c in controls or ():
            if c["t"] == F.CONTROL_CHECKPOINT and (
                c.get("head") != link or c.get("seq") != self.seq or c.get("lsn") != header.first_lsn
            ):
                self._corrupt("the checkpoint names another log, LSN or chain head than where it stands", name, pos)
        self._chain_moves(digest, name, pos)

    def _chain_moves(self, digest: bytes | Future[bytes] | None, name: str, pos: int) -> None:
        """The chain moves past the batch at ``pos``, whose link checked out: the next batch
        must link to ``digest``, its hash."""
        self._link = digest
        self.state.move_head(digest)
        self._linked_from = (name, pos)

    def _next_link(self) -> bytes | None:
        """The link the next batch must carry, waiting for the hash of the batch before it
        if that is still being computed (off this thread, so that the caller decoded that
        batch meanwhile)."""
        link = self._link
        if isinstance(link, Future):
            link = self._link = link.result()
        return link

    def _apply_controls(self, controls: list[dict[str, Any]], header: BatchHeader, name: str, pos: int) -> None:
        st = self.state
        for c in controls:
            t = c["t"]
            if t == F.CONTROL_HEADER:
                if c.get("seq") != self.seq:
                    self._corrupt(f"log header names log {c.get('seq')}", name, pos)
                st.header = c
                if c.get(F.HEADER_AFTER_GAP) is True:
                    # A secondary re-wrote this header: the batch after it links to the
                    # writer's own header, whose hash is not this one's.
                    self._link = None
            elif t == F.CONTROL_COMPLETE:
                st.complete_lsn = header.first_lsn - 1
            elif t == F.CONTROL_SEAL:
                st.sealed = True
                st.seal = c
            elif t == F.CONTROL_FENCE:
                st.fence = c
            # Unknown control types are skipped: later minor versions may add hints.

    def _check_trailer(self, seg: SegmentBytes, batch: Batch, name: str) -> None:
        end = batch.end
        tail = seg.get(end, F.TRAILER_SIZE + 1)
        if len(tail) == F.TRAILER_SIZE and parse_trailer(tail) == batch.offset:
            return
        # A crash while sealing (before its fsync) can leave the intact seal batch with its
        # trailer cut short, or zero-filled from a filesystem block boundary on: every
        # record is there, so this is a torn tail of the trailer, not damage of the log.
        # (A bit flip never shortens a file, nor zeroes a whole trailer.)
        expected = seal_trailer(batch.offset)
        block = (-end) % _FS_BLOCK  # trailer bytes before the next block boundary
        if (
            self.dest.appendable
            and len(tail) <= F.TRAILER_SIZE
            and (
                (len(tail) < F.TRAILER_SIZE and expected.startswith(tail))
                or not any(tail)
                or (block < len(tail) and tail[:block] == expected[:block] and not any(tail[block:]))
            )
        ):
            if tail and not self.tail_ok:
                self.state.torn = TornTail(self.seq, name, end, len(tail), "seal trailer cut short")
                logger.info("dropped torn seal trailer of %s log %d: %d bytes at %s:%d",
                         self.dest.url, self.seq, len(tail), name, end)
            return
        self._corrupt("seal batch is not followed by exactly its trailer", name, end, seg.size - end)

    def _segment_sealed(self, seg: SegmentBytes) -> bool:
        if seg.size < F.SEGMENT_HEADER_SIZE + F.TRAILER_SIZE:
            return False
        return parse_trailer(seg.get(seg.size - F.TRAILER_SIZE, F.TRAILER_SIZE)) is not None

    def _torn_shape(self, seg: SegmentBytes, pos: int, d: Damage, end: int) -> bool:
        """Whether damage at ``pos`` of the last segment looks like an interrupted write:
        the damaged batch reaches the run of zeros (possibly empty) that ends the segment."""
        if d.reason == "batch header checksum mismatch":
            # A header partly or wholly zero-filled to the end; any other bad header is
            # corruption.
            return pos + F.BATCH_HEADER_SIZE > self._zero_tail(seg)
        return d.torn_shape and end >= self._zero_tail(seg)

    def _zero_tail(self, seg: SegmentBytes) -> int:
        """Offset where the run of zero bytes ending the segment starts (its size if none)."""
        z = seg.size
        while z > 0:
            start = max(0, z - READ_CHUNK)
            chunk = seg.get(start, z - start)
            stripped = chunk.rstrip(b"\0")
            if stripped:
                return start + len(stripped)
            z = start
        return 0

    def _skip_target(self, seg: SegmentBytes, pos: int) -> int:
        """Where skip mode resumes: after the damaged batch if its header is sound, else at
        the next plausible batch header (or the end of the segment)."""
        try:
            header = parse_batch_header(seg.get(pos, F.BATCH_HEADER_SIZE), pos)
            if pos + header.size <= seg.size:
                return pos + header.size
        except Damage:
            pass
        probe = pos + 1
        while probe + F.BATCH_HEADER_SIZE <= seg.size:
            window = seg.get(probe, READ_CHUNK)
            i = window.find(F.BATCH_MARKER, 14)
            while i != -1:
                start = probe + i - 14
                try:
                    parse_batch_header(seg.get(start, F.BATCH_HEADER_SIZE), start)
                    return start
                except Damage:
                    i = window.find(F.BATCH_MARKER, i + 1)
            probe += max(len(window) - F.BATCH_HEADER_SIZE, 1)
        return seg.size


def newest_seal(dest: Destination, logs: dict[int, list[tuple[int, str]]]) -> dict[str, Any] | None:
    """The seal record of the newest log, read from its trailer alone; None if that log is
    not cleanly sealed (or its end is damaged, which a scan reports precisely)."""
    if not logs:
        return None
    _number, name = logs[max(logs)][-1]
    size = dest.size(name)
    if size < F.SEGMENT_HEADER_SIZE + F.BATCH_HEADER_SIZE + F.TRAILER_SIZE:
        return None
    seal_at = parse_trailer(dest.read(name, size - F.TRAILER_SIZE, F.TRAILER_SIZE))
    if seal_at is None or seal_at >= size - F.TRAILER_SIZE:
        return None
    try:
        head = parse_batch_header(dest.read(name, seal_at, F.BATCH_HEADER_SIZE), seal_at)
        if head.kind != F.KIND_CONTROL or seal_at + head.size != size - F.TRAILER_SIZE:
            return None
        payload = dest.read(name, seal_at + F.BATCH_HEADER_SIZE, head.stored_len)
        for c in control_records(head, check_payload(head, payload, seal_at), seal_at):
            if c["t"] == F.CONTROL_SEAL and isinstance(c.get("next_lsn"), int):
                return c
    except Damage:
        pass
    return None


def end_of_logs(dest: Destination, logs: dict[int, list[tuple[int, str]]]) -> tuple[int, int]:
    """``(newest seq, next LSN)`` of what is at the destination, reading as little as it can:
    the seal of a cleanly closed log, else a scan of the newest log's last segment."""
    return end_after_seal(dest, logs, newest_seal(dest, logs))


def end_after_seal(
    dest: Destination, logs: dict[int, list[tuple[int, str]]], seal: dict[str, Any] | None
) -> tuple[int, int]:
    """:func:`end_of_logs`, given what :func:`newest_seal` read (None: scan instead)."""
    if not logs:
        return 0, F.FIRST_LSN
    seq = max(logs)
    if seal is not None:
        return seq, int(seal["next_lsn"])
    next_lsn = last_segment_state(dest, seq, logs[seq]).next_lsn
    return seq, next_lsn if next_lsn is not None else F.FIRST_LSN


def end_and_chain(
    dest: Destination, logs: dict[int, list[tuple[int, str]]], seal: dict[str, Any] | None
) -> tuple[int, int, bytes]:
    """``(newest seq, next LSN, chain head)``: :func:`end_after_seal` and :func:`chain_end`
    together, where a log left without its seal (a crash) needs a scan of its last segment
    for both: one scan serves them."""
    if not logs or seal is not None:
        seq, next_lsn = end_after_seal(dest, logs, seal)
        return seq, next_lsn, chain_end(dest, logs, seal)
    seq = max(logs)
    last = last_segment_state(dest, seq, logs[seq])
    next_lsn = last.next_lsn if last.next_lsn is not None else F.FIRST_LSN
    return seq, next_lsn, chain_end(dest, logs, None, last)


def chain_end(
    dest: Destination, logs: dict[int, list[tuple[int, str]]], seal: dict[str, Any] | None,
    last: LogState | None = None,
) -> bytes:
    """The chain head the next log at ``dest`` links to (docs/FORMAT.md, "Hash chain"):
    where the newest log's chain ends, from its seal (what :func:`newest_seal` read) or a
    scan of its last segments (``last``: what :func:`last_segment_state` found in the
    last one, if the caller scanned it); the genesis link when there is no log or it is
    not chained."""
    from .._format.chain import GENESIS

    if not logs:
        return GENESIS
    if seal is not None:
        head = seal.get(F.SEAL_CHAIN)
        return head if isinstance(head, bytes) and len(head) == F.LINK_SIZE else GENESIS
    seq = max(logs)
    segments = logs[seq]
    for i in range(len(segments) - 1, -1, -1):
        # A segment a writer rolled to may hold no batch yet: the head is in one before it.
        if last is not None and i == len(segments) - 1:
            st = last
        else:
            scanner = LogScanner(dest, seq, segments[: i + 1], start=(segments[i][0], 0, None), keys=OPAQUE)
            for _batch in scanner:
                pass
            st = scanner.state
        if not st.chained:
            return GENESIS
        if st.chain_head is not None:
            return st.chain_head
    return GENESIS


def last_segment_state(dest: Destination, seq: int, segments: list[tuple[int, str]]) -> LogState:
    """What a strict scan of the last of ``segments`` (of log ``seq``) finds: where the log
    ends (``next_lsn``), and whether it is sealed or fenced there."""
    scanner = LogScanner(dest, seq, segments, start=(segments[-1][0], 0, None), keys=OPAQUE)
    for _batch in scanner:
        pass
    return scanner.state

"""Bytes to batches: the one decoder that the writer, restore, follower, CLI and Spark reader
share. Pure functions over buffers; where the bytes come from is ``_read.reader``'s job.

A check that fails raises :class:`Damage` with the offset and a reason. Whether that damage
is a crash artefact (a torn tail) or corruption depends on where it sits in the log, which
only the reader knows; ``Damage.torn_shape`` says whether the bytes at least look like an
interrupted write.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from .._errors import CodecError, KeyUnavailableError, MissingDependencyError
from . import constants as F
from .codec import RecordRefused, plain_loads

if TYPE_CHECKING:
    from .crypt import Keyring
    from .shared_values import ValueTable

_crc32 = zlib.crc32


class Damage(Exception):
    """Bytes that failed a check, at ``offset`` within their segment."""

    def __init__(self, reason: str, offset: int, *, torn_shape: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset
        self.torn_shape = torn_shape


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    """A segment's header (docs/FORMAT.md): its log, its number, the LSN of its first
    record and the format version of its batches."""

    seq: int
    segment: int
    first_lsn: int
    #: 1, or 2 (``F.CHAINED_VERSION``): every batch carries a hash link.
    version: int = F.FORMAT_VERSION


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """A batch's header (docs/FORMAT.md): payload lengths as stored and as decoded, record
    count, flags (kind, compression, encryption, hash link), first LSN, commit time in
    microseconds since the epoch, and the payload's checksum."""

    stored_len: int
    raw_len: int
    count: int
    flags: int
    first_lsn: int
    commit_us: int
    payload_crc: int

    @property
    def kind(self) -> int:
        return self.flags & F.KIND_MASK

    @property
    def size(self) -> int:
        return F.BATCH_HEADER_SIZE + self.stored_len

    @property
    def linked(self) -> bool:
        """Whether the stored payload starts with a hash link (format version 2)."""
        return bool(self.flags & F.FLAG_LINKED)

    @property
    def lsn_count(self) -> int:
        """LSNs this batch takes: control records take none."""
        return 0 if self.flags & F.KIND_MASK == F.KIND_CONTROL else self.count


def parse_segment_header(buf: bytes | memoryview) -> SegmentHeader:
    """The segment header at ``buf[0:32]``, checked (magic, checksum, version, size):
    :class:`Damage` at offset 0 otherwise."""
    if len(buf) < F.SEGMENT_HEADER_SIZE:
        raise Damage(f"segment shorter than its {F.SEGMENT_HEADER_SIZE}-byte header", 0)
    body = bytes(buf[: F.SEGMENT_HEADER.size])
    magic, version, hsize, segment, seq, first_lsn, _reserved = F.SEGMENT_HEADER.unpack(body)
    if magic != F.SEGMENT_MAGIC:
        raise Damage("not a persistlog segment (bad magic)", 0)
    (crc,) = F.U32.unpack_from(buf, F.SEGMENT_HEADER.size)
    if crc != _crc32(body):
        raise Damage("segment header checksum mismatch", 0)
    if version not in F.SEGMENT_VERSIONS:
        raise Damage(f"unknown format version {version} (this reader knows {', '.join(map(str, F.SEGMENT_VERSIONS))})", 0)
    if hsize != F.SEGMENT_HEADER_SIZE:
        raise Damage(f"unexpected segment header size {hsize}", 0)
    return SegmentHeader(seq=seq, segment=segment, first_lsn=first_lsn, version=version)


def is_zeros(buf: bytes | memoryview) -> bool:
    return not any(buf)


def parse_batch_header(buf: bytes | memoryview, offset: int) -> BatchHeader:
    """The header at ``buf[0:40]``, which sits at ``offset`` in its segment."""
    if len(buf) < F.BATCH_HEADER_SIZE:
        raise Damage("batch header cut short", offset, torn_shape=True)
    body = bytes(buf[: F.BATCH_HEADER.size])
    (crc,) = F.U32.unpack_from(buf, F.BATCH_HEADER.size)
    if crc != _crc32(body):
        # Zeros are what a file extended by a crash shows before its data reached disk.
        raise Damage("batch header checksum mismatch", offset, torn_shape=is_zeros(buf))
    stored, raw, count, flags, marker, first_lsn, commit_us, pcrc = F.BATCH_HEADER.unpack(body)
    if marker != F.BATCH_MARKER:
        raise Damage("bad batch marker", offset)
    if flags & ~F.KNOWN_FLAGS:
        raise Damage(f"unknown batch flags 0x{flags:04x}", offset)
    if stored > F.MAX_BATCH_BYTES or raw > F.MAX_BATCH_BYTES:
        raise Damage(f"batch length {max(stored, raw)} exceeds the {F.MAX_BATCH_BYTES}-byte limit", offset)
    link = F.LINK_SIZE if flags & F.FLAG_LINKED else 0
    if stored < link:
        raise Damage(f"linked batch of {stored} stored bytes, shorter than its link", offset)
    if flags & F.FLAG_SHARED and flags & F.KIND_MASK == F.KIND_CONTROL:
        raise Damage("control batch with shared values (only record batches share values)", offset)
    if flags & F.FLAG_ENCRYPTED:
        if flags & F.KIND_MASK == F.KIND_CONTROL:
            raise Damage("encrypted control batch (control records are never encrypted)", offset)
        if stored - link < F.SEAL_OVERHEAD_MIN:
            raise Damage(f"encrypted batch of {stored} stored bytes, shorter than its key id and tag", offset)
    elif flags & F.COMPRESSION_MASK == F.COMPRESSION_NONE and stored - link != raw:
        raise Damage("uncompressed batch with differing stored and raw lengths", offset)
    if count > max(raw, 1) or (count == 0 and raw):
        raise Damage(f"record count {count} impossible for {raw} payload bytes", offset)
    return BatchHeader(stored, raw, count, flags, first_lsn, commit_us, pcrc)


def check_payload(header: BatchHeader, stored: bytes | memoryview, offset: int, keys: Keyring | None = None,
                  values: ValueTable | None = None, link: bytes | None = None) -> bytes:
    """The raw payload, after its checksum, decryption (with ``keys``), (bounded)
    decompression (without the link a chained batch's stored bytes start with) and, in a
    batch that shares values, their expansion from ``values`` (the log's values defined
    before this batch, to which this batch's definitions are added).

    An encrypted batch without ``keys`` raises :class:`KeyUnavailableError`; with
    ``crypt.OPAQUE`` it reads as an empty payload (structure-only scans), and so does a
    batch that shares values read without ``values``.

    ``link`` given: ``stored`` is what follows the link of a chained batch that is not
    encrypted, read apart from it (so that no copy of the payload is made to cut the link
    off); the checksum covers both, as written."""
    crc = _crc32(stored) if link is None else _crc32(stored, _crc32(link))
    if crc != header.payload_crc:
        raise Damage("batch payload checksum mismatch", offset, torn_shape=True)
    if link is not None and header.flags & F.FLAG_ENCRYPTED:
        raise ValueError("an encrypted batch's stored bytes are read whole, link included")
    if header.flags & F.FLAG_SHARED:
        from .crypt import OPAQUE

        raw = _payload(header, stored, offset, keys, link is not None)
        if keys is OPAQUE and (values is None or header.flags & F.FLAG_ENCRYPTED):
            return b""
        return expand_shared(raw, values, offset)
    return _payload(header, stored, offset, keys, link is not None)


#: A batch checked in C (:func:`checked_run`): where it ends, its header, its
#: payload, its link (None: it carries none) and its SHA-256 (None: unlinked).
CheckedBatch = tuple[int, BatchHeader, bytes, "bytes | None", "bytes | None"]

#: The bytes of batches one run checked in C holds at most (and one batch more): what a
#: reader that stops early has checked in vain, and what a run holds in memory.
RUN_BYTES = 16 * 1024


def checked_run(
    window: bytes, base: int, pos: int, stop: int, size: int, link: bytes | None, chained: bool, under: int
) -> list[CheckedBatch]:
    """:func:`parse_batch_header` and :func:`check_payload` in C, for a reader
    walking a segment of ``size`` bytes whose bytes from offset ``base`` on ``window``
    holds: the run of consecutive batches from ``pos`` that pass every check those two make,
    start before ``stop``, carry a link if and only if ``chained``, that link being ``link``
    (None: any) or the hash of the batch before, and are smaller than ``under`` bytes,
    uncompressed, clear and sharing no values. Each is ``(end, header, raw payload, link,
    SHA-256 of the batch)``; their LSNs are the caller's to check.

    Checked in C, a few times faster than one batch at a time here; the run ends at the
    first batch it does not vouch for (damage, another kind of batch, the window's end),
    which the caller reads with the two functions, so that what is said about any damage is
    theirs. Empty without the C accelerator."""
    if _checked_batches is None:
        return []
    run: list[CheckedBatch] = _checked_batches(
        window, base, pos, stop, size, link, chained, under, RUN_BYTES, BatchHeader
    )
    return run


def _payload(header: BatchHeader, stored: bytes | memoryview, offset: int, keys: Keyring | None,
             past_link: bool = False) -> bytes:
    if header.flags & F.FLAG_ENCRYPTED:
        plain = _decrypt(header, stored, offset, keys)
        if plain is None:
            return b""  # opaque keys: the structure only
        stored = plain
    elif header.flags & F.FLAG_LINKED and not past_link:
        stored = memoryview(stored)[F.LINK_SIZE:]
    compression = header.flags & F.COMPRESSION_MASK
    if compression == F.COMPRESSION_NONE and len(stored) != header.raw_len:
        raise Damage(f"decrypted {len(stored)} bytes, header says {header.raw_len}", offset)
    if compression == F.COMPRESSION_NONE:
        return bytes(stored)
    if compression == F.COMPRESSION_ZSTD:
        zstandard = _zstandard(offset)
    try:
        if compression == F.COMPRESSION_GZIP:
            d = zlib.decompressobj()
            raw = d.decompress(stored, header.raw_len)
            if d.unconsumed_tail or not d.eof:
                raise ValueError("zlib stream longer than its declared length")
        elif compression == F.COMPRESSION_ZSTD:
            # max_output_size only bounds frames without a content size: a frame that
            # declares one gets that much allocated up front, so check it first.
            declared = zstandard.frame_content_size(stored)
            if declared > header.raw_len:
                raise ValueError(f"zstd frame declares {declared} bytes")
            raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=header.raw_len)
        else:
            raise ValueError(f"unknown compression flag 0x{compression:04x}")
    except Exception as e:  # any decompressor complaint is damage of these bytes
        raise Damage(f"batch payload does not decompress: {e}", offset) from None
    if len(raw) != header.raw_len:
        raise Damage(f"decompressed {len(raw)} bytes, header says {header.raw_len}", offset)
    return raw


def key_id_of(header: BatchHeader, stored: bytes | memoryview) -> str:
    """The key id an encrypted batch names (docs/FORMAT.md, "Encryption"), as text (bytes
    that are not UTF-8 shown replaced: a damaged id fails the batch's tag anyway)."""
    at = F.LINK_SIZE if header.flags & F.FLAG_LINKED else 0
    n = stored[at] if len(stored) > at else 0
    return bytes(stored[at + 1:at + 1 + n]).decode("utf-8", "replace")


def _decrypt(header: BatchHeader, stored: bytes | memoryview, offset: int, keys: Keyring | None) -> bytes | None:
    """The decrypted payload of an encrypted batch (None with opaque keys)."""
    from .crypt import Opaque

    link = F.LINK_SIZE if header.flags & F.FLAG_LINKED else 0
    body = memoryview(stored)[link:]
    if keys is None:
        kid = key_id_of(header, stored)
        raise KeyUnavailableError(
            f"the batch is encrypted under key id {kid!r} and no key provider was "
            "given (key_provider=, --key-provider)", key_id=kid,
        )
    aad = F.BATCH_AAD.pack(
        header.raw_len, header.count, header.flags, F.BATCH_MARKER, header.first_lsn, header.commit_us
    ) + bytes(stored[:link])
    try:
        return keys.open(aad, body)
    except Opaque:
        return None
    except ValueError as e:
        raise Damage(str(e), offset) from None


def _leb128(raw: bytes, pos: int, end: int, offset: int) -> tuple[int, int]:
    """The unsigned LEB128 number at ``raw[pos:end]`` (at most 5 bytes), and where it ends."""
    value = shift = 0
    while True:
        if pos >= end or shift > 28:
            raise Damage("shared-values token cut short or too long", offset)
        b = raw[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def expand_shared(raw: bytes, values: ValueTable | None, offset: int) -> bytes:
    """The payload a shared-values stream (docs/FORMAT.md, "Shared values") stands for.

    ``values`` holds what the log defined before this batch; this batch's definitions are
    added to it only if the whole stream checks out. Every length is checked before it is
    used: the expanded payload is at most ``MAX_BATCH_BYTES``, the log's values at most
    ``SHARED_MAX_BYTES``."""
    if values is None:
        raise Damage("batch shares values but was read without its log's values", offset)
    if len(raw) < F.SHARED_HEADER.size:
        raise Damage("shared-values stream shorter than its lengths", offset)
    expanded, n_tokens, n_literals = F.SHARED_HEADER.unpack_from(raw, 0)
    if expanded > F.MAX_BATCH_BYTES:
        raise Damage(f"shared values expand to {expanded} bytes, past the {F.MAX_BATCH_BYTES}-byte limit", offset)
    pos = F.SHARED_HEADER.size
    end = pos + n_tokens  # the tokens end here; the literal bytes follow, then the values'
    lit = end  # the next literal byte
    at = lit_end = end + n_literals  # the next byte of a value defined
    if lit_end > len(raw):
        raise Damage(f"shared-values tokens and literals run past the stream ({lit_end} of {len(raw)} bytes)",
                     offset)
    known = values.values
    have = len(known)
    new: list[bytes] = []
    size = values.size
    out: list[bytes] = []
    total = 0
    while pos < end:
        b = raw[pos]
        if b < 0x80:  # the usual one-byte token
            token, pos = b, pos + 1
        else:
            token, pos = _leb128(raw, pos, end, offset)
        kind, n = token & 3, token >> 2
        if kind == F.SHARED_REFERENCE:
            if n < have:
                piece = known[n]
            elif n - have < len(new):
                piece = new[n - have]
            else:
                raise Damage(f"reference to shared value {n}, of {have + len(new)} defined", offset)
        elif kind == F.SHARED_LITERAL:
            if n > lit_end - lit:
                raise Damage(f"shared-values literal of {n} bytes runs past the literals", offset)
            piece = raw[lit:lit + n]
            lit += n
        elif kind == F.SHARED_DEFINE:
            number, pos = _leb128(raw, pos, end, offset)
            if number != have + len(new):
                raise Damage(
                    f"defines shared value {number} where the log holds {have + len(new)}: a definition "
                    "before it is missing", offset,
                )
            if n > len(raw) - at:
                raise Damage(f"shared-values definition of {n} bytes runs past the stream", offset)
            size += n
            if size > F.SHARED_MAX_BYTES:
                raise Damage(f"shared values of the log pass the {F.SHARED_MAX_BYTES}-byte limit", offset)
            piece = raw[at:at + n]
            at += n
            new.append(piece)
        else:
            raise Damage(f"unknown shared-values token kind {kind}", offset)
        total += len(piece)
        if total > expanded:
            raise Damage(f"shared values expand past the {expanded} bytes declared", offset)
        out.append(piece)
    if total != expanded or lit != lit_end or at != len(raw):
        raise Damage(f"shared values expand to {total} bytes, {expanded} declared, placing {lit - end} of "
                     f"{n_literals} literal bytes and {at - lit_end} of {len(raw) - lit_end} value bytes", offset)
    values.add(new, size)
    return b"".join(out)


def _zstandard(offset: int) -> Any:
    """The zstandard module, imported when a zstd batch is first met: readers of logs
    without one never need the package, and a reader without it is told what to install
    (a missing package says nothing about the bytes, so it is never :class:`Damage`)."""
    try:
        import zstandard
    except ImportError:
        raise MissingDependencyError(
            f"the batch at offset {offset} is zstd-compressed and the zstandard package is not "
            "installed: pip install 'persistlog[zstd]'",
            package="zstandard",
            extra="zstd",
        ) from None
    return zstandard


def split_records(
    header: BatchHeader, raw: bytes, offset: int, loads: Any
) -> tuple[list[Any], bytes | None]:
    """``(records, snapshot_bitmap)``; the bitmap is None unless the batch mixes kinds."""
    try:
        items = loads(b"\x9f" + raw + b"\xff")
    except RecordRefused as r:
        raise refused(header, raw, offset, loads, r) from r.cause if isinstance(r.cause, BaseException) else None
    except Exception as e:
        raise Damage(f"batch payload is not a CBOR sequence: {e}", offset) from None
    if not isinstance(items, list):
        raise Damage("batch payload is not a CBOR sequence", offset)
    bitmap = None
    if header.kind == F.KIND_MIXED:
        if not items or not isinstance(items[0], bytes) or len(items[0]) != (header.count + 7) >> 3:
            raise Damage("mixed batch without a valid kind bitmap", offset)
        bitmap = items[0]
        del items[0]
    if len(items) != header.count:
        raise Damage(f"batch holds {len(items)} records, header says {header.count}", offset)
    return items, bitmap


# Records decode in slices of about this many bytes of CBOR: a slice's records are
# replayed and mostly freed while they are still in the CPU cache, where one call
# decoding a ~1 MiB batch keeps ~17 k records alive at once and spends most of its time
# in the allocator and the cyclic GC (bench/README.md has the figures behind the size).
SLICE_BYTES = 4 * 1024

try:
    from .._cbor_json import checked_batches as _checked_batches
    from .._cbor_json import decode_slice as _decode_slice
    from .._cbor_json import record_bounds as _record_bounds
except ImportError:  # built without a C compiler: batches decode whole, as they always did
    _record_bounds = None
    _decode_slice = None
    _checked_batches = None


class RecordSlices:
    """The records of one batch, decoded slice by slice as they are iterated.

    Iterating gives ``(index of the slice's first record, records)`` pairs in order; the
    slices add up to the batch's records. ``bitmap`` is the mixed batch's kind bitmap
    (None for other kinds). Damage found while iterating raises :class:`Damage` exactly
    as decoding the batch whole would; bytes the boundary finder passed never fail to
    decode, so in practice damage is always found before the first slice is handed out.
    """

    __slots__ = ("kind", "count", "bitmap", "_slices")

    def __init__(self, kind: int, count: int, bitmap: bytes | None, slices: Iterator[tuple[int, list[Any]]]) -> None:
        self.kind = kind
        self.count = count
        self.bitmap = bitmap
        self._slices = slices

    def __iter__(self) -> Iterator[tuple[int, list[Any]]]:
        return self._slices

    def kinds(self) -> RecordKinds:
        """The kind of every record of the batch."""
        return RecordKinds(self.kind, self.bitmap, self.count)


def record_slices(
    header: BatchHeader, raw: bytes, offset: int, loads: Any, slice_bytes: int | None = None,
    *, plain: bool = True,
) -> RecordSlices:
    """The batch's records as :class:`RecordSlices` of about ``slice_bytes`` each.

    Record boundaries come from the C boundary finder, which builds no objects. Where it
    is not built, or the payload holds anything it does not vouch for (tags, indefinite
    lengths, damage...), the batch is decoded whole by :func:`split_records` and is one
    slice: never slower than decoding it whole, and damage is reported the same way.

    With ``plain`` (``loads`` gives cbor2's values for tag-free CBOR, as every Codec's
    does), slices the finder vouched for are built in C, faster than cbor2 builds them
    and with short strings shared; ``plain=False`` leaves every slice to ``loads``.
    """
    mixed = header.kind == F.KIND_MIXED
    if _record_bounds is None:
        bounds = None
    else:
        bounds = _record_bounds(raw, header.count + mixed, int(mixed), slice_bytes or SLICE_BYTES)
    if bounds is None:
        records, bitmap = split_records(header, raw, offset, loads)
        return RecordSlices(header.kind, header.count, bitmap, iter(((0, records),)))
    indices, offsets = bounds
    bitmap = None
    if mixed:
        bitmap = loads(raw[: offsets[0]])
        if not isinstance(bitmap, bytes) or len(bitmap) != (header.count + 7) >> 3:
            split_records(header, raw, offset, loads)  # raises the whole batch's verdict
            raise Damage("mixed batch without a valid kind bitmap", offset)
    if plain and len(indices) == 2 and _decode_slice is not None:
        # One slice (a small batch): built here, where a generator would cost as much again.
        items = _decode_slice(raw, offsets[0], offsets[1], indices[1])
        if items is not None:
            return RecordSlices(header.kind, header.count, bitmap, iter(((0, items),)))
    slices = _decode_slices(header, raw, offset, loads, indices, offsets, _decode_slice if plain else None)
    return RecordSlices(header.kind, header.count, bitmap, slices)


def _decode_slices(
    header: BatchHeader, raw: bytes, offset: int, loads: Any, indices: list[int], offsets: list[int],
    build: Any,
) -> Iterator[tuple[int, list[Any]]]:
    for i in range(len(indices) - 1):
        lo, hi = offsets[i], offsets[i + 1]
        items = None if build is None else build(raw, lo, hi, indices[i + 1] - indices[i])
        if items is not None:
            yield indices[i], items
            continue
        try:
            items = loads(b"\x9f" + raw[lo:hi] + b"\xff")
        except RecordRefused:
            split_records(header, raw, offset, loads)  # raises the CodecError with its LSN
            raise
        except Exception as e:
            split_records(header, raw, offset, loads)  # raises the whole batch's verdict
            raise Damage(f"batch payload is not a CBOR sequence: {e}", offset) from None
        yield indices[i], items


def refused(header: BatchHeader, raw: bytes, offset: int, loads: Any, first: RecordRefused) -> CodecError:
    """The :class:`CodecError` for a batch holding a record the app's codec refuses, with
    that record's LSN: the items are decoded one at a time to find it (the slow path of a
    failure only)."""
    import io

    import cbor2

    fp = io.BytesIO(raw)
    items = cbor2.CBORDecoder(fp, tag_hook=lambda tag, immutable: tag)
    skip = 1 if header.kind == F.KIND_MIXED else 0  # the kind bitmap comes first
    lsn, found, pos, index = None, first, 0, 0
    try:
        while pos < len(raw):
            items.decode()
            end = fp.tell()
            try:
                loads(b"\x9f" + raw[pos:end] + b"\xff")
            except RecordRefused as r:
                lsn, found = header.first_lsn + index - skip, r
                break
            pos, index = end, index + 1
    except Exception:
        pass  # the record's place cannot be told; the error says "a record"
    return CodecError(found.type_name, found.version, lsn, offset, found.cause)


def control_records(header: BatchHeader, raw: bytes, offset: int) -> list[dict[str, Any]]:
    """The records of a control batch (``raw``: its checked payload, at ``offset``): maps
    with a string ``"t"`` naming their type, :class:`Damage` otherwise."""
    records, _ = split_records(header, raw, offset, plain_loads)
    for r in records:
        if not isinstance(r, dict) or not isinstance(r.get("t"), str):
            raise Damage("malformed control record", offset)
    return records


def parse_trailer(buf: bytes | memoryview) -> int | None:
    """The seal batch offset if ``buf`` (the segment's last 16 bytes) is a valid trailer."""
    if len(buf) != F.TRAILER_SIZE:
        return None
    body = bytes(buf[: F.TRAILER.size])
    magic, seal_offset = F.TRAILER.unpack(body)
    if magic != F.TRAILER_MAGIC or F.U32.unpack_from(buf, F.TRAILER.size)[0] != _crc32(body):
        return None
    return int(seal_offset)


def parse_closed_note(buf: bytes) -> tuple[int, int] | None:
    """(seq, next LSN) of the log CLOSED says a clean close sealed; None if it is damaged."""
    if len(buf) != F.CLOSED_SIZE:
        return None
    body = buf[: F.CLOSED.size]
    magic, version, _reserved, seq, next_lsn = F.CLOSED.unpack(body)
    if magic != F.CLOSED_MAGIC or version != F.FORMAT_VERSION:
        return None
    if F.U32.unpack_from(buf, F.CLOSED.size)[0] != _crc32(body):
        return None
    return int(seq), int(next_lsn)


def parse_consumer_position(buf: bytes) -> tuple[int, int, int, int, int] | None:
    """``(seq, segment, offset, next_lsn, committed_us)`` a consumer's position file holds;
    None if it is damaged in any way."""
    if len(buf) != F.CONSUMER_SIZE:
        return None
    body = buf[: F.CONSUMER.size]
    magic, version, _reserved, seq, segment, offset, next_lsn, committed_us = F.CONSUMER.unpack(body)
    if magic != F.CONSUMER_MAGIC or version != F.FORMAT_VERSION:
        return None
    if F.U32.unpack_from(buf, F.CONSUMER.size)[0] != _crc32(body):
        return None
    return int(seq), int(segment), int(offset), int(next_lsn), int(committed_us)


def parse_pointer(buf: bytes) -> int | None:
    """The seq CURRENT names, or None if the pointer is damaged in any way."""
    if len(buf) != F.POINTER_SIZE:
        return None
    body = buf[: F.POINTER.size]
    magic, version, _reserved, seq = F.POINTER.unpack(body)
    if magic != F.POINTER_MAGIC or version != F.FORMAT_VERSION:
        return None
    if F.U32.unpack_from(buf, F.POINTER.size)[0] != _crc32(body):
        return None
    return int(seq)


def parse_log_set_marker(buf: bytes) -> int:
    """The depth a LOGSET marker states; :class:`Damage` (offset 0) says why ``buf`` is not
    one this version reads."""
    if len(buf) != F.LOG_SET_SIZE or not buf.startswith(F.LOG_SET_MAGIC):
        raise Damage(f"not a log set marker ({len(buf)} bytes starting {buf[:8]!r})", 0)
    body = buf[: F.LOG_SET.size]
    _magic, version, depth, _reserved = F.LOG_SET.unpack(body)
    if F.U32.unpack_from(buf, F.LOG_SET.size)[0] != _crc32(body):
        raise Damage("log set marker checksum mismatch", 0)
    if version != F.LOG_SET_VERSION:
        raise Damage(f"log set layout version {version} is unknown to this persistlog (it reads {F.LOG_SET_VERSION})", 0)
    return int(depth)


def is_snapshot(kind: int, bitmap: bytes | None, index: int) -> bool:
    if kind == F.KIND_SNAPSHOT:
        return True
    if bitmap is None:
        return False
    return bool(bitmap[index >> 3] & (1 << (index & 7)))


class RecordKinds(Sequence[str]):
    """The kind of each record of a batch, ``"update"`` or ``"snapshot"``.

    Worked out from the batch's kind and bitmap when asked, so that readers which never
    look at kinds pay nothing for them. Compares equal to a list of the same kinds.
    """

    __slots__ = ("_kind", "_bitmap", "_n")

    def __init__(self, kind: int, bitmap: bytes | None, n: int) -> None:
        self._kind = kind
        self._bitmap = bitmap
        self._n = n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._n))]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("record index out of range")
        return "snapshot" if is_snapshot(self._kind, self._bitmap, index) else "update"

    def __iter__(self) -> Iterator[str]:
        if self._bitmap is None:
            kind = "snapshot" if self._kind == F.KIND_SNAPSHOT else "update"
            return iter([kind] * self._n)
        return iter(self[0 : self._n])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (RecordKinds, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"RecordKinds({list(self)!r})"


def parse_handover_request(raw: bytes) -> tuple[str, str, float, float] | None:
    """(asker, the writer asked, asked, deadline) of a HANDOVER request; None if ``raw`` is
    not one (foreign, truncated, more than ``F.HANDOVER_MAX_BYTES``)."""
    if len(raw) > F.HANDOVER_MAX_BYTES:
        return None
    try:
        info = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    by, to, asked, deadline = info.get("owner"), info.get("to"), info.get("asked"), info.get("deadline")
    if not isinstance(by, str) or not isinstance(to, str) or isinstance(asked, bool) or isinstance(deadline, bool):
        return None
    if not isinstance(asked, (int, float)) or not isinstance(deadline, (int, float)):
        return None
    return by, to, float(asked), float(deadline)

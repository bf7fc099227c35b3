"""Records to bytes: segment headers, framed and checksummed batches, the seal trailer and
the CURRENT pointer. Pure functions, no I/O; ``docs/FORMAT.md`` is the specification."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import cbor2

from . import constants as F

if TYPE_CHECKING:
    from .crypt import Keyring

_crc32 = zlib.crc32


def segment_header(seq: int, segment: int, first_lsn: int, version: int = F.FORMAT_VERSION) -> bytes:
    """A segment header; ``version`` 2 (``F.CHAINED_VERSION``) for a chained log."""
    head = F.SEGMENT_HEADER.pack(
        F.SEGMENT_MAGIC, version, F.SEGMENT_HEADER_SIZE, segment, seq, first_lsn, 0
    )
    return head + F.U32.pack(_crc32(head))


def _compress(raw: bytes, compression: int) -> bytes:
    if compression == F.COMPRESSION_NONE:
        return raw
    if compression == F.COMPRESSION_GZIP:
        return zlib.compress(raw, 6)
    import zstandard  # an optional extra, checked when the Log is opened

    return zstandard.ZstdCompressor(level=3, write_content_size=True).compress(raw)


def frame(payload: bytes, count: int, kind: int, first_lsn: int, commit_us: int,
          compression: int = F.COMPRESSION_NONE, link: bytes | None = None,
          keys: Keyring | None = None) -> bytes:
    """One batch: header (with both checksums) followed by the stored payload, which starts
    with ``link`` (the hash of the batch before it) in a chained log; with ``keys`` the
    (possibly compressed) payload is sealed under its writing key (docs/FORMAT.md,
    "Encrypted batches")."""
    stored = _compress(payload, compression) if compression else payload
    if compression and len(stored) >= len(payload):
        # Incompressible: store it raw rather than pay to inflate it on every read.
        stored, compression = payload, F.COMPRESSION_NONE
    if keys is not None:
        compression |= F.FLAG_ENCRYPTED
        flags = kind | compression | (F.FLAG_LINKED if link is not None else 0)
        aad = F.BATCH_AAD.pack(len(payload), count, flags, F.BATCH_MARKER, first_lsn, commit_us)
        stored = keys.seal(aad + (link or b""), stored)
    if link is None:
        head = F.BATCH_HEADER.pack(
            len(stored), len(payload), count, kind | compression, F.BATCH_MARKER, first_lsn,
            commit_us, _crc32(stored),
        )
        return head + F.U32.pack(_crc32(head)) + stored
    head = F.BATCH_HEADER.pack(
        F.LINK_SIZE + len(stored), len(payload), count, kind | compression | F.FLAG_LINKED, F.BATCH_MARKER,
        first_lsn, commit_us, _crc32(stored, _crc32(link)),
    )
    return b"".join((head, F.U32.pack(_crc32(head)), link, stored))


def record_batch(payload: bytes, count: int, snapshots: Sequence[int], first_lsn: int,
                 commit_us: int, compression: int = F.COMPRESSION_NONE, link: bytes | None = None,
                 keys: Keyring | None = None, share: Callable[[bytes], bytes | None] | None = None) -> bytes:
    """A batch of app records already encoded as one CBOR sequence; ``snapshots`` lists
    the indexes of the records that came from an enumeration (the rest are updates).
    ``share`` (a log of version 3) turns the payload into a shared-values stream, or
    returns None to leave it as it is; compression and sealing come after it. With
    ``keys`` (an encrypted log) the payload is sealed; control batches never are."""
    if not snapshots:
        kind = F.KIND_UPDATE
    elif len(snapshots) == count:
        kind = F.KIND_SNAPSHOT
    else:
        bitmap = bytearray((count + 7) >> 3)
        for i in snapshots:
            bitmap[i >> 3] |= 1 << (i & 7)
        kind, payload = F.KIND_MIXED, cbor2.dumps(bytes(bitmap)) + payload
    if share is not None:
        stream = share(payload)
        if stream is not None:
            kind, payload = kind | F.FLAG_SHARED, stream
    return frame(payload, count, kind, first_lsn, commit_us, compression, link, keys)


def control_batch(records: Sequence[dict[str, Any]], next_lsn: int, commit_us: int,
                  link: bytes | None = None) -> bytes:
    """A batch of control records; it takes no LSN (its first LSN is the next one due)."""
    payload = b"".join(cbor2.dumps(r) for r in records)
    return frame(payload, len(records), F.KIND_CONTROL, next_lsn, commit_us, link=link)


def fence_segment(seq: int, segment: int, first_lsn: int, writer: str, commit_us: int,
                  link: bytes | None = None, version: int | None = None) -> bytes:
    """A fence segment: segment ``segment`` of log ``seq``, starting at the LSN due
    ``first_lsn``, holding one control batch with one ``fence`` record and nothing else;
    in a chained log (``link``: the log's chain head) a segment of the log's ``version``
    (2 when not given)."""
    record = {"t": F.CONTROL_FENCE, "writer": writer, "created": commit_us}
    if link is None:
        version = F.FORMAT_VERSION
    elif version is None:
        version = F.CHAINED_VERSION
    return segment_header(seq, segment, first_lsn, version) + control_batch([record], first_lsn, commit_us, link)


def checkpoint_message(seq: int, lsn: int, head: bytes) -> bytes:
    """The bytes a signed checkpoint or seal signs: log ``seq``, the LSN due ``lsn`` there
    and the chain head ``head``."""
    return F.CHECKPOINT_DOMAIN + F.CHECKPOINT_POSITION.pack(seq, lsn) + head


def seal_trailer(seal_offset: int) -> bytes:
    head = F.TRAILER.pack(F.TRAILER_MAGIC, seal_offset)
    return head + F.U32.pack(_crc32(head))


def log_set_marker(depth: int) -> bytes:
    """The LOGSET marker of a log set whose keys lie ``depth`` shard levels deep."""
    head = F.LOG_SET.pack(F.LOG_SET_MAGIC, F.LOG_SET_VERSION, depth, 0)
    return head + F.U32.pack(_crc32(head))


def pointer(seq: int) -> bytes:
    head = F.POINTER.pack(F.POINTER_MAGIC, F.FORMAT_VERSION, 0, seq)
    return head + F.U32.pack(_crc32(head))


def consumer_position(seq: int, segment: int, offset: int, next_lsn: int, committed_us: int) -> bytes:
    """consumers/<name>: a consumer resumes at byte ``offset`` of segment ``segment`` of log
    ``seq``, where LSN ``next_lsn`` is due; committed at ``committed_us``."""
    head = F.CONSUMER.pack(F.CONSUMER_MAGIC, F.FORMAT_VERSION, 0, seq, segment, offset, next_lsn, committed_us)
    return head + F.U32.pack(_crc32(head))


def closed_note(seq: int, next_lsn: int) -> bytes:
    """CLOSED: a clean close sealed log ``seq``, which ends before ``next_lsn``."""
    head = F.CLOSED.pack(F.CLOSED_MAGIC, F.FORMAT_VERSION, 0, seq, next_lsn)
    return head + F.U32.pack(_crc32(head))


def handover_request(by: str, host: str, pid: int, to: str, asked: float, deadline: float) -> bytes:
    """HANDOVER: writer ``by`` (process ``pid`` on ``host``) asks the live writer ``to`` to
    hand the log over, and waits until ``deadline`` (Unix seconds) for it. One line of JSON."""
    record = {"owner": by, "host": host, "pid": pid, "to": to, "asked": asked, "deadline": deadline}
    return json.dumps(record).encode() + b"\n"

"""The format's constants (versions 1 to 3), in one place. ``docs/FORMAT.md`` is the specification; keep the two
in step (``tests/persistlog/format/test_format_doc.py`` checks the numbers the doc states)."""

from __future__ import annotations

import re
import struct

FORMAT_VERSION = 1
# The segment format version of a chained log: its batches carry a hash link (FLAG_LINKED).
# CURRENT, CLOSED and consumer files stay at version 1.
CHAINED_VERSION = 2
# A chained log whose record batches may share values (FLAG_SHARED): a large string or byte
# string repeated across records is stored once per log and referenced after that.
SHARED_VERSION = 3
SEGMENT_VERSIONS = (FORMAT_VERSION, CHAINED_VERSION, SHARED_VERSION)
# What a writer writes with the default options (hash_chain=False writes 1, share_values=False 2).
WRITTEN_VERSION = SHARED_VERSION

# Segment header: magic, version, header length, segment number, log seq, first LSN,
# reserved, CRC-32 of everything before it.
SEGMENT_MAGIC = b"\x89PLOG\r\n\x1a"
SEGMENT_HEADER = struct.Struct("<8sHHIQQI")
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size + 4  # 40 with the trailing CRC

# Batch header: stored length, raw length, record count, flags, marker, first LSN, commit
# time (µs since the Unix epoch), payload CRC; followed by the CRC of those 36 bytes.
BATCH_HEADER = struct.Struct("<IIIH2sQqI")
BATCH_HEADER_SIZE = BATCH_HEADER.size + 4  # 40
BATCH_MARKER = b"PB"
BATCH_FLAGS_OFFSET = 12

# Seal trailer, the last 16 bytes of a sealed log's last segment: magic, offset of the seal
# batch within the segment, CRC-32 of the 12 bytes before it.
TRAILER_MAGIC = b"PLOGSEAL"
TRAILER = struct.Struct("<8sI")
TRAILER_SIZE = TRAILER.size + 4  # 16

# CURRENT: magic, version, reserved, seq of the newest complete log, CRC-32.
POINTER_MAGIC = b"PLOGCURR"
POINTER = struct.Struct("<8sHHQ")
POINTER_SIZE = POINTER.size + 4  # 24

# CLOSED: magic, version, reserved, seq of the log a clean close sealed, its next LSN, CRC-32.
CLOSED_MAGIC = b"PLOGCLSD"
CLOSED = struct.Struct("<8sHHQQ")
CLOSED_SIZE = CLOSED.size + 4  # 32

# consumers/<name>, a named consumer's committed position: magic, version, reserved, log seq,
# segment number, byte offset, next LSN, commit time (µs since the Unix epoch), CRC-32.
CONSUMER_MAGIC = b"PLOGCONS"
CONSUMER = struct.Struct("<8sHHQIQQq")
CONSUMER_SIZE = CONSUMER.size + 4  # 52

# LOGSET, the marker at the root of a log set: magic, marker version, depth, reserved,
# CRC-32. Its version is the set's layout (how keys become shard and directory names).
LOG_SET_MAGIC = b"PLOGLSET"
LOG_SET = struct.Struct("<8sHBB")
LOG_SET_SIZE = LOG_SET.size + 4  # 16
LOG_SET_VERSION = 1
LOG_SET_NAME = "LOGSET"

U32 = struct.Struct("<I")
U16 = struct.Struct("<H")

# Batch flags.
KIND_MASK = 0x0003
KIND_UPDATE = 0
KIND_SNAPSHOT = 1
KIND_MIXED = 2  # first payload item is a byte string bitmap: bit i set = record i is a snapshot
KIND_CONTROL = 3
COMPRESSION_MASK = 0x000C
COMPRESSION_NONE = 0x0000
COMPRESSION_GZIP = 0x0004  # zlib stream (RFC 1950)
COMPRESSION_ZSTD = 0x0008  # zstandard frame with its content size
# The stored payload starts with a 32-byte link: the SHA-256 of the batch before it (the
# hash chain of format version 2; set on every batch of a version 2 segment, never in 1).
FLAG_LINKED = 0x0010
LINK_SIZE = 32
# The payload (after the link) is sealed with AES-256-GCM: a key id, a key check and a
# nonce, then the ciphertext of the (possibly compressed) payload and its 16-byte tag.
FLAG_ENCRYPTED = 0x0020
# The payload (after decryption and decompression) is a shared-values stream: literal
# bytes, values defined for the rest of the log, references to them (version 3 only).
FLAG_SHARED = 0x0040
KNOWN_FLAGS = KIND_MASK | COMPRESSION_MASK | FLAG_LINKED | FLAG_ENCRYPTED | FLAG_SHARED
# Shared-values stream: expanded length, tokens length, literals length (u32 each), then
# the tokens, each an unsigned LEB128 number whose low two bits say what it is and whose
# other bits say how much, then the literal bytes, then the bytes of the values defined.
SHARED_HEADER = struct.Struct("<III")
SHARED_LITERAL = 0  # n bytes follow, copied
SHARED_DEFINE = 1  # n bytes follow, copied, and become the log's next value
SHARED_REFERENCE = 2  # a copy of the log's value number n
# A string or byte string is shared once its CBOR encoding (head included) is this long.
SHARED_MIN_BYTES = 128
# Bytes of values one log defines at most (what a reader of the log holds at most); past
# it a writer defines no more values in that log, and a reader refuses the definition.
SHARED_MAX_BYTES = 32 * 1024 * 1024
# The clear batch header fields an encrypted payload is bound to (associated data): raw
# length, count, flags, marker, first LSN, commit time (batch header bytes 4..31).
BATCH_AAD = struct.Struct("<IIH2sQq")
KEY_ID_MAX_BYTES = 255
KEY_CHECK_SIZE = 8
KEY_CHECK_DOMAIN = b"persistlog key check v1"
NONCE_SIZE = 12
TAG_SIZE = 16
# The least an encrypted payload adds: key id length, a 1-byte key id, check, nonce, tag.
SEAL_OVERHEAD_MIN = 1 + 1 + KEY_CHECK_SIZE + NONCE_SIZE + TAG_SIZE

# Limits, checked before any allocation driven by bytes read from storage.
MAX_BATCH_BYTES = 64 * 1024 * 1024
MAX_RECORD_BYTES = 32 * 1024 * 1024
MAX_POINTER_BYTES = 4096
# Writers refuse a record, snapshot record or metadata value nested deeper than this
# (containers and tags on its deepest path): cbor2's encoder recurses on the C stack,
# about 1.1 KiB a level, and dies with SIGSEGV somewhere past 7,000 levels on an 8 MiB
# stack, past 400 on a 512 KiB one. The same depth as the JSON fast path's MAX_DEPTH in
# _cbor_json.c, so that every record written takes that path.
MAX_RECORD_DEPTH = 256
# What readers accept: logs written before writers had a limit hold records as deep as
# cbor2's encoder could write (about 7,000 levels), and every record a writer logged must
# read back; cbor2's decoder is not recursive, so hostile nesting costs no stack.
MAX_CBOR_DEPTH = 10_000

# Control record types (the "t" key of a control record map).
CONTROL_HEADER = "header"
CONTROL_COMPLETE = "complete"
CONTROL_SEAL = "seal"
# The one batch of a fence segment: a writer that took an object store over wrote it at the
# next segment name of the newest log, so that the writer before it can add nothing there.
CONTROL_FENCE = "fence"
# Key of a log header set when the logs before this one at this destination do not chain
# to it: the writer missed logs or records here (a secondary detached or behind).
HEADER_AFTER_GAP = "after_gap"
# Key of a seal record: the LSN due when the log's ``complete`` record was written. Equal to
# the seal's ``next_lsn``, the log holds its snapshot and nothing after it.
SEAL_COMPLETE_LSN = "complete_lsn"
# Key of a seal record of a chained log: the chain head it ends at (32 bytes).
SEAL_CHAIN = "chain"
# A signed checkpoint: an Ed25519 signature over the chain head (docs/FORMAT.md). What it
# signs: the domain, then the log seq and the LSN due (u64 each), then the 32-byte head.
CONTROL_CHECKPOINT = "checkpoint"
CHECKPOINT_DOMAIN = b"persistlog checkpoint v1\x00"
CHECKPOINT_POSITION = struct.Struct("<QQ")
SIGNATURE_SIZE = 64

FIRST_LSN = 1
FIRST_SEQ = 1

# Names at a destination.
CURRENT_NAME = "CURRENT"
CLOSED_NAME = "CLOSED"
# A new writer's request that the live writer hand the log over (one line of JSON).
HANDOVER_NAME = "HANDOVER"
HANDOVER_MAX_BYTES = 4096
# The directory of the consumers' positions, inside the destination: its files stay out of
# the listings every reader of the log polls.
CONSUMERS_DIR = "consumers"
# A consumer's name: a letter or digit, then up to 63 letters, digits, "_", "." or "-", so
# that it is a plain file name and object key everywhere (never a temporary file's name).
CONSUMER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SEGMENT_NAME = re.compile(r"^(\d{20})-(\d{10})\.plog$")
SEQ_DIGITS = 20
SEGMENT_DIGITS = 10


def segment_name(seq: int, segment: int) -> str:
    """The file name of segment ``segment`` of log ``seq``; lexical order is numeric order."""
    return f"{seq:020d}-{segment:010d}.plog"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    """``(seq, segment)`` for a segment file name, None for any other name."""
    m = SEGMENT_NAME.match(name)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2))

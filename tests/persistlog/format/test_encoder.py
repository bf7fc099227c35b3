"""The encoder on its own, one test per case of docs/FORMAT.md: what each function writes,
field by field, read back with the format's own structs (no decoder in between)."""

from __future__ import annotations

import random
import zlib

import cbor2
import zstandard

from persistlog._format import encoder
from persistlog._format import constants as F

T = 1_700_000_000_000_000  # a commit time, µs


def fields(batch: bytes) -> tuple[int, int, int, int, bytes, int, int, int]:
    """The batch header's fields: stored, raw, count, flags, marker, first LSN, time, payload CRC."""
    return F.BATCH_HEADER.unpack(batch[: F.BATCH_HEADER.size])


def header_crc(batch: bytes) -> int:
    return int(F.U32.unpack_from(batch, F.BATCH_HEADER.size)[0])


def test_segment_header_is_40_bytes_of_magic_version_size_numbers_and_crc() -> None:
    head = encoder.segment_header(seq=7, segment=3, first_lsn=1234)
    assert len(head) == 40
    assert F.SEGMENT_HEADER.unpack(head[:36]) == (b"\x89PLOG\r\n\x1a", 1, 40, 3, 7, 1234, 0)
    assert F.U32.unpack(head[36:]) == (zlib.crc32(head[:36]),)


def test_batch_header_fields_sit_at_their_offsets_little_endian() -> None:
    payload = cbor2.dumps("a") + cbor2.dumps("b")
    batch = encoder.frame(payload, 2, F.KIND_UPDATE, first_lsn=9, commit_us=T)
    assert batch[0:4] == len(payload).to_bytes(4, "little")
    assert batch[4:8] == len(payload).to_bytes(4, "little")
    assert batch[8:12] == (2).to_bytes(4, "little")
    assert batch[12:14] == b"\x00\x00"
    assert batch[14:16] == b"PB"
    assert batch[16:24] == (9).to_bytes(8, "little")
    assert batch[24:32] == T.to_bytes(8, "little")
    assert batch[32:36] == zlib.crc32(payload).to_bytes(4, "little")
    assert batch[40:] == payload


def test_header_crc_covers_the_payload_crc() -> None:
    batch = encoder.frame(b"\x01", 1, F.KIND_UPDATE, 1, T)
    assert header_crc(batch) == zlib.crc32(batch[:36])
    other = encoder.frame(b"\x02", 1, F.KIND_UPDATE, 1, T)
    assert batch[:32] == other[:32]  # only the payload differs...
    assert header_crc(batch) != header_crc(other)  # ...and the header's CRC says so


def test_update_batch_has_kind_update() -> None:
    batch = encoder.record_batch(cbor2.dumps(1), 1, [], first_lsn=5, commit_us=T)
    assert fields(batch)[3] == F.KIND_UPDATE == 0


def test_snapshot_batch_has_kind_snapshot() -> None:
    payload = cbor2.dumps(1) + cbor2.dumps(2)
    batch = encoder.record_batch(payload, 2, [0, 1], first_lsn=5, commit_us=T)
    assert fields(batch)[3] == F.KIND_SNAPSHOT == 1
    assert batch[40:] == payload  # no bitmap


def test_mixed_batch_starts_with_a_bitmap_least_significant_bit_first() -> None:
    payload = b"".join(cbor2.dumps(i) for i in range(10))
    batch = encoder.record_batch(payload, 10, [0, 3, 9], first_lsn=5, commit_us=T)
    stored, raw, count, flags = fields(batch)[:4]
    assert flags == F.KIND_MIXED == 2 and count == 10
    bitmap = cbor2.dumps(bytes([0b0000_1001, 0b0000_0010]))  # ceil(10 / 8) = 2 bytes
    assert batch[40:] == bitmap + payload
    assert stored == raw == len(bitmap) + len(payload)


def test_control_batch_takes_no_lsn_its_first_lsn_is_the_next_due() -> None:
    batch = encoder.control_batch([{"t": "seal", "next_lsn": 42}], next_lsn=42, commit_us=T)
    _, _, count, flags, _, first_lsn, commit_us, _ = fields(batch)
    assert (count, flags, first_lsn, commit_us) == (1, F.KIND_CONTROL, 42, T)
    assert cbor2.loads(batch[40:]) == {"t": "seal", "next_lsn": 42}


def test_empty_batch_is_a_bare_header() -> None:
    batch = encoder.control_batch([], next_lsn=8, commit_us=T)
    assert len(batch) == F.BATCH_HEADER_SIZE == 40
    assert fields(batch)[:3] == (0, 0, 0)
    assert fields(batch)[7] == zlib.crc32(b"") == 0


def test_gzip_batch_is_a_zlib_stream_with_its_raw_length() -> None:
    payload = cbor2.dumps(["same record"] * 200)
    batch = encoder.frame(payload, 1, F.KIND_UPDATE, 1, T, F.COMPRESSION_GZIP)
    stored, raw, _, flags = fields(batch)[:4]
    assert flags == F.KIND_UPDATE | F.COMPRESSION_GZIP == 0x0004
    assert raw == len(payload) and stored == len(batch) - 40 < raw
    assert zlib.decompress(batch[40:]) == payload
    assert fields(batch)[7] == zlib.crc32(batch[40:])  # the CRC is of the stored bytes


def test_zstd_batch_is_one_frame_declaring_its_content_size() -> None:
    payload = cbor2.dumps(["same record"] * 200)
    batch = encoder.frame(payload, 1, F.KIND_SNAPSHOT, 1, T, F.COMPRESSION_ZSTD)
    stored, raw, _, flags = fields(batch)[:4]
    assert flags == F.KIND_SNAPSHOT | F.COMPRESSION_ZSTD == 0x0009
    assert raw == len(payload) and stored < raw
    assert zstandard.frame_content_size(batch[40:]) == len(payload)
    assert zstandard.ZstdDecompressor().decompress(batch[40:]) == payload


def test_incompressible_batch_is_stored_uncompressed() -> None:
    payload = cbor2.dumps(bytes(range(7)))  # too short for zlib to gain anything
    for compression in (F.COMPRESSION_GZIP, F.COMPRESSION_ZSTD):
        batch = encoder.frame(payload, 1, F.KIND_UPDATE, 1, T, compression)
        stored, raw, _, flags = fields(batch)[:4]
        assert flags & F.COMPRESSION_MASK == F.COMPRESSION_NONE
        assert stored == raw == len(payload) and batch[40:] == payload


def test_identical_records_cost_once_when_compressed() -> None:
    record = cbor2.dumps({"op": "put", "key": "k", "value": random.Random(1).randbytes(500)})
    one = encoder.frame(record, 1, F.KIND_UPDATE, 1, T, F.COMPRESSION_GZIP)
    hundred = encoder.frame(record * 100, 100, F.KIND_UPDATE, 1, T, F.COMPRESSION_GZIP)
    assert len(hundred) < 2 * len(one)


def test_seal_trailer_is_16_bytes_naming_the_seal_batch_offset() -> None:
    trailer = encoder.seal_trailer(4096 + 40)
    assert len(trailer) == 16
    assert trailer[:8] == b"PLOGSEAL"
    assert trailer[8:12] == (4136).to_bytes(4, "little")
    assert trailer[12:] == zlib.crc32(trailer[:12]).to_bytes(4, "little")


def test_current_pointer_is_24_bytes_naming_the_newest_complete_log() -> None:
    pointer = encoder.pointer(12)
    assert len(pointer) == 24
    assert F.POINTER.unpack(pointer[:20]) == (b"PLOGCURR", 1, 0, 12)
    assert pointer[20:] == zlib.crc32(pointer[:20]).to_bytes(4, "little")

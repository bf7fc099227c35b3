"""The decoder on its own, one test per case of docs/FORMAT.md: bytes the encoder wrote read
back, and every kind of damage reported as ``Damage`` with its offset and whether it has the
shape of a torn write (only the reader, which knows where the bytes sit, calls it a torn
tail or corruption)."""

from __future__ import annotations

import zlib
from typing import Any

import cbor2
import pytest
import zstandard

from persistlog._format import decoder, encoder
from persistlog._format import constants as F
from persistlog._format.codec import plain_loads
from persistlog._format.decoder import Damage

T = 1_700_000_000_000_000  # a commit time, µs
AT = 4096  # where the batches of these tests sit in their segment


def records(*items: Any) -> bytes:
    return b"".join(cbor2.dumps(i) for i in items)


def reframed(batch: bytes, **changes: Any) -> bytes:
    """``batch`` with header fields changed and both CRCs right again (so that only the
    change is wrong): the hostile writer's view of FORMAT.md."""
    names = ("stored", "raw", "count", "flags", "marker", "first_lsn", "commit_us", "payload_crc")
    values = dict(zip(names, F.BATCH_HEADER.unpack(batch[: F.BATCH_HEADER.size]), strict=True))
    payload = changes.pop("payload", batch[F.BATCH_HEADER_SIZE :])
    values.update(stored=len(payload), payload_crc=zlib.crc32(payload))
    values.update(changes)
    head = F.BATCH_HEADER.pack(*values.values())
    return head + F.U32.pack(zlib.crc32(head)) + payload


def damage(call: Any, *args: Any) -> Damage:
    with pytest.raises(Damage) as info:
        call(*args)
    return info.value


# -- segment header -------------------------------------------------------------------------


def test_segment_header_reads_back_seq_segment_and_first_lsn() -> None:
    head = decoder.parse_segment_header(encoder.segment_header(seq=7, segment=3, first_lsn=1234))
    assert (head.seq, head.segment, head.first_lsn) == (7, 3, 1234)


def test_segment_shorter_than_its_header_is_damage_at_offset_0() -> None:
    d = damage(decoder.parse_segment_header, encoder.segment_header(1, 0, 1)[:39])
    assert d.offset == 0 and "shorter than its 40-byte header" in d.reason


def test_segment_with_bad_magic_is_not_a_segment() -> None:
    head = bytearray(encoder.segment_header(1, 0, 1))
    head[5] ^= 0x20  # "\r\n" -> what a text-mode transfer makes of it
    assert damage(decoder.parse_segment_header, bytes(head)).reason == "not a persistlog segment (bad magic)"


def test_segment_header_crc_mismatch_is_damage() -> None:
    head = bytearray(encoder.segment_header(1, 0, 1))
    head[16] ^= 1  # the seq
    assert damage(decoder.parse_segment_header, bytes(head)).reason == "segment header checksum mismatch"


def test_unknown_format_version_is_refused_naming_it() -> None:
    body = F.SEGMENT_HEADER.pack(F.SEGMENT_MAGIC, 4, 40, 0, 1, 1, 0)
    d = damage(decoder.parse_segment_header, body + F.U32.pack(zlib.crc32(body)))
    assert d.reason == "unknown format version 4 (this reader knows 1, 2, 3)"


# -- batch header ---------------------------------------------------------------------------


def test_batch_header_reads_back_every_field() -> None:
    payload = records("a", "b", "c")
    head = decoder.parse_batch_header(encoder.frame(payload, 3, F.KIND_SNAPSHOT, 17, T), AT)
    assert (head.stored_len, head.raw_len, head.count, head.kind, head.first_lsn, head.commit_us) == (
        len(payload), len(payload), 3, F.KIND_SNAPSHOT, 17, T)
    assert head.payload_crc == zlib.crc32(payload)
    assert head.size == 40 + len(payload) and head.lsn_count == 3


def test_control_batch_takes_no_lsns() -> None:
    batch = encoder.control_batch([{"t": "complete", "records": 5}], next_lsn=9, commit_us=T)
    head = decoder.parse_batch_header(batch, AT)
    assert (head.kind, head.count, head.first_lsn, head.lsn_count) == (F.KIND_CONTROL, 1, 9, 0)


def test_torn_batch_header_has_the_shape_of_a_torn_write() -> None:
    batch = encoder.frame(records(1), 1, F.KIND_UPDATE, 1, T)
    d = damage(decoder.parse_batch_header, batch[:39], AT)
    assert (d.reason, d.offset, d.torn_shape) == ("batch header cut short", AT, True)


def test_all_zero_batch_header_has_the_shape_of_a_torn_write() -> None:
    d = damage(decoder.parse_batch_header, bytes(40), AT)
    assert (d.reason, d.offset, d.torn_shape) == ("batch header checksum mismatch", AT, True)


def test_batch_header_crc_mismatch_is_damage_naming_its_offset() -> None:
    batch = bytearray(encoder.frame(records(1), 1, F.KIND_UPDATE, 1, T))
    batch[16] ^= 1  # the first LSN
    d = damage(decoder.parse_batch_header, bytes(batch), AT)
    assert (d.reason, d.offset, d.torn_shape) == ("batch header checksum mismatch", AT, False)


def test_oversize_length_is_refused_from_the_header_alone() -> None:
    """The length is checked before anything is read or allocated for the payload: the
    header is all the decoder is given."""
    batch = encoder.frame(records(1), 1, F.KIND_UPDATE, 1, T)
    huge = reframed(batch, stored=F.MAX_BATCH_BYTES + 1, raw=F.MAX_BATCH_BYTES + 1)[:40]
    d = damage(decoder.parse_batch_header, huge, AT)
    assert d.reason == f"batch length {F.MAX_BATCH_BYTES + 1} exceeds the 67108864-byte limit"
    assert (d.offset, d.torn_shape) == (AT, False)


def test_raw_length_past_the_limit_is_refused_too() -> None:
    batch = encoder.frame(records(1), 1, F.KIND_UPDATE, 1, T, F.COMPRESSION_NONE)
    bomb = reframed(batch, flags=F.COMPRESSION_GZIP, raw=F.MAX_BATCH_BYTES + 1)[:40]
    assert "exceeds the 67108864-byte limit" in damage(decoder.parse_batch_header, bomb, AT).reason


def test_bad_batch_marker_is_damage() -> None:
    batch = reframed(encoder.frame(records(1), 1, F.KIND_UPDATE, 1, T), marker=b"XX")
    assert damage(decoder.parse_batch_header, batch, AT).reason == "bad batch marker"


def test_unknown_flag_bit_is_refused() -> None:
    batch = reframed(encoder.frame(records(1), 1, F.KIND_UPDATE, 1, T), flags=0x0080)
    assert damage(decoder.parse_batch_header, batch, AT).reason == "unknown batch flags 0x0080"


def test_uncompressed_batch_whose_lengths_differ_is_damage() -> None:
    batch = reframed(encoder.frame(records(1), 1, F.KIND_UPDATE, 1, T), raw=2)
    assert damage(decoder.parse_batch_header, batch, AT).reason == (
        "uncompressed batch with differing stored and raw lengths")


def test_more_records_than_payload_bytes_is_damage() -> None:
    batch = reframed(encoder.frame(records(1, 2), 2, F.KIND_UPDATE, 1, T), count=3)
    assert damage(decoder.parse_batch_header, batch, AT).reason == "record count 3 impossible for 2 payload bytes"


def test_empty_batch_holds_no_records() -> None:
    batch = encoder.control_batch([], next_lsn=8, commit_us=T)
    head = decoder.parse_batch_header(batch, AT)
    assert (head.count, head.size) == (0, 40)
    raw = decoder.check_payload(head, batch[40:], AT)
    assert raw == b"" and decoder.split_records(head, raw, AT, plain_loads) == ([], None)


def test_zero_records_with_payload_bytes_is_damage() -> None:
    batch = reframed(encoder.frame(records(1), 1, F.KIND_UPDATE, 1, T), count=0)
    assert damage(decoder.parse_batch_header, batch, AT).reason == "record count 0 impossible for 1 payload bytes"


# -- payload --------------------------------------------------------------------------------


def test_payload_crc_mismatch_has_the_shape_of_a_torn_write() -> None:
    """A last batch whose payload CRC fails is a torn tail, anywhere else corruption: the
    decoder says the shape, the reader where it is."""
    batch = encoder.frame(records("abc"), 1, F.KIND_UPDATE, 1, T)
    head = decoder.parse_batch_header(batch, AT)
    d = damage(decoder.check_payload, head, batch[40:-1] + b"x", AT)
    assert (d.reason, d.offset, d.torn_shape) == ("batch payload checksum mismatch", AT, True)


@pytest.mark.parametrize("compression", [F.COMPRESSION_GZIP, F.COMPRESSION_ZSTD], ids=["gzip", "zstd"])
def test_compressed_batch_decompresses_to_its_raw_payload(compression: int) -> None:
    payload = records(*(["same record"] * 100))
    batch = encoder.frame(payload, 100, F.KIND_UPDATE, 1, T, compression)
    head = decoder.parse_batch_header(batch, AT)
    assert head.flags & F.COMPRESSION_MASK == compression and head.stored_len < head.raw_len
    assert decoder.check_payload(head, batch[40:], AT) == payload


def test_zlib_stream_longer_than_its_raw_length_is_damage() -> None:
    payload = records(*(["x" * 50] * 100))
    batch = encoder.frame(payload, 100, F.KIND_UPDATE, 1, T, F.COMPRESSION_GZIP)
    short = reframed(batch, raw=len(payload) - 1)
    head = decoder.parse_batch_header(short, AT)
    d = damage(decoder.check_payload, head, short[40:], AT)
    assert d.reason.startswith("batch payload does not decompress: zlib stream longer than its declared length")
    assert d.offset == AT


def test_zstd_frame_declaring_more_than_the_raw_length_is_refused_before_decompressing() -> None:
    payload = records(*(["x" * 50] * 100))
    batch = encoder.frame(payload, 100, F.KIND_UPDATE, 1, T, F.COMPRESSION_ZSTD)
    short = reframed(batch, raw=len(payload) - 1)
    head = decoder.parse_batch_header(short, AT)
    d = damage(decoder.check_payload, head, short[40:], AT)
    assert d.reason == f"batch payload does not decompress: zstd frame declares {len(payload)} bytes"


def test_zstd_frame_shorter_than_the_raw_length_is_damage() -> None:
    payload = records(*(["x" * 50] * 100))
    stored = zstandard.ZstdCompressor(write_content_size=True).compress(payload)
    batch = reframed(encoder.frame(payload, 100, F.KIND_UPDATE, 1, T), flags=F.COMPRESSION_ZSTD,
                     raw=len(payload) + 1, payload=stored)
    head = decoder.parse_batch_header(batch, AT)
    d = damage(decoder.check_payload, head, batch[40:], AT)
    assert d.reason == f"decompressed {len(payload)} bytes, header says {len(payload) + 1}"


def test_payload_that_is_not_cbor_is_damage() -> None:
    batch = encoder.frame(b"\x1c", 1, F.KIND_UPDATE, 1, T)  # an integer of unknown subtype
    head = decoder.parse_batch_header(batch, AT)
    raw = decoder.check_payload(head, batch[40:], AT)
    d = damage(decoder.split_records, head, raw, AT, plain_loads)
    assert d.reason.startswith("batch payload is not a CBOR sequence") and d.offset == AT


def test_count_that_does_not_match_the_payload_is_damage() -> None:
    batch = reframed(encoder.frame(records("a", "b", "c"), 3, F.KIND_UPDATE, 1, T), count=2)
    head = decoder.parse_batch_header(batch, AT)
    d = damage(decoder.split_records, head, batch[40:], AT, plain_loads)
    assert d.reason == "batch holds 3 records, header says 2"


def test_mixed_batch_bitmap_says_which_records_are_snapshots() -> None:
    batch = encoder.record_batch(records(*range(10)), 10, [0, 3, 9], 1, T)
    head = decoder.parse_batch_header(batch, AT)
    items, bitmap = decoder.split_records(head, batch[40:], AT, plain_loads)
    assert items == list(range(10)) and bitmap == bytes([0b0000_1001, 0b0000_0010])
    kinds = decoder.RecordKinds(head.kind, bitmap, head.count)
    assert [i for i, k in enumerate(kinds) if k == "snapshot"] == [0, 3, 9]


def test_mixed_batch_without_its_bitmap_is_damage() -> None:
    batch = encoder.frame(records(1, 2), 2, F.KIND_MIXED, 1, T)
    head = decoder.parse_batch_header(batch, AT)
    d = damage(decoder.split_records, head, batch[40:], AT, plain_loads)
    assert d.reason == "mixed batch without a valid kind bitmap"


def test_record_slices_add_up_to_the_batch() -> None:
    values = [{"k": i, "v": "x" * (i % 50)} for i in range(500)]
    batch = encoder.record_batch(records(*values), 500, [], 1, T)
    head = decoder.parse_batch_header(batch, AT)
    slices = list(decoder.record_slices(head, batch[40:], AT, plain_loads, slice_bytes=1024))
    assert len(slices) > 1
    assert [i for i, _ in slices] == [0] + [sum(len(r) for _, r in slices[:n]) for n in range(1, len(slices))]
    assert [r for _, rs in slices for r in rs] == values


def test_control_record_without_a_type_is_malformed() -> None:
    batch = encoder.control_batch([{"records": 1}], next_lsn=1, commit_us=T)
    head = decoder.parse_batch_header(batch, AT)
    assert damage(decoder.control_records, head, batch[40:], AT).reason == "malformed control record"


def test_control_records_read_back_with_unknown_types_kept_for_the_reader_to_skip() -> None:
    written = [{"t": "complete", "records": 2}, {"t": "from-the-future", "x": 1}]
    batch = encoder.control_batch(written, next_lsn=3, commit_us=T)
    head = decoder.parse_batch_header(batch, AT)
    assert decoder.control_records(head, batch[40:], AT) == written


# -- seal trailer and CURRENT -----------------------------------------------------------------


def test_seal_trailer_gives_the_seal_batch_offset() -> None:
    assert decoder.parse_trailer(encoder.seal_trailer(4136)) == 4136


@pytest.mark.parametrize("damaged", [
    encoder.seal_trailer(4136)[:15],  # cut short
    bytes(16),  # zeros
    b"PLOGSEAX" + encoder.seal_trailer(4136)[8:],  # bad magic
    encoder.seal_trailer(4136)[:12] + b"\0\0\0\0",  # bad CRC
], ids=["cut short", "zeros", "bad magic", "bad crc"])
def test_damaged_seal_trailer_is_no_trailer(damaged: bytes) -> None:
    assert decoder.parse_trailer(damaged) is None


def test_current_pointer_gives_the_seq_it_names() -> None:
    assert decoder.parse_pointer(encoder.pointer(12)) == 12


@pytest.mark.parametrize("damaged", [
    encoder.pointer(12)[:23],  # cut short
    bytes(24),  # zeros
    encoder.pointer(12)[:8] + b"\x02" + encoder.pointer(12)[9:],  # another version
    encoder.pointer(12)[:12] + b"\x0d" + encoder.pointer(12)[13:],  # bad CRC (another seq)
], ids=["cut short", "zeros", "unknown version", "bad crc"])
def test_damaged_current_pointer_is_only_a_missing_hint(damaged: bytes) -> None:
    assert decoder.parse_pointer(damaged) is None

"""docs/FORMAT.md and persistlog/_format/constants.py state the same numbers.

The doc is the specification and the module its one copy in code: each test reads a
number or a byte string out of the doc's text and holds the constant to it, so that a
change to one without the other fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import cbor2
import pytest

from persistlog._format import decoder, encoder
from persistlog._format import constants as F
from persistlog._format.shared_values import SharedValues, ValueTable

DOC = (Path(__file__).resolve().parents[3] / "docs" / "FORMAT.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    """The text of the doc's ``## title`` section, up to the next ``## ``."""
    m = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", DOC, re.M | re.S)
    assert m is not None, f"FORMAT.md has no section {title!r}"
    return m.group(1)


def table_rows(text: str) -> list[tuple[int, int, str]]:
    """``(offset, size, field)`` of each row of a byte-layout table."""
    rows = []
    for m in re.finditer(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(.*?)\s*\|$", text, re.M):
        rows.append((int(m.group(1)), int(m.group(2)), m.group(3)))
    return rows


@pytest.mark.parametrize(
    ("title", "size"),
    [
        ("Segment header", F.SEGMENT_HEADER_SIZE),
        ("Batch", F.BATCH_HEADER_SIZE),
        ("Seal trailer", F.TRAILER_SIZE),
        ("CURRENT", F.POINTER_SIZE),
        ("CLOSED", F.CLOSED_SIZE),
        ("consumers/<name>", F.CONSUMER_SIZE),
        ("LOGSET", F.LOG_SET_SIZE),
    ],
)
def test_layout_tables_are_contiguous_and_as_long_as_the_struct(title: str, size: int) -> None:
    rows = table_rows(section(title))
    assert rows, f"no layout table under {title!r}"
    at = 0
    for offset, width, field in rows:
        assert offset == at, f"{title}: {field!r} starts at {offset}, the row before ends at {at}"
        at += width
    assert at == size
    assert f"({size} bytes" in DOC or title == "Batch"  # the batch's title says "40-byte header"


def test_batch_title_states_the_header_size() -> None:
    assert f"## Batch ({F.BATCH_HEADER_SIZE}-byte header + payload)" in DOC


def test_struct_fields_have_the_widths_the_tables_give() -> None:
    # The CRC of each structure follows the struct; the tables list it as the last row.
    for title, struct_ in (
        ("Segment header", F.SEGMENT_HEADER),
        ("Batch", F.BATCH_HEADER),
        ("Seal trailer", F.TRAILER),
        ("CURRENT", F.POINTER),
        ("CLOSED", F.CLOSED),
        ("consumers/<name>", F.CONSUMER),
        ("LOGSET", F.LOG_SET),
    ):
        rows = table_rows(section(title))
        assert sum(width for _o, width, _f in rows[:-1]) == struct_.size, title
        assert "CRC-32" in rows[-1][2], title


def test_magics() -> None:
    assert "`89 50 4C 4F 47 0D 0A 1A`" in DOC and F.SEGMENT_MAGIC == bytes.fromhex("89504C4F470D0A1A")
    assert f"magic `{F.TRAILER_MAGIC.decode()}`" in DOC
    assert f"magic `{F.POINTER_MAGIC.decode()}`" in DOC
    assert f"magic `{F.CLOSED_MAGIC.decode()}`" in DOC
    assert f"magic `{F.LOG_SET_MAGIC.decode()}`" in DOC
    assert f"magic `{F.CONSUMER_MAGIC.decode()}`" in DOC
    assert f"marker `50 42` (`{F.BATCH_MARKER.decode()}`)" in DOC


def test_flags() -> None:
    flags = section("Batch")
    assert "0 update, 1 snapshot, 2 mixed, 3 control" in flags
    assert (F.KIND_UPDATE, F.KIND_SNAPSHOT, F.KIND_MIXED, F.KIND_CONTROL) == (0, 1, 2, 3)
    assert F.KIND_MASK == 0b11 and "| 0-1   | kind" in flags
    # Compression values sit in bits 2-3: value n is flag n << 2.
    assert "0 none, 1 zlib stream" in flags and "2 zstd frame" in flags
    assert (F.COMPRESSION_NONE, F.COMPRESSION_GZIP, F.COMPRESSION_ZSTD) == (0, 1 << 2, 2 << 2)
    assert F.COMPRESSION_MASK == 0b1100 and "| 2-3   | compression" in flags
    assert "| 7-15  | reserved" in flags and F.KNOWN_FLAGS == 0x007F
    assert "| 6     | shared" in flags and F.FLAG_SHARED == 1 << 6
    assert "| 4     | link" in flags and F.FLAG_LINKED == 1 << 4
    assert "| 5     | encrypted" in flags and F.FLAG_ENCRYPTED == 1 << 5


def test_encrypted_batches() -> None:
    enc = section("Encrypted batches")
    assert f"| 0      | 1    | key id length k, u8 (1 to {F.KEY_ID_MAX_BYTES})" in enc
    assert f"| 1+k    | {F.KEY_CHECK_SIZE}    | key check" in enc
    assert f"| 9+k    | {F.NONCE_SIZE}   | nonce" in enc
    assert f"| …      | {F.TAG_SIZE}   | GCM tag" in enc
    assert F.KEY_CHECK_DOMAIN.decode() in enc and F.BATCH_AAD.size == 28 and "bytes 4..31" in enc
    assert F.SEAL_OVERHEAD_MIN == 38 and "at least 38" in enc


def test_limits() -> None:
    mib = F.MAX_BATCH_BYTES // (1024 * 1024)
    assert f"(at most {mib} MiB)" in section("Batch")
    assert f"{F.MAX_CBOR_DEPTH:,} containers deep" in section("Records")
    records = " ".join(section("Records").split())
    assert f"nested more than {F.MAX_RECORD_DEPTH} levels deep" in records
    assert f"at most {F.MAX_RECORD_BYTES // (1024 * 1024)} MiB (`MAX_RECORD_BYTES`)" in records


def test_names() -> None:
    files = section("Files at a destination")
    assert f"in {F.SEQ_DIGITS} decimal" in files
    assert f"segment number in {F.SEGMENT_DIGITS}" in files
    example = re.search(r"^(\d+-\d+\.plog)\s+log (\d+), segment (\d+)$", files, re.M)
    assert example is not None
    assert F.parse_segment_name(example.group(1)) == (int(example.group(2)), int(example.group(3)))
    assert F.segment_name(int(example.group(2)), int(example.group(3))) == example.group(1)
    assert f"`{F.CURRENT_NAME}`" in DOC or F.CURRENT_NAME in files
    assert F.CLOSED_NAME in files


def test_the_closed_note_is_what_the_table_says() -> None:
    from persistlog._format import encoder
    from persistlog._format.decoder import parse_closed_note

    note = encoder.closed_note(7, 1234)
    assert len(note) == F.CLOSED_SIZE and note[:8] == F.CLOSED_MAGIC
    assert int.from_bytes(note[12:20], "little") == 7 and int.from_bytes(note[20:28], "little") == 1234
    assert parse_closed_note(note) == (7, 1234)
    assert parse_closed_note(note[:-1] + bytes([note[-1] ^ 1])) is None


def test_a_consumer_position_is_what_the_table_says() -> None:
    from persistlog._format.decoder import parse_consumer_position

    buf = encoder.consumer_position(7, 3, 4096, 1234, 1_700_000_000_000_000)
    assert len(buf) == F.CONSUMER_SIZE and buf[:8] == F.CONSUMER_MAGIC
    fields = {name: (offset, size) for offset, size, name in table_rows(section("consumers/<name>"))}

    def at(prefix: str) -> int:
        offset, size = next(v for k, v in fields.items() if k.startswith(prefix))
        return int.from_bytes(buf[offset:offset + size], "little", signed=prefix == "commit time")
    assert (at("seq of the log"), at("segment number"), at("byte offset"), at("LSN due")) == (7, 3, 4096, 1234)
    assert at("commit time") == 1_700_000_000_000_000
    assert parse_consumer_position(buf) == (7, 3, 4096, 1234, 1_700_000_000_000_000)
    text = " ".join(section("consumers/<name>").split())
    assert F.CONSUMER_NAME.pattern == r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
    assert "a letter or digit, then up to 63 letters, digits, `_`, `.` or `-`" in text
    assert f"`{F.CONSUMERS_DIR}/` directory" in section("consumers/<name>")


def test_version_and_first_numbers() -> None:
    assert f"format version, u16 = {F.FORMAT_VERSION}" in section("Segment header")
    assert f"# persistlog format, versions {F.FORMAT_VERSION}, {F.CHAINED_VERSION} and {F.SHARED_VERSION}" in DOC
    assert f"or {F.CHAINED_VERSION} in a chained log, or {F.SHARED_VERSION} in a chained log that shares values" in (
        section("Segment header"))
    assert F.SEGMENT_VERSIONS == (1, 2, 3) and F.LINK_SIZE == 32
    assert F.FIRST_LSN == 1 and "LSNs start at 1" in DOC
    assert F.FIRST_SEQ == 1 and "Seqs start at 1" in DOC


def test_control_record_names() -> None:
    records = section("Records")
    for name in (F.CONTROL_HEADER, F.CONTROL_COMPLETE, F.CONTROL_SEAL, F.CONTROL_FENCE):
        assert f"| `{name}`" in records
    assert f"`{F.HEADER_AFTER_GAP}: true`" in records


def test_fence_segment_is_the_bytes_the_doc_spells() -> None:
    text = section("Fence segment")
    assert [(o, w) for o, w, _f in table_rows(text)] == [(0, F.SEGMENT_HEADER_SIZE), (40, F.BATCH_HEADER_SIZE)]
    assert re.search(r"^\| 80\s+\| n\s+\| payload", text, re.M)
    data = encoder.fence_segment(7, 3, 100, "host:1:ab", 1_769_000_000_000_000)
    head = decoder.parse_segment_header(data[:40])
    assert (head.seq, head.segment, head.first_lsn) == (7, 3, 100)
    batch = decoder.parse_batch_header(data[40:80], 40)
    assert (batch.kind, batch.count, batch.first_lsn) == (F.KIND_CONTROL, 1, 100)
    assert batch.commit_us == 1_769_000_000_000_000
    assert batch.stored_len == batch.raw_len == len(data) - 80  # no compression, nothing after it
    spelled = ["A3", "61 74", "65 66 65 6E 63 65", "66 77 72 69 74 65 72", "67 63 72 65 61 74 65 64"]
    assert all(f"`{group}`" in text for group in spelled)
    expected = b"".join(bytes.fromhex(g) for g in spelled[:4]) + cbor2.dumps("host:1:ab")
    expected += bytes.fromhex(spelled[4]) + cbor2.dumps(1_769_000_000_000_000)
    assert data[80:] == expected


def test_log_set_marker_as_the_doc_spells_it() -> None:
    from persistlog._format import encoder
    from persistlog._format.log_set_layout import key_name, shards

    logset = section("LOGSET")
    assert f"layout version, u16 = {F.LOG_SET_VERSION}" in logset and f"`{F.LOG_SET_NAME}`" in logset
    spelt = re.search(r"Depth 1 in bytes: `([0-9A-F ]+)`", logset)
    assert spelt is not None and encoder.log_set_marker(1)[:12] == bytes.fromhex(spelt.group(1))
    example = re.search(r"^(\w\w)/(\S+)/\s+depth 1: the destination of key \"(.+)\"$", logset, re.M)
    assert example is not None
    assert shards(example.group(3), 1) == [example.group(1)] and key_name(example.group(3)) == example.group(2)
    assert "at most 255 bytes" in logset


def test_a_handover_request_is_what_the_section_shows() -> None:
    import json

    from persistlog._format import encoder
    from persistlog._format.decoder import parse_handover_request

    text = section("HANDOVER")
    assert f"`{F.HANDOVER_NAME}`" in DOC and F.HANDOVER_NAME in section("Files at a destination")
    assert f"at most {F.HANDOVER_MAX_BYTES:,} bytes" in text
    shown = json.loads(re.search(r"^(\{.*\})$", text, re.M).group(1))  # type: ignore[union-attr]
    written = json.loads(encoder.handover_request(shown["owner"], shown["host"], shown["pid"], shown["to"],
                                                   shown["asked"], shown["deadline"]))
    assert written == shown
    assert parse_handover_request(json.dumps(shown).encode()) == (shown["owner"], shown["to"], shown["asked"],
                                                                  shown["deadline"])
    for broken in (b"", b"{}", b"[1]", json.dumps({**shown, "to": 3}).encode(), b" " * (F.HANDOVER_MAX_BYTES + 1)):
        assert parse_handover_request(broken) is None



def test_shared_values_stream_as_documented() -> None:
    """The layout, token kinds and limits of "Shared values", and its worked example
    byte for byte: the writer's stream for two records holding one 300-byte string."""
    text = section("Shared values")
    assert [r[:2] for r in table_rows(text)] == [(0, 4), (4, 4), (8, 4)]  # then tokens, literals, values
    assert "expanded length e, u32 (at most 64 MiB)" in text and "literals length l, u32" in text
    assert F.SHARED_HEADER.size == 12
    assert "| 0    | literal" in text and F.SHARED_LITERAL == 0
    assert "| 1    | define" in text and F.SHARED_DEFINE == 1
    assert "| 2    | reference" in text and F.SHARED_REFERENCE == 2
    assert F.SHARED_MAX_BYTES == 32 * 1024 * 1024 and "at most 32 MiB of values" in text
    assert F.SHARED_MIN_BYTES == 128 and "128 bytes or more" in text
    x = bytes(range(256)) + bytes(44)
    record = {"p": x}
    payload = cbor2.dumps(record) * 2
    shared = SharedValues()
    shared.hint(1, [record, record])
    stream = shared.share(payload, 1, 3)
    assert stream is not None
    example = text[text.index("```\noffset  bytes"):].splitlines()
    head = b"".join(bytes.fromhex(line[8:34]) for line in example[2:10])
    assert stream[:len(head)] == head
    assert stream[len(head):] == bytes.fromhex("59012C") + x
    assert (len(stream), len(payload)) == (327, 612) and "327 bytes in place of 612" in text
    assert decoder.expand_shared(stream, ValueTable((1, 0, 0)), 0) == payload

"""The decoder's checks in C (``checked_run``) vouch for a batch exactly when the
Python checks (``parse_batch_header``, ``check_payload``) accept it and it is a plain batch
(uncompressed, clear, sharing no values, smaller than the hashing limit) whose link is the
one due; and what it gives for it is what they give. Headers here are made field by field,
at the edges of every check, with their checksums right or wrong."""

from __future__ import annotations

import hashlib
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis_profiles import active_profile

from persistlog._format import decoder
from persistlog._format import constants as F
from persistlog._format.decoder import Damage, check_payload, checked_run, parse_batch_header

_c = pytest.importorskip("persistlog._cbor_json")
if not hasattr(_c, "checked_batches"):
    pytest.skip("the C accelerator was built without the batch checks", allow_module_level=True)

UNDER = 4096
PLAIN = F.COMPRESSION_MASK | F.FLAG_ENCRYPTED | F.FLAG_SHARED

_lengths = st.sampled_from([0, 1, 2, 31, 32, 33, 4096, 2**32 - 1, F.MAX_BATCH_BYTES, F.MAX_BATCH_BYTES + 1])
_flag_bits = st.sampled_from([F.FLAG_LINKED, F.FLAG_SHARED, F.FLAG_ENCRYPTED, F.COMPRESSION_GZIP, F.COMPRESSION_ZSTD,
                              F.KIND_CONTROL, 1, 0x80, 0x8000])
#: What may be wrong with a batch (None: nothing).
CHANGES = [None, "stored", "raw", "count", "flags", "marker", "payload crc", "header crc", "payload byte"]


@st.composite
def batches(draw: Any) -> tuple[bytes, bytes | None]:
    """A well-formed batch with at most one thing changed in it (a field set to an edge of
    its check, a checksum or a byte wrong), and the link it carries if any."""
    flags = draw(st.integers(0, 3)) | (F.FLAG_LINKED if draw(st.booleans()) else 0)
    link = draw(st.binary(min_size=32, max_size=32)) if flags & F.FLAG_LINKED else None
    payload = bytearray(draw(st.binary(max_size=100)))
    count = draw(st.integers(1, max(1, len(payload)))) if payload else draw(st.integers(0, 1))
    fields: list[Any] = [len(link or b"") + len(payload), len(payload), count, flags, F.BATCH_MARKER,
                         draw(st.integers(0, 2**64 - 1)), draw(st.integers(-(2**63), 2**63 - 1)),
                         zlib.crc32((link or b"") + payload)]
    change = draw(st.sampled_from(CHANGES))
    if change in ("stored", "raw", "count"):
        i = ("stored", "raw", "count").index(change)
        near = st.sampled_from([fields[i] - 1, fields[i] + 1]).filter(lambda v: 0 <= v < 2**32)
        fields[i] = draw(_lengths | near)
    elif change == "flags":
        fields[3] ^= draw(_flag_bits)
    elif change == "marker":
        fields[4] = draw(st.sampled_from([b"PC", b"BP", b"\0\0"]))
    elif change == "payload crc":
        fields[7] ^= 1 << draw(st.integers(0, 31))
    elif change == "payload byte" and payload:
        payload[draw(st.integers(0, len(payload) - 1))] ^= 1 << draw(st.integers(0, 7))
    head = F.BATCH_HEADER.pack(*fields)
    head_crc = zlib.crc32(head) ^ (1 << draw(st.integers(0, 31)) if change == "header crc" else 0)
    return head + F.U32.pack(head_crc) + (link or b"") + bytes(payload), link


def python_verdict(seg: bytes, pos: int, limit: int, expect: bytes | None, chained: bool) -> Any:
    """What the checks in C must give for the one batch at ``pos``: [] unless the Python checks
    accept it and it is one they take."""
    try:
        header = parse_batch_header(seg[pos:pos + F.BATCH_HEADER_SIZE], pos)
        end = pos + header.size
        if end > limit or header.size >= UNDER or header.flags & PLAIN or header.linked != chained:
            return []
        raw = check_payload(header, seg[pos + F.BATCH_HEADER_SIZE:end], pos)
    except Damage:
        return []
    link = seg[pos + F.BATCH_HEADER_SIZE:pos + F.BATCH_HEADER_SIZE + F.LINK_SIZE] if header.linked else None
    if link is not None and expect is not None and link != expect:
        return []
    return [(end, header, raw, link, hashlib.sha256(seg[pos:end]).digest() if link is not None else None)]


@active_profile(max_examples=400)
@given(batches(), st.integers(0, 50), st.binary(max_size=39), st.sampled_from(["none", "right", "wrong"]))
def test_the_checks_in_c_vouch_for_exactly_what_the_python_checks_accept(
    batch: tuple[bytes, bytes | None], pos: int, after: bytes, expect: str
) -> None:
    data, link = batch
    seg = bytes(pos) + data + after  # what follows is shorter than a header: the run ends there
    expected_link = None if expect == "none" else link if expect == "right" else bytes(32)
    run = checked_run(seg, 0, pos, len(seg), len(seg), expected_link, link is not None, UNDER)
    want = python_verdict(seg, pos, len(seg), expected_link, link is not None)
    assert run == want
    if run:  # the header is a BatchHeader like any other
        assert type(run[0][1]) is decoder.BatchHeader and hash(run[0][1]) == hash(want[0][1])


def plain_batch(first_lsn: int, link: bytes | None = None, payload: bytes = b"\x01") -> bytes:
    stored = (link or b"") + payload
    flags = F.FLAG_LINKED if link is not None else 0
    head = F.BATCH_HEADER.pack(len(stored), len(payload), 1, flags, F.BATCH_MARKER, first_lsn, 0, zlib.crc32(stored))
    return head + F.U32.pack(zlib.crc32(head)) + stored


def test_links_are_checked_from_batch_to_batch_and_only_in_a_chained_log() -> None:
    first = plain_batch(1, bytes(32))
    second = plain_batch(2, hashlib.sha256(first).digest())
    seg = first + second + plain_batch(3, bytes(32))  # the third links to something else
    run = checked_run(seg, 0, 0, len(seg), len(seg), bytes(32), True, UNDER)
    assert [(end, link, digest) for end, _h, _raw, link, digest in run] == [
        (len(first), bytes(32), hashlib.sha256(first).digest()),
        (len(first) + len(second), hashlib.sha256(first).digest(), hashlib.sha256(second).digest()),
    ]
    assert checked_run(seg, 0, 0, len(seg), len(seg), b"\1" * 32, True, UNDER) == []  # not the link due
    assert checked_run(seg, 0, 0, len(seg), len(seg), None, False, UNDER) == []  # a link in an unchained log
    unlinked = plain_batch(1)
    assert checked_run(unlinked, 0, 0, len(unlinked), len(unlinked), None, True, UNDER) == []  # none in a chained one
    assert len(checked_run(unlinked, 0, 0, len(unlinked), len(unlinked), bytes(32), False, UNDER)) == 1


def test_a_window_that_starts_later_or_ends_sooner_takes_nothing_outside_it() -> None:
    seg = plain_batch(7) * 3
    whole = checked_run(seg, 0, 0, len(seg), len(seg), None, False, UNDER)
    assert [end for end, *_ in whole] == [41, 82, 123]
    assert checked_run(seg[41:], 41, 0, len(seg), len(seg), None, False, UNDER) == []  # before the window
    assert [end for end, *_ in checked_run(seg[41:], 41, 41, len(seg), len(seg), None, False, UNDER)] == [82, 123]
    assert [end for end, *_ in checked_run(seg, 0, 0, len(seg), 100, None, False, UNDER)] == [41, 82]  # segment size
    assert [end for end, *_ in checked_run(seg, 0, 0, 41, len(seg), None, False, UNDER)] == [41]  # stop
    assert checked_run(seg, 0, 0, len(seg), len(seg), None, False, 41) == []  # the size limit


def test_a_run_ends_once_it_holds_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    seg = plain_batch(7) * 10
    monkeypatch.setattr(decoder, "RUN_BYTES", 100)
    assert [end for end, *_ in checked_run(seg, 0, 0, len(seg), len(seg), None, False, UNDER)] == [41, 82, 123]


def test_without_the_c_accelerator_no_batch_is_checked_in_c(monkeypatch: pytest.MonkeyPatch) -> None:
    seg = plain_batch(7)
    monkeypatch.setattr(decoder, "_checked_batches", None)
    assert checked_run(seg, 0, 0, len(seg), len(seg), None, False, UNDER) == []

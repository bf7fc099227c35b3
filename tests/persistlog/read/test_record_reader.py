"""RecordReader: the record at an LSN of a live log, read from storage (docs/DESIGN.md,
"Queues"; the reader behind ``Queue.receive``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from destinations import open_destination
from batches import update_batch_by_hand
from log_files import flip_bit, segment_files

import persistlog
from persistlog._read.record_reader import RecordNotWritten, RecordReader
from persistlog._write.log import parts_of

# Every test twice: the batches between the cursor and a record checked in C (a run at a
# time), and by the Python checks alone.
pytestmark = pytest.mark.usefixtures("batch_checks")


def written_log(tmp_path: Path, n: int, **options: object) -> tuple[persistlog.Log, dict[int, dict[str, int]]]:
    lg = persistlog.open(tmp_path / "log", lambda emit: None, durability="flush", **options)  # type: ignore[arg-type]
    at = {}
    for i in range(n):
        record = {"i": i, "pad": "x" * (i % 50)}
        at[lg.update(record)] = record
    return lg, at


def test_records_are_read_by_lsn_forwards_backwards_and_across_segments_and_logs(tmp_path: Path) -> None:
    lg, at = written_log(tmp_path, 300, segment_bytes=4096, rotate_records=120, batch_bytes=512, retain=10)
    lg.rotate()
    assert len(segment_files(tmp_path / "log")) > 4, "a few logs of a few segments each"
    reader = RecordReader(open_destination(str(tmp_path / "log")), persistlog.Codec().loads)
    lsns = sorted(at)
    for lsn in lsns:  # forwards: the cursor moves on
        assert reader.record(lsn) == at[lsn]
    for lsn in reversed(lsns[::37]):  # backwards: each one located again
        assert reader.record(lsn) == at[lsn]
    with pytest.raises(RecordNotWritten):
        reader.record(lsns[-1] + 10)
    lg.close()


def test_a_record_still_in_the_writer_s_buffer_is_read_after_written(tmp_path: Path) -> None:
    lg = persistlog.open(tmp_path / "log", lambda emit: None, durability="buffered", flush_interval=60)
    lsn = lg.update({"late": True})
    calls = []

    def written() -> None:
        calls.append(1)
        lg.sync()

    reader = RecordReader(open_destination(str(tmp_path / "log")), persistlog.Codec().loads, written)
    assert reader.record(lsn) == {"late": True}
    assert calls == [1]
    lg.close()


def test_damage_between_the_cursor_and_the_record_is_corruption(tmp_path: Path) -> None:
    lg, at = written_log(tmp_path, 20)
    reader = RecordReader(open_destination(str(tmp_path / "log")), persistlog.Codec().loads)
    lsns = sorted(at)
    assert reader.record(lsns[0]) == at[lsns[0]]
    segment = segment_files(tmp_path / "log")[-1]
    data = Path(segment).read_bytes()
    flip_bit(segment, data.index(b"x" * 10), 0)  # in record 10's payload
    with pytest.raises(persistlog.CorruptLogError):
        reader.record(lsns[-1])
    lg.close()


class _ListCounting:
    """A real local destination whose listings are counted (every other call passes)."""

    def __init__(self, url: str) -> None:
        self._dest = open_destination(url)
        self.lists = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._dest, name)

    def list(self, start_after: str | None = None) -> list[str]:
        self.lists += 1
        return self._dest.list(start_after)


def test_a_reader_seeded_at_a_log_s_start_reads_it_without_listing_and_still_finds_later_logs(tmp_path: Path) -> None:
    lg, at = written_log(tmp_path, 60, segment_bytes=4096, rotate_records=40, batch_bytes=256, retain=10)
    seq = lg.seq
    first = min(at)
    dest = _ListCounting(str(tmp_path / "log"))
    reader = RecordReader(dest, persistlog.Codec().loads)  # type: ignore[arg-type]
    reader.seed(1, 1)  # log 1, where the first record (LSN 1) is
    assert reader.record(first) == at[first]
    assert dest.lists == 0, "the seeded start needed no listing"
    for lsn in sorted(at):  # on through later segments and logs: located as usual
        assert reader.record(lsn) == at[lsn]
    assert seq > 1 and dest.lists >= 1
    lg.close()


class _ReadCounting(_ListCounting):
    """As :class:`_ListCounting`, with the reads counted too."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.reads = 0

    def read(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        self.reads += 1
        return self._dest.read(name, offset, length)


def test_a_seeded_reader_reads_the_first_records_of_a_log_in_one_read_stepping_over_its_header(tmp_path: Path) -> None:
    # Segment 0 starts with the segment header and the log header (a control batch): a
    # reader seeded there reads both and the records after them with one read, as a
    # queue's first delivery after its open does.
    lg, at = written_log(tmp_path, 5)
    first = min(at)
    dest = _ReadCounting(str(tmp_path / "log"))
    reader = RecordReader(dest, persistlog.Codec().loads)  # type: ignore[arg-type]
    reader.seed(lg.seq, first)
    assert reader.record(first) == at[first]
    assert (dest.reads, dest.lists) == (1, 0)
    for lsn in sorted(at)[1:]:  # on from the cursor: one read each
        assert reader.record(lsn) == at[lsn]
    assert (dest.reads, dest.lists) == (len(at), 0)
    lg.close()


def test_a_seed_that_does_not_match_the_segment_header_is_located_as_usual(tmp_path: Path) -> None:
    lg, at = written_log(tmp_path, 5)
    lsns = sorted(at)
    reader = RecordReader(open_destination(str(tmp_path / "log")), persistlog.Codec().loads)
    reader.seed(lg.seq, lsns[1])  # the log starts at lsns[0]: the header says otherwise
    assert reader.record(lsns[2]) == at[lsns[2]]
    assert reader.record(lsns[0]) == at[lsns[0]]
    lg.close()


@pytest.mark.parametrize("size", [0, 100, 5000, 1 << 20])
def test_a_size_given_for_the_record_sizes_the_read_and_never_changes_what_is_read(tmp_path: Path, size: int) -> None:
    # Records of 0-6,000 bytes, with small ones between: a size far too small costs more
    # reads, one far too big reads past the end; each read gives the same records.
    lg = persistlog.open(tmp_path / "log", lambda emit: None, durability="flush")
    at = {lg.update({"i": i, "pad": b"p" * (i * 397 % 6000)}): i for i in range(40)}
    dest = _ReadCounting(str(tmp_path / "log"))
    reader = RecordReader(dest, persistlog.Codec().loads)  # type: ignore[arg-type]
    reader.seed(lg.seq, min(at))
    for lsn in sorted(at)[::3]:  # skipping records between: several batches per read
        assert reader.record(lsn, size)["i"] == at[lsn]
    assert dest.lists == 0
    lg.close()


@pytest.mark.parametrize("cursor", ["reading on", "located"])
def test_records_that_do_not_decode_are_corruption_where_they_are(tmp_path: Path, cursor: str) -> None:
    # Checksums that hold over a payload that is not CBOR: damage, named where it is, not
    # a decoder's exception -- read on from the cursor or found by a scan.
    lg, at = written_log(tmp_path, 3, hash_chain=False)
    lsn = lg.next_lsn
    segment = segment_files(tmp_path / "log")[-1]
    offset = Path(segment).stat().st_size
    with open(segment, "ab") as fh:
        fh.write(update_batch_by_hand(b"\xff\xff", 1, lsn))
    reader = RecordReader(open_destination(str(tmp_path / "log")), persistlog.Codec().loads)
    if cursor == "reading on":
        assert reader.record(max(at)) == at[max(at)]
    with pytest.raises(persistlog.CorruptLogError) as e:
        reader.record(lsn)
    assert e.value.segment == Path(segment).name and e.value.offset == offset
    parts_of(lg).writer.fail(RuntimeError("the test wrote into the live segment"))  # no seal over it
    with pytest.raises(persistlog.LogFailedError):
        lg.close()


def _reads(url: str, lsns: list[int], checks_in_c: bool) -> list[object]:
    """Each record read in turn by one reader (its cursor moving on), as its value or as
    the error's type and message, with the batch checks in C or in Python alone."""
    from persistlog._format import decoder

    saved = decoder._checked_batches
    if not checks_in_c:
        decoder._checked_batches = None
    try:
        reader = RecordReader(open_destination(url), persistlog.Codec().loads)
        out: list[object] = []
        for lsn in lsns:
            try:
                out.append(reader.record(lsn))
            except (persistlog.CorruptLogError, RecordNotWritten) as e:
                out.append((type(e).__name__, str(e)))
        return out
    finally:
        decoder._checked_batches = saved


@pytest.mark.parametrize("share_values", [False, True], ids=["plain", "shared-values"])
@pytest.mark.parametrize("hash_chain", [True, False], ids=["chained", "unchained"])
def test_every_damaged_byte_reads_the_same_with_the_checks_in_c_as_in_python(
        tmp_path: Path, batch_checks: str, hash_chain: bool, share_values: bool) -> None:
    """A bit flipped in each byte of a small log's batches in turn: a reader reading every
    record forwards gives the same records, and the same errors word for word, whether the
    batches on its way are checked in C or by the Python checks alone."""
    if batch_checks != "c":
        pytest.skip("compares the two paths once")
    shared = [{"s": k, "pad": "s" * 300} for k in range(4)]  # a value the snapshot shares
    lg = persistlog.open(tmp_path / "log", lambda emit: [emit(r) for r in shared], durability="flush",
                         hash_chain=hash_chain, share_values=share_values)
    at = dict(enumerate(shared, start=1))  # the open's snapshot, LSNs 1-4
    for i in range(12):
        record = {"i": i, "pad": "x" * (i % 50)}
        at[lg.update(record)] = record
    lg.close()
    segment = Path(segment_files(tmp_path / "log")[-1])
    clean = segment.read_bytes()
    lsns = sorted(at)
    url = str(tmp_path / "log")
    assert _reads(url, lsns, True) == [at[lsn] for lsn in lsns]
    differ = []
    for offset in range(64, len(clean), 3):  # past the segment header
        damaged = bytearray(clean)
        damaged[offset] ^= 0x10
        segment.write_bytes(bytes(damaged))
        if _reads(url, lsns, True) != _reads(url, lsns, False):
            differ.append(offset)
    # Each batch dropped, and each repeated: every checksum holds, the LSNs do not follow.
    from persistlog._format import constants as F
    from persistlog._format.decoder import parse_batch_header

    starts, offset = [], F.SEGMENT_HEADER_SIZE
    while offset + F.BATCH_HEADER_SIZE <= len(clean):  # (the seal's trailer is not a batch)
        size = parse_batch_header(clean[offset:offset + F.BATCH_HEADER_SIZE], offset).size
        starts.append((offset, offset + size))
        offset += size
    for start, end in starts:
        for name, damaged in (("dropped", clean[:start] + clean[end:]),
                              ("repeated", clean[:end] + clean[start:end] + clean[end:])):
            segment.write_bytes(damaged)
            if _reads(url, lsns, True) != _reads(url, lsns, False):
                differ.append((name, start))
    segment.write_bytes(clean)
    assert not differ, differ

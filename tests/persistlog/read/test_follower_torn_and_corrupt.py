"""What a follower makes of damage: a torn tail of the live segment is waited on, then
applied; damage before the tail, a torn segment followed by another, a truncated object and
undecodable records are corruption."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import persistlog
from persistlog._write.log import parts_of
from batches import batch_spans, update_batch_by_hand
from kv_app import apply
from follower_harness import Writer
from destinations import open_destination

# Every case reads with the decoder's batch checks in C and with the Python checks alone.
pytestmark = pytest.mark.usefixtures("batch_checks")


BATCH_HEADER = 40


# -- torn tails and corruption ---------------------------------------------------------


def _reference_segments(tmp_path: Path, records: int, segment_bytes: int = 1 << 20) -> tuple[Path, list[bytes], dict[str, Any]]:
    """A live, unsealed log written one batch per update: its segment files' bytes."""
    ref = tmp_path / "ref"
    w = Writer(str(ref), durability="flush", segment_bytes=segment_bytes)
    for i in range(records):
        w.put(f"k{i % 7}", [i, "p" * 30])
    w.log.sync()
    names = sorted(n for n in os.listdir(ref) if n.endswith(".plog"))
    segments = [(ref / n).read_bytes() for n in names]
    state = dict(w.data)
    w.close()
    return ref, segments, state


def test_torn_tail_of_live_segment_is_waited_on_then_applied(tmp_path: Path) -> None:
    _, segments, _ = _reference_segments(tmp_path, 12)
    seg = segments[0]
    spans = batch_spans(seg)
    live = tmp_path / "live"
    live.mkdir()
    path = live / f"{1:020d}-{0:010d}.plog"
    k = len(spans) - 4
    path.write_bytes(seg[: spans[k][0]])
    state: dict[str, Any] = {}
    f = persistlog.follow(str(live), lambda r: apply(state, r))
    first = f.poll()
    assert first > 0
    start, end = spans[k]

    def append(b: bytes) -> None:
        with open(path, "ab") as fh:
            fh.write(b)

    # A batch arriving in pieces: a short header, a whole header with part of the payload.
    for cut in (start + 7, start + BATCH_HEADER, end - 1):
        append(seg[os.path.getsize(path): cut])
        assert f.poll() == 0, f"cut at {cut}"
        assert f.cursor.offset == start  # type: ignore[union-attr]
    append(seg[os.path.getsize(path): end])
    assert f.poll() == 1
    # A zero-filled tail (preallocated space) is waited on too.
    with open(path, "ab") as fh:
        fh.write(b"\0" * 64)
    assert f.poll() == 0
    assert f.error is None
    f.stop()


def test_damaged_batch_before_the_tail_is_corruption(tmp_path: Path) -> None:
    _, segments, _ = _reference_segments(tmp_path, 12)
    seg = segments[0]
    spans = batch_spans(seg)
    live = tmp_path / "live"
    live.mkdir()
    name = f"{1:020d}-{0:010d}.plog"
    path = live / name
    k = len(spans) - 4
    path.write_bytes(seg[: spans[k][0]])
    f = persistlog.follow(str(live), lambda r: None)
    f.poll()
    bad = bytearray(seg[spans[k][0]: spans[k + 1][1]])
    bad[BATCH_HEADER + 3] ^= 0x40  # payload of batch k; batch k+1 follows it intact
    with open(path, "ab") as fh:
        fh.write(bytes(bad))
    with pytest.raises(persistlog.CorruptLogError) as e:
        f.poll()
    assert e.value.segment == name and e.value.offset == spans[k][0]
    f.stop()
    # A fresh follower (and restore) meet the same damage during the initial sync.
    with pytest.raises(persistlog.CorruptLogError):
        persistlog.follow(str(live), lambda r: None).poll()
    with pytest.raises(persistlog.CorruptLogError):
        persistlog.restore(str(live), lambda r: None)


def test_torn_end_of_a_segment_followed_by_another_is_corruption(tmp_path: Path) -> None:
    """Segments become durable in order: a torn-looking end of segment 0 once segment 1
    exists is damage, reported where it is (as restore does), never silently dropped."""
    _, segments, _ = _reference_segments(tmp_path, 220, segment_bytes=4096)
    assert len(segments) >= 2
    seg0 = segments[0]
    spans = batch_spans(seg0)
    live = tmp_path / "live"
    live.mkdir()
    name0 = f"{1:020d}-{0:010d}.plog"
    (live / name0).write_bytes(seg0[: spans[-3][0]])
    f = persistlog.follow(str(live), lambda r: None)
    assert f.poll() > 0
    torn_at = spans[-1][0]
    with open(live / name0, "ab") as fh:
        fh.write(seg0[spans[-3][0]: torn_at + 30])  # the last batch of the segment, torn
    (live / f"{1:020d}-{1:010d}.plog").write_bytes(segments[1])
    with pytest.raises(persistlog.CorruptLogError) as e:
        f.poll()
    assert e.value.segment == name0 and e.value.offset == torn_at, e.value
    with pytest.raises(persistlog.CorruptLogError) as r:
        persistlog.restore(str(live), lambda r: None)
    assert r.value.segment == name0 and r.value.offset == torn_at, r.value


def test_truncated_object_is_corruption_not_a_write_in_progress(clean_memory_fs: None) -> None:
    """Object stores write whole objects: a short object is damage, not something to wait for."""
    url = "memory://torn/log"
    w = Writer(url, flush_interval=30)
    for i in range(5):
        w.put(f"k{i}", i)
    w.log.sync()
    f = persistlog.follow(url, lambda r: None)
    f.poll()
    for i in range(5):
        w.put(f"j{i}", i)
    w.log.sync()
    dest = open_destination(url)
    last = [n for n in dest.list() if n.endswith(".plog")][-1]
    data = dest.read(last)
    dest.delete(last)
    dest.create(last, data[:-9])
    with pytest.raises(persistlog.CorruptLogError):
        f.poll()
    with pytest.raises(persistlog.CorruptLogError):
        persistlog.follow(url, lambda r: None).poll()
    f.stop()
    w.close()


# -- undecodable records ------------------------------------------------------------------


def test_undecodable_records_are_corruption_for_followers(tmp_path: Path) -> None:
    """A batch whose checksums hold but whose payload is not CBOR is corruption (a
    CorruptLogError naming where), not a stray decoder exception; skip mode passes it."""
    url = str(tmp_path / "log")
    w = Writer(url)
    w.put("a", 1, sync=True)
    name = f"{w.log.seq:020d}-{0:010d}.plog"
    f = persistlog.follow(url, lambda r: None)
    f.poll()
    at = os.path.getsize(Path(url) / name)
    with open(Path(url) / name, "ab") as fh:
        fh.write(update_batch_by_hand(b"\xff\xff", 1, w.log.next_lsn))
        fh.write(update_batch_by_hand(b"\x01", 1, w.log.next_lsn + 1))
    with pytest.raises(persistlog.CorruptLogError) as e:
        f.poll()
    assert e.value.segment == name and e.value.offset == at
    with pytest.raises(persistlog.CorruptLogError):
        persistlog.follow(url, lambda r: None).poll()
    got: list[Any] = []
    skipping = persistlog.follow(url, got.append, recovery="skip")
    skipping.poll()
    assert got[-1] == 1  # the batch after the damaged one
    parts_of(w.log).writer.fail(RuntimeError("the test wrote into the live segment"))  # do not seal over it
    w.close()

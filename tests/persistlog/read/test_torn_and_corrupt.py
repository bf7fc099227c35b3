"""Torn tails are normal, corruption is loud (docs/DESIGN.md invariant 2, FORMAT "Torn tails and
corruption"), and CURRENT is only a hint.

The logs here are written by the real writer; damage is made by editing the real files.
"""

from __future__ import annotations

import os
import shutil
import zlib
from typing import Any

import pytest
from batches import batch_offsets
from kv_app import App, restore_state
from log_files import crash, flip_bit, log_seqs, segment_files

import persistlog
from persistlog._format import decoder, encoder
from persistlog._format import constants as F

# Every case reads with the decoder's batch checks in C and with the Python checks alone.
pytestmark = pytest.mark.usefixtures("batch_checks")

BIG = "v" * 150  # a last batch long enough to cut at many offsets


def write_log(url: str, *, updates: int = 4, close: bool = False, **options: Any) -> App:
    """A log with two enumerated resources and ``updates`` updates, one batch each."""
    app = App({"x": 1, "y": [1, 2]})
    app.open(url, durability="fsync", **options)
    for i in range(updates - 1):
        app.put(f"k{i}", i)
    app.put("last", BIG)
    if close:
        app.log.close()  # type: ignore[union-attr]
    else:
        crash(app.log)  # type: ignore[arg-type]
    return app


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


# -- torn tails -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("compression", [None, "gzip"])
def test_truncating_the_last_batch_anywhere_drops_only_that_batch(log_dir: str, compression: str | None) -> None:
    app = write_log(log_dir, compression=compression)
    full = dict(app.data)
    before = dict(full)
    del before["last"]
    seg = segment_files(log_dir)[-1]
    name = os.path.basename(seg)
    data = read(seg)
    start, size, kind = batch_offsets(seg)[-1]
    assert start + size == len(data) and kind == F.KIND_UPDATE
    seq = log_seqs(log_dir)[-1]

    for cut in range(start, len(data) + 1):
        write(seg, data[:cut])
        state, result = restore_state(log_dir)
        if cut == len(data):
            assert state == full and not result.torn_tails
            continue
        assert state == before, cut
        assert result.found and result.complete
        assert result.last_lsn == result.next_lsn - 1
        if cut == start:
            assert result.torn_tails == [], cut  # a clean end between batches
        else:
            assert result.torn_tails == [
                persistlog.TornTail(seq, name, start, cut - start, result.torn_tails[0].reason)
            ], cut
            assert result.torn_tail is result.torn_tails[-1]


def test_writer_continues_the_chain_after_a_torn_tail(log_dir: str) -> None:
    app = write_log(log_dir)
    seg = segment_files(log_dir)[-1]
    data = read(seg)
    start, _, _ = batch_offsets(seg)[-1]
    for cut in range(start + 1, len(data), 37):
        write(seg, data[:cut])
        state, torn = restore_state(log_dir)
        assert torn.torn_tails
        app2 = App(state)
        lg = app2.open(log_dir, durability="fsync")
        assert lg.next_lsn == torn.next_lsn + len(state)  # the enumeration took the next LSNs
        app2.put("after", cut)
        lg.close()
        again, result = restore_state(log_dir)
        assert again == app2.data
        assert not result.torn_tails  # the new log starts complete; the torn one is older
        # Every log is readable from the start too: the chain through the torn log holds.
        shutil.copytree(log_dir, log_dir + "-nocurrent")
        os.remove(os.path.join(log_dir + "-nocurrent", "CURRENT"))
        assert restore_state(log_dir + "-nocurrent")[0] == app2.data
        shutil.rmtree(log_dir + "-nocurrent")
        for p in segment_files(log_dir):
            if p != seg:
                os.remove(p)
        os.remove(os.path.join(log_dir, "CURRENT"))


@pytest.mark.parametrize(
    "shape",
    ["zeros after the last batch", "header partly written then zeros",
     "payload partly written then zeros", "payload cut and zeros past its end"],
)
def test_zero_filled_tail_is_torn(log_dir: str, shape: str) -> None:
    app = write_log(log_dir)
    before = dict(app.data)
    del before["last"]
    seg = segment_files(log_dir)[-1]
    data = read(seg)
    start, size, _ = batch_offsets(seg)[-1]
    if shape == "zeros after the last batch":
        damaged, expected = data + b"\0" * 4096, dict(app.data)
        torn_at = len(data)
    elif shape == "header partly written then zeros":
        damaged, expected = data[: start + 17] + b"\0" * (size - 17), before
        torn_at = start
    elif shape == "payload partly written then zeros":
        damaged, expected = data[: start + 60] + b"\0" * (size - 60), before
        torn_at = start
    else:
        damaged, expected = data[: start + 60] + b"\0" * 4096, before
        torn_at = start
    write(seg, damaged)
    state, result = restore_state(log_dir)
    assert state == expected
    [tail] = result.torn_tails
    assert (tail.offset, tail.length) == (torn_at, len(damaged) - torn_at)


@pytest.mark.slow
def test_torn_seal_trailer_is_a_torn_tail_not_corruption(log_dir: str) -> None:
    """A crash while sealing (close or rotation) before the seal's fsync may leave the seal
    batch whole and its trailer cut short or zero-filled: the log is intact."""
    app = write_log(log_dir, close=True)
    seg = segment_files(log_dir)[-1]
    data = read(seg)
    trailer = data[-F.TRAILER_SIZE:]
    body = data[: -F.TRAILER_SIZE]
    shapes = [trailer[:kept] for kept in range(F.TRAILER_SIZE)]  # cut short
    shapes += [b"\0" * n for n in range(1, F.TRAILER_SIZE + 1)]  # zero-filled
    for tail in shapes:
        write(seg, body + tail)
        state, result = restore_state(log_dir)
        assert state == app.data
        assert [(t.offset, t.length) for t in result.torn_tails] == (
            [(len(body), len(tail))] if tail else []
        )
        # A new writer finds where the log ended and continues the chain.
        app2 = App(state)
        lg = app2.open(log_dir)
        assert lg.next_lsn == result.next_lsn + len(state)
        lg.close()
        assert restore_state(log_dir)[0] == app.data
        for p in segment_files(log_dir):
            if p != seg:
                os.remove(p)
    # Part of the trailer and then zeros is a torn trailer only when the zeros start at a
    # filesystem block (what a crash leaves); elsewhere it is damage, such as a bit flip
    # that cleared the trailer's last byte.
    write(seg, body + trailer[:15] + b"\0")
    with pytest.raises(persistlog.CorruptLogError):
        restore_state(log_dir)


# -- corruption -----------------------------------------------------------------------


@pytest.mark.slow
def test_every_bit_flip_of_a_sealed_log_is_corruption(tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    app = App({"a": 1})
    lg = app.open(url, durability="fsync")
    app.put("b", [1, 2])
    lg.close()
    [seg] = segment_files(url)
    data = read(seg)
    assert len(data) < 800, len(data)  # keep this test fast
    current = os.path.join(url, "CURRENT")
    pointer = read(current)
    assert restore_state(url)[0] == app.data
    checked = 0
    for with_current in (True, False):
        if not with_current:
            os.remove(current)  # restore must search the log itself
        for offset in range(len(data)):
            for bit in range(8):
                damaged = bytearray(data)
                damaged[offset] ^= 1 << bit
                write(seg, bytes(damaged))
                try:
                    state, result = restore_state(url)
                except persistlog.CorruptLogError as e:
                    assert e.destination == url and e.log == 1, (offset, bit, e)
                    checked += 1
                    continue
                raise AssertionError(
                    f"flipping bit {bit} of byte {offset} restored {state!r} ({result!r})"
                )
    write(seg, data)
    write(current, pointer)
    assert checked == 2 * 8 * len(data)
    assert restore_state(url)[0] == app.data


def test_damaged_batch_followed_by_a_valid_one_is_corrupt(log_dir: str) -> None:
    write_log(log_dir)  # unsealed: its last batch could be torn, not the others
    seg = segment_files(log_dir)[-1]
    batches = batch_offsets(seg)
    data = read(seg)
    for offset, size, _ in batches[:-1]:
        for where in (offset + 3, offset + 36, offset + size - 1):  # header, its CRC, payload
            damaged = bytearray(data)
            damaged[where] ^= 0x10
            write(seg, bytes(damaged))
            with pytest.raises(persistlog.CorruptLogError) as info:
                restore_state(log_dir)
            assert info.value.offset == offset, (where, info.value)
    write(seg, data)
    # A last batch damaged in place (not torn) followed by a valid one.
    start, size, _ = batches[-1]
    write(seg, data[: start + 50] + b"\1" + data[start + 51:] + data[start:])
    with pytest.raises(persistlog.CorruptLogError):
        restore_state(log_dir)


def test_corruption_error_names_destination_log_segment_and_offset(log_dir: str) -> None:
    write_log(log_dir)
    seg = segment_files(log_dir)[-1]
    offset, size, _ = batch_offsets(seg)[-2]
    flip_bit(seg, offset + size - 1, 0)
    with pytest.raises(persistlog.CorruptLogError) as info:
        restore_state(log_dir)
    e = info.value
    assert (e.destination, e.log, e.segment, e.offset) == (log_dir, 1, os.path.basename(seg), offset)
    message = str(e)
    for part in (log_dir, "log 1", os.path.basename(seg), f"offset {offset}"):
        assert part in message
    assert isinstance(e, persistlog.PersistLogError)


def _multi_segment_log(url: str) -> App:
    app = App({f"r{i}": "x" * 100 for i in range(5)})
    app.open(url, durability="fsync", segment_bytes=4096)
    for i in range(120):
        app.put(f"k{i % 7}", "y" * 90)
    crash(app.log)  # type: ignore[arg-type]
    assert len(segment_files(url)) >= 3
    return app


@pytest.mark.parametrize("which", ["middle", "first"])
def test_missing_segment_is_corrupt(log_dir: str, which: str) -> None:
    app = _multi_segment_log(log_dir)
    assert restore_state(log_dir)[0] == app.data
    files = segment_files(log_dir)
    os.remove(files[1] if which == "middle" else files[0])
    with pytest.raises(persistlog.CorruptLogError) as info:
        restore_state(log_dir)
    assert info.value.log == 1 and "missing" in str(info.value)


def test_missing_middle_log_is_corrupt(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, durability="fsync", retain=5)
    app.fail_enumerate = RuntimeError("enumeration failed")
    for i in range(3):  # logs 2, 3, 4 stay incomplete: restore replays 1..4
        with pytest.raises(persistlog.EnumerateError):
            lg.rotate()
        app.put(f"k{i}", i)
    lg.close()
    assert log_seqs(log_dir) == [1, 2, 3, 4]
    assert restore_state(log_dir)[0] == app.data
    for p in segment_files(log_dir):
        if os.path.basename(p).startswith(F.segment_name(3, 0)[:20]):
            os.remove(p)
    with pytest.raises(persistlog.CorruptLogError) as info:
        restore_state(log_dir)
    assert info.value.log == 3 and info.value.destination == log_dir


def test_lsn_chain_break_between_logs_is_corrupt(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, durability="fsync", retain=5, segment_bytes=4096)
    app.fail_enumerate = RuntimeError("enumeration failed")
    with pytest.raises(persistlog.EnumerateError):
        lg.rotate()  # log 2: incomplete, replayed after log 1
    for i in range(60):
        app.put(f"k{i % 3}", "z" * 100)
    with pytest.raises(persistlog.EnumerateError):
        lg.rotate()  # log 3
    app.put("end", 1)
    lg.close()
    log2 = [p for p in segment_files(log_dir) if os.path.basename(p).startswith(F.segment_name(2, 0)[:20])]
    assert len(log2) >= 2
    os.remove(log2[-1])  # the tail of log 2 vanished: log 3 no longer follows it
    with pytest.raises(persistlog.CorruptLogError) as info:
        restore_state(log_dir)
    # The damage is log 2's missing end, located where log 2 now stops (as verify says).
    assert info.value.log == 2 and info.value.segment == os.path.basename(log2[-2])
    assert "are missing from its end" in str(info.value)


def test_recovery_skip_passes_over_damage_and_lists_it(log_dir: str) -> None:
    app = App({})
    lg = app.open(log_dir, durability="fsync")
    for key in "abcde":
        app.put(key, key * 3)
    lg.close()
    seg = segment_files(log_dir)[-1]
    batches = [b for b in batch_offsets(seg) if b[2] == F.KIND_UPDATE]
    offset, size, _ = batches[2]  # the batch that put "c"
    flip_bit(seg, offset + size - 2, 3)
    with pytest.raises(persistlog.CorruptLogError):
        restore_state(log_dir)
    state, result = restore_state(log_dir, recovery="skip")
    expected = dict(app.data)
    del expected["c"]
    assert state == expected
    [skipped] = result.skipped
    assert (skipped.log, skipped.segment, skipped.offset, skipped.length) == (
        1, os.path.basename(seg), offset, size,
    )
    assert "checksum" in skipped.reason
    # A damaged header: skip resynchronises on the next intact batch header.
    offset2, size2, _ = batches[3]  # "d"
    flip_bit(seg, offset2 + 5, 1)
    state, result = restore_state(log_dir, recovery="skip")
    del expected["d"]
    assert state == expected
    assert [(s.offset, s.length) for s in result.skipped] == [(offset, size), (offset2, size2)]
    with pytest.raises(ValueError):
        restore_state(log_dir, recovery="lenient")


# -- CURRENT --------------------------------------------------------------------------


def _three_complete_logs(url: str) -> App:
    app = App({"a": 1, "b": 2})
    lg = app.open(url, durability="fsync", retain=3)
    app.put("c", 3)
    lg.rotate()
    app.delete("a")
    lg.rotate()
    app.put("b", 20)
    lg.close()
    assert log_seqs(url) == [1, 2, 3]
    return app


@pytest.mark.parametrize(
    "damage",
    ["missing", "empty", "truncated", "bit flip", "garbage", "future version",
     "dangling (names no log)", "dangling (names a deleted log)", "stale (names an older log)"],
)
def test_damaged_current_falls_back_to_listing(log_dir: str, damage: str) -> None:
    app = _three_complete_logs(log_dir)
    expected, good = restore_state(log_dir)
    assert expected == app.data and good.logs == [3]
    current = os.path.join(log_dir, "CURRENT")
    pointer = read(current)
    assert pointer == encoder.pointer(3)
    if damage == "missing":
        os.remove(current)
    elif damage == "empty":
        write(current, b"")
    elif damage == "truncated":
        write(current, pointer[:-1])
    elif damage == "bit flip":
        flip_bit(current, 13, 0)
    elif damage == "garbage":
        write(current, os.urandom(24))
    elif damage == "future version":
        body = F.POINTER.pack(F.POINTER_MAGIC, F.FORMAT_VERSION + 1, 0, 3)
        write(current, body + F.U32.pack(zlib.crc32(body)))
    elif damage == "dangling (names no log)":
        write(current, encoder.pointer(99))
    elif damage == "dangling (names a deleted log)":
        write(current, encoder.pointer(1))
        for p in segment_files(log_dir)[:1]:
            os.remove(p)
    else:
        write(current, encoder.pointer(1))
    state, result = restore_state(log_dir)
    assert state == expected
    assert result.complete
    # A writer opened on it continues after log 3 whatever CURRENT said.
    app2 = App(state)
    lg = app2.open(log_dir)
    assert lg.seq == 4
    lg.close()
    assert read(current) == encoder.pointer(4)
    assert restore_state(log_dir)[0] == expected


def test_current_of_another_format_is_never_fatal_for_a_writer(log_dir: str) -> None:
    app = _three_complete_logs(log_dir)
    write(os.path.join(log_dir, "CURRENT"), b"\xff" * 5000)  # larger than a pointer may be
    state, _ = restore_state(log_dir)
    assert state == app.data


def test_records_that_do_not_decode_are_corruption_not_an_internal_error(log_dir: str) -> None:
    """A batch whose checksums hold but whose records cannot be decoded (here: text that is
    not UTF-8, framed again with good CRCs) raises CorruptLogError naming where, or is
    skipped and listed."""
    # Unchained (format 1): in a chained log the re-framed batch also breaks the next link.
    lg = persistlog.open(log_dir, lambda emit: None, durability="fsync", hash_chain=False)
    lg.update({"op": "put", "key": "ok", "value": 1})
    lg.update({"op": "put", "key": "bad", "value": "ZZZZ"})
    lg.update({"op": "put", "key": "after", "value": 2})
    lg.close()
    seg = segment_files(log_dir)[-1]
    offset = [o for o, _, k in batch_offsets(seg) if k == F.KIND_UPDATE][1]
    with open(seg, "r+b") as f:
        f.seek(offset)
        batch = f.read(F.BATCH_HEADER_SIZE)
        head = decoder.parse_batch_header(batch, offset)
        payload = f.read(head.stored_len).replace(b"dZZZZ", b"d\xff\xfe\xff\xfe")
        f.seek(offset)
        f.write(encoder.record_batch(payload, head.count, [], head.first_lsn, head.commit_us))
    with pytest.raises(persistlog.CorruptLogError) as info:
        restore_state(log_dir)
    assert (info.value.log, info.value.segment, info.value.offset) == (1, os.path.basename(seg), offset)
    state, result = restore_state(log_dir, recovery="skip")
    assert state == {"ok": 1, "after": 2}
    assert [(s.offset, s.log) for s in result.skipped] == [(offset, 1)]

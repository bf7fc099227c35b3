"""The reader's batch checks in C (``decoder.checked_run``, the C accelerator's
``checked_batches``) change nothing a reader can see: over real logs of every kind of
batch, damaged at random, a scan with them and a scan through the Python checks alone give
the same batches, the same ``LogState``, the same log messages and the same error, in
strict and skip recovery, with and without ``tail_ok``, from a log's start or from inside
it, through windows of any size.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from batches import batch_offsets
from hypothesis import given, note
from hypothesis import strategies as st
from hypothesis_profiles import active_profile
from log_files import crash, segment_files

import persistlog
from destinations import open_destination
from persistlog._format import chain, decoder
from persistlog._format import constants as F
from persistlog._read import reader
from persistlog._read.reader import READ_CHUNK, LogScanner, list_logs

_c = pytest.importorskip("persistlog._cbor_json")
if not hasattr(_c, "checked_batches"):
    pytest.skip("the C accelerator was built without the batch checks", allow_module_level=True)


# -- the two lanes ------------------------------------------------------------------------


@contextmanager
def python_checks() -> Iterator[None]:
    """Every batch read through the Python checks, as without the C accelerator."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(decoder, "_checked_batches", None)
        yield


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.levelno, record.getMessage()))


def outcome(read: Callable[[], Any]) -> tuple[Any, Any, list[tuple[int, str]]]:
    """What ``read()`` returned or raised (type and message), and what it logged."""
    handler = _Messages()
    log = logging.getLogger("persistlog")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        try:
            return read(), None, handler.seen
        except Exception as e:  # noqa: BLE001 -- what is compared is exactly what was raised
            return None, (type(e), str(e)), handler.seen
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def state_of(scanner: LogScanner) -> dict[str, Any]:
    """Every field of the scan's ``LogState`` (the chain head waited for), and its values."""
    st_ = scanner.state
    fields = {f.name: getattr(st_, f.name) for f in dataclasses.fields(st_) if f.name != "_head"}
    values = scanner.values
    return fields | {"chain_head": st_.chain_head, "values": (list(values.values), values.size, values.at)}


def scanned(scanner: LogScanner, batches: list[Any]) -> tuple[Any, ...] | None:
    """Iterate ``scanner`` into ``batches``; what it raised (type and message), if it did."""
    try:
        for b in scanner:
            batches.append((b.log, b.segment, b.offset, b.header, b.raw, b.controls, b.link, b.end))
    except Exception as e:  # noqa: BLE001 -- what is compared is exactly what was raised
        return type(e), str(e)
    return None


def scan_logs(url: str, **options: Any) -> Callable[[], Any]:
    """Each log at ``url`` scanned whole, one after the other, each linked to the one before:
    the batches, the state of each scan, and the error that ended them."""

    def read() -> Any:
        dest = open_destination(url)
        batches: list[Any] = []
        states: list[Any] = []
        link: bytes | None = None
        for seq, segments in sorted(list_logs(dest).items()):
            scanner = LogScanner(dest, seq, segments, expect_link=link, **options)
            error = scanned(scanner, batches)
            states.append(state_of(scanner))
            if error is not None:
                return batches, states, error
            link = scanner.state.chain_head
        return batches, states, None

    return read


def scan_from(url: str, seq: int, start: reader.ScanStart, **options: Any) -> Callable[[], Any]:
    """Log ``seq`` scanned from ``start``."""

    def read() -> Any:
        dest = open_destination(url)
        scanner = LogScanner(dest, seq, list_logs(dest).get(seq, [(start[0], F.segment_name(seq, start[0]))]),
                             start=start, **options)
        batches: list[Any] = []
        error = scanned(scanner, batches)
        return batches, state_of(scanner), error

    return read


def restored(url: str, recovery: str) -> Callable[[], Any]:
    def read() -> Any:
        records: list[Any] = []
        result = persistlog.restore(url, records.append, recovery=recovery)
        return records, result

    return read


def same_both_ways(read: Callable[[], Any]) -> Any:
    """``read`` with the checks in C and without: the same outcome, which is returned."""
    fast = outcome(read)
    with python_checks():
        slow = outcome(read)
    assert fast[1] == slow[1], "the error differs"
    assert fast[0] == slow[0], "what was read differs"
    assert fast[2] == slow[2], "the log messages differ"
    return fast


# -- real logs ----------------------------------------------------------------------------

#: What each kind of log is written with, and whether it is closed (sealed) or left by a crash.
KINDS: dict[str, tuple[dict[str, Any], bool]] = {
    "chained": ({}, True),  # format version 3, values shared
    "chained-crashed": ({"share_values": False}, False),  # version 2, one batch hashed off the thread
    "unchained": ({"hash_chain": False}, False),  # version 1
    "gzip": ({"compression": "gzip"}, True),
    "signed": ({"sign_interval": 1e-9}, True),  # checkpoints after batches
}


def write_log(url: str, options: dict[str, Any], close: bool) -> None:
    """Two logs (a rotation between), over segments of 4 KiB: one-record batches, a batch
    of many, snapshot batches (sharing values where the log shares them) and the controls
    around them, and (without shared values) a batch big enough to be hashed off the
    reading thread."""
    state: dict[Any, Any] = {}

    def enumerate_all(emit: Any) -> None:
        # Large values first: the writer looks for them in the first records it is given.
        for k, v in sorted(state.items(), key=lambda kv: (not str(kv[0]).startswith("shared"), str(kv[0]))):
            emit({"op": "put", "key": k, "value": v})

    if "sign_interval" in options:
        ed25519 = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ed25519")
        options = options | {"signing_key": ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(32)))}
    lg = persistlog.open(url, enumerate_all, durability="flush", segment_bytes=4096, retain=10, **options)

    def put(key: Any, value: Any) -> None:
        state[key] = value
        lg.update({"op": "put", "key": key, "value": value})

    for i in range(36):
        put(i, i)
        if i == 6:
            many = {f"m{j}": "v" * j for j in range(60)}
            state.update(many)
            lg.update_many([{"op": "put", "key": k, "value": v} for k, v in many.items()])
        if i in (9, 10):
            put(f"shared {i}", "s" * 300)  # the snapshot repeats it: it defines it, then refers to it
        if i == 20:
            lg.rotate()
    if options.get("share_values") is False:
        put("big", "b" * (chain.OFFLOAD_BYTES + 1000))
        put("after big", 1)
    if close:
        lg.close()
    else:
        crash(lg)


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("checks-in-c")
    made = {}
    for kind, (options, close) in KINDS.items():
        made[kind] = str(root / kind)
        write_log(made[kind], options, close)
    return made


# -- damage -------------------------------------------------------------------------------


def refit(data: bytearray, pos: int, *, payload: bool = True) -> None:
    """Fix the checksums of the batch at ``pos`` (its payload's, then its header's)."""
    head = list(F.BATCH_HEADER.unpack_from(data, pos))
    end = pos + F.BATCH_HEADER_SIZE + head[0]
    if payload and end <= len(data):
        head[7] = zlib.crc32(data[pos + F.BATCH_HEADER_SIZE:end])
    body = F.BATCH_HEADER.pack(*head)
    data[pos:pos + F.BATCH_HEADER.size] = body
    data[pos + F.BATCH_HEADER.size:pos + F.BATCH_HEADER_SIZE] = F.U32.pack(zlib.crc32(body))


#: Values a header field is set to (its checksums fixed): the edges of each check.
_FIELD_VALUES = st.sampled_from([0, 1, 2, 31, 32, 33, 2**31, 2**32 - 1, F.MAX_BATCH_BYTES, F.MAX_BATCH_BYTES + 1])
_FLAG_BITS = st.sampled_from([F.FLAG_LINKED, F.FLAG_SHARED, F.FLAG_ENCRYPTED, F.COMPRESSION_GZIP,
                              F.COMPRESSION_MASK, F.KIND_MASK, 0x80, 0x8000])


def damage(data: st.DataObject, path: str) -> str:
    """One damage drawn for the segment at ``path``, done; what it was (for the report)."""
    with open(path, "rb") as f:
        seg = bytearray(f.read())
    spans = batch_offsets(path)
    what = data.draw(st.sampled_from(
        ["flip", "flip", "flip", "truncate", "zeros", "rewrite", "field", "field", "repeat", "drop"] if spans
        else ["flip", "truncate", "zeros"]
    ))
    if spans:
        pos, size, _kind = data.draw(st.sampled_from(spans))
    else:
        pos, size = 0, len(seg)
    if what == "flip":
        # In a batch's header, link or payload, or anywhere.
        lo, hi = data.draw(st.sampled_from([(0, F.BATCH_HEADER_SIZE), (F.BATCH_HEADER_SIZE, F.BATCH_HEADER_SIZE + F.LINK_SIZE),
                                            (F.BATCH_HEADER_SIZE + F.LINK_SIZE, size), (-pos, len(seg) - pos)]))
        at = pos + data.draw(st.integers(lo, max(lo, hi - 1)))
        if 0 <= at < len(seg):
            seg[at] ^= 1 << data.draw(st.integers(0, 7))
    elif what == "truncate":
        del seg[data.draw(st.integers(0, len(seg))):]
    elif what == "zeros":
        at = data.draw(st.integers(0, len(seg)))
        extra = data.draw(st.sampled_from([0, 0, 100, 4096]))
        seg[at:] = bytes(len(seg) - at + extra)
    elif what == "rewrite":  # a changed payload, its checksums fixed: only the chain tells
        at = data.draw(st.integers(pos + F.BATCH_HEADER_SIZE, pos + size - 1)) if size > F.BATCH_HEADER_SIZE else pos
        seg[at] ^= 1 << data.draw(st.integers(0, 7))
        refit(seg, pos)
    elif what == "field":  # a header field changed, its header checksum fixed (and its payload's)
        head = list(F.BATCH_HEADER.unpack_from(seg, pos))
        field = data.draw(st.sampled_from([0, 1, 2, 3, 3, 5, 6]))  # lengths, count, flags, first LSN, time
        if field == 3:
            head[3] = (head[3] ^ data.draw(_FLAG_BITS)) & 0xFFFF
        elif field == 5:
            head[5] = max(0, head[5] + data.draw(st.sampled_from([-1, 1, 2**63])))
        elif field == 6:
            head[6] += 1
        else:
            near = st.sampled_from([head[field] - 1, head[field] + 1]).filter(lambda v: 0 <= v < 2**32)
            head[field] = data.draw(_FIELD_VALUES | near)
        seg[pos:pos + F.BATCH_HEADER.size] = F.BATCH_HEADER.pack(*head)
        refit(seg, pos, payload=data.draw(st.booleans()))
    elif what == "repeat":  # a batch written twice
        seg[pos + size:pos + size] = seg[pos:pos + size]
    else:  # a batch removed
        del seg[pos:pos + size]
    with open(path, "wb") as f:
        f.write(seg)
    return f"{what} at {pos} of {os.path.basename(path)}"


# -- the property -------------------------------------------------------------------------


@pytest.mark.slow
@active_profile(max_examples=60)
@given(data=st.data())
def test_damaged_logs_read_the_same_with_and_without_the_checks_in_c(logs: dict[str, str], data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(sorted(logs)))
    with tempfile.TemporaryDirectory() as tmp:
        url = os.path.join(tmp, "log")
        shutil.copytree(logs[kind], url)
        files = segment_files(url)
        for _ in range(data.draw(st.integers(1, 2))):
            note(damage(data, data.draw(st.sampled_from(files))))
        chunk = data.draw(st.sampled_from([64, 300, 4096, READ_CHUNK]), label="read chunk")
        for recovery in ("strict", "skip"):
            for tail_ok in (False, True):
                same_both_ways(scan_logs(url, recovery=recovery, tail_ok=tail_ok, read_chunk=chunk))
            same_both_ways(restored(url, recovery))
        # From inside a log (where its batches say whether it is chained), and up to a point.
        path = data.draw(st.sampled_from(files))
        seq, number = F.parse_segment_name(os.path.basename(path))  # type: ignore[misc]
        spans = batch_offsets(path) if os.path.exists(path) else []
        pos = data.draw(st.sampled_from([s[0] for s in spans])) if spans else F.SEGMENT_HEADER_SIZE
        recovery = data.draw(st.sampled_from(["strict", "skip"]))
        same_both_ways(scan_from(url, seq, (number, pos, None), recovery=recovery, read_chunk=chunk))
        same_both_ways(scan_logs(url, recovery=recovery, stop_at=(number, pos), read_chunk=chunk))


# -- cases named ---------------------------------------------------------------------------


def test_plain_batches_are_checked_in_c(logs: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without this the property above would hold of checks in C that take nothing: every
    plain batch of an undamaged chained log is checked in C, the others in Python."""
    in_c: list[int] = []
    in_python: list[int] = []
    real_c, real_python = decoder._checked_batches, reader.parse_batch_header

    def counted_c(*args: Any) -> Any:
        run = real_c(*args)
        in_c.append(len(run))
        return run

    def counted_python(buf: Any, offset: int) -> Any:
        in_python.append(offset)
        return real_python(buf, offset)

    monkeypatch.setattr(decoder, "_checked_batches", counted_c)
    monkeypatch.setattr(reader, "parse_batch_header", counted_python)
    (batches, _states, error), _, _ = outcome(scan_logs(logs["chained"]))
    assert error is None
    shared = [b for b in batches if b[3].flags & F.FLAG_SHARED]
    assert shared and sum(in_c) == len(batches) - len(shared) and len(in_python) == len(shared)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("chunk", [64, READ_CHUNK])
def test_undamaged_logs_read_the_same(logs: dict[str, str], kind: str, chunk: int) -> None:
    (batches, states, error), _, _ = same_both_ways(scan_logs(logs[kind], read_chunk=chunk))
    assert error is None and batches and states[-1]["sealed"] == KINDS[kind][1]
    same_both_ways(restored(logs[kind], "strict"))


@pytest.mark.parametrize("recovery", ["strict", "skip"])
def test_a_changed_batch_with_its_checksums_fixed_breaks_the_chain_in_both_lanes(
    logs: dict[str, str], tmp_path: Any, recovery: str
) -> None:
    url = str(tmp_path / "log")
    shutil.copytree(logs["chained"], url)
    path = segment_files(url)[0]
    pos, _size, _kind = batch_offsets(path)[3]
    with open(path, "r+b") as f:
        seg = bytearray(f.read())
        seg[pos + F.BATCH_HEADER_SIZE + F.LINK_SIZE] ^= 1
        refit(seg, pos)
        f.seek(0)
        f.write(seg)
    (_batches, _states, error), _, messages = same_both_ways(scan_logs(url, recovery=recovery))
    if recovery == "strict":
        assert error is not None and "hash chain broken" in error[1]
    else:
        assert error is None and any("hash chain broken" in m for _level, m in messages)


def test_a_torn_tail_is_dropped_alike(logs: dict[str, str], tmp_path: Any) -> None:
    url = str(tmp_path / "log")
    shutil.copytree(logs["chained-crashed"], url)
    path = segment_files(url)[-1]
    pos, size, _kind = batch_offsets(path)[-1]
    with open(path, "r+b") as f:
        f.truncate(pos + size - 3)
    (_batches, states, error), _, _ = same_both_ways(scan_logs(url))
    assert error is None and states[-1]["torn"] is not None


RESTORE_WITHOUT_ACCELERATOR = """
    import json, sys
    import persistlog
    from persistlog._format import decoder

    def restored(url):
        records = []
        try:
            result = persistlog.restore(url, records.append, recovery="skip")
        except Exception as e:
            return [type(e).__name__, str(e)]
        return [repr(records), result.records, result.next_lsn, repr(result.skipped), repr(result.torn_tails)]

    print(json.dumps({"built": decoder._checked_batches is not None, "restored": [restored(u) for u in sys.argv[1:]]}))
"""


def test_without_the_accelerator_damaged_logs_restore_the_same(logs: dict[str, str], tmp_path: Any) -> None:
    """Where the C accelerator is not built at all (not only its batch checks switched off)."""
    from childproc import run_json

    urls = []
    for kind in ("chained", "unchained"):
        url = str(tmp_path / kind)
        shutil.copytree(logs[kind], url)
        path = segment_files(url)[-1]  # in the log a restore starts at
        pos, _size, _kind = batch_offsets(path)[2]
        with open(path, "r+b") as f:
            f.seek(pos + F.BATCH_HEADER_SIZE + 3)
            byte = f.read(1)[0]
            f.seek(pos + F.BATCH_HEADER_SIZE + 3)
            f.write(bytes([byte ^ 4]))
        urls += [logs[kind], url]
    child = run_json(RESTORE_WITHOUT_ACCELERATOR, *urls, hide=["persistlog._cbor_json"])
    here = []
    for url in urls:
        records: list[Any] = []
        result = persistlog.restore(url, records.append, recovery="skip")
        here.append([repr(records), result.records, result.next_lsn, repr(result.skipped), repr(result.torn_tails)])
    assert child["built"] is False and child["restored"] == here
    assert here[1][3] != "[]" and here[3][3] != "[]"  # the damage was found, and skipped alike

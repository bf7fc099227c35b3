"""Shared values (format version 3, docs/FORMAT.md "Shared values"): a large value that
snapshot records repeat is stored once per log, and every reader gets the records back as
they were logged -- restore, a read from a position, followers and consumers started inside
a log, the record reader of a Queue, the CLI's dump, Spark -- including after a SIGKILL in
the middle of a snapshot that shares values.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import cbor2
import crypt_keys
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import persistlog
from destinations import open_destination
from persistlog._format import decoder
from persistlog._format import constants as F
from persistlog._format.decoder import Damage
from persistlog._format.jsonify import from_json
from persistlog._format.shared_values import SharedValues, ValueTable
from persistlog._read.reader import LogScanner, list_logs
from persistlog.cli import main

BIG = [b"\x07" * 300 + bytes(range(40)), ("payload %d " % 7) * 40, "é" * 130, b"\x00" * 125]


def records(n: int) -> list[dict[str, Any]]:
    """Snapshot records whose queues repeat a few large values (and small ones)."""
    return [{"k": i, "queue": [BIG[i % 3], {"m": BIG[(i + 1) % 4]}, "small", i]} for i in range(n)]


def snapshot_log(url: str, recs: list[dict[str, Any]], **options: Any) -> persistlog.Log:
    """A log whose second log holds ``recs`` as its snapshot, then two updates."""
    lg = persistlog.open(url, lambda emit: [emit(r) for r in recs], durability="fsync", **options)
    lg.rotate(wait=True)
    lg.update({"k": "u1", "queue": [BIG[0]]})
    lg.update({"k": "u2"})
    return lg


def batches(url: str, seq: int | None = None, **options: Any) -> list[Any]:
    dest = open_destination(url)
    logs = list_logs(dest)
    seq = max(logs) if seq is None else seq
    return list(LogScanner(dest, seq, logs[seq], **options))


def restored(url: str, **options: Any) -> list[Any]:
    got: list[Any] = []
    persistlog.restore(url, got.append, **options)
    return got


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        status = main(list(argv))
    return status, out.getvalue()


# -- writing: stored once per log --------------------------------------------------------


def test_a_value_repeated_by_snapshot_records_is_stored_once_per_log(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    recs = records(60)
    snapshot_log(url, recs).close()
    got = batches(url, 2)
    shared = [b for b in got if b.header.flags & F.FLAG_SHARED]
    assert shared and all(b.header.kind == F.KIND_SNAPSHOT for b in shared)
    stored = sum(b.header.stored_len for b in shared)
    assert stored * 4 < sum(len(b.raw) for b in shared)  # 60 records, each holding two large values
    data = b"".join(open(os.path.join(url, n), "rb").read() for n in sorted(os.listdir(url)) if n.startswith("0" * 19 + "2"))
    # Once for the 60 snapshot records' 40 copies, once for the update after them (only
    # snapshot records share values).
    assert data.count(BIG[0][:300]) == 2
    assert restored(url) == recs + [{"k": "u1", "queue": [BIG[0]]}, {"k": "u2"}]


def test_share_values_false_writes_version_2(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    snapshot_log(url, records(10), share_values=False).close()
    assert not any(b.header.flags & F.FLAG_SHARED for b in batches(url, 2))
    with open(os.path.join(url, F.segment_name(2, 0)), "rb") as f:
        assert decoder.parse_segment_header(f.read(40)).version == F.CHAINED_VERSION
    with pytest.raises(TypeError, match="share_values"):
        persistlog.open(str(tmp_path / "other"), lambda emit: None, share_values=1)


def test_each_log_defines_its_values_again(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    lg = snapshot_log(url, records(10), retain=5)
    lg.rotate(wait=True)
    lg.close()
    for seq in (2, 3):
        defined = [b for b in batches(url, seq) if b.header.flags & F.FLAG_SHARED]
        assert defined
    scanner = LogScanner(open_destination(url), 3, list_logs(open_destination(url))[3])
    for _ in scanner:
        pass
    # BIG[0..2] (BIG[3] is one byte short of 128 as CBOR): each log starts with none.
    assert len(scanner.values.values) == 3


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.lists(st.integers(0, 5), max_size=6), min_size=1, max_size=40),
    updates=st.lists(st.integers(0, 5), max_size=5),
    compression=st.sampled_from([None, "gzip", "zstd"]),
    encrypted=st.booleans(),
    batch_bytes=st.sampled_from([512, 4096, 1 << 20]),
)
def test_records_with_repeated_large_values_read_back_as_the_model(
    tmp_path_factory: pytest.TempPathFactory, picks: list[list[int]], updates: list[int], compression: str | None,
    encrypted: bool, batch_bytes: int,
) -> None:
    """Property: whatever the records, batches, compression and encryption, a restore and
    a read of every record from every position give the records logged (the model)."""
    pool: list[Any] = [*BIG, "x" * 200 + "y", "short"]
    recs = [{"i": i, "v": [pool[p] for p in ps], "n": {"d": pool[ps[0]] if ps else None}} for i, ps in enumerate(picks)]
    url = str(tmp_path_factory.mktemp("prop") / "log")
    keys = {"key_provider": crypt_keys.provider, "key_id": "2026-10"} if encrypted else {}
    lg = persistlog.open(url, lambda emit: [emit(r) for r in recs], compression=compression,
                         batch_bytes=batch_bytes, segment_bytes=8192, **keys)
    lg.rotate(wait=True)
    ups = [{"u": u, "v": pool[u]} for u in updates]
    for u in ups:
        lg.update(u)
    lg.close()
    model = recs + ups
    read_keys = {"key_provider": crypt_keys.provider} if encrypted else {}
    assert restored(url, **read_keys) == model
    everything = list(persistlog.read(url, **read_keys))
    snap_start = everything[0].lsn + len(recs) + 0  # log 1 held the first enumeration
    assert [r.record for r in everything][-len(model):] == model
    for at in range(snap_start, snap_start + len(model), max(1, len(model) // 6)):
        got = [r.record for r in persistlog.read(url, at, **read_keys)]
        assert got == model[at - snap_start:]


# -- the decoder: every length checked, a missing definition is damage ---------------------


def stream(payload: bytes, hints: list[Any], values: SharedValues | None = None, lsn: int = 1) -> bytes:
    """The stream of a batch of the records ``hints`` (``payload``) at ``lsn``."""
    sv = values or SharedValues()
    sv.hint(lsn, hints)
    out = sv.share(payload, lsn, lsn + len(hints))
    assert out is not None
    return out


def test_a_reference_before_its_definition_or_a_skipped_definition_is_damage() -> None:
    rec = {"p": BIG[0]}
    sv = SharedValues()
    first = stream(cbor2.dumps(rec), [rec], sv)
    second = stream(cbor2.dumps(rec) * 2, [rec, rec], sv, lsn=2)
    table = ValueTable((1, 0, 0))
    with pytest.raises(Damage, match="reference to shared value 0, of 0 defined"):
        decoder.expand_shared(second, table, 0)
    assert table.values == []  # nothing of a damaged stream is kept
    assert decoder.expand_shared(first, table, 0) == cbor2.dumps(rec)
    assert decoder.expand_shared(second, table, 0) == cbor2.dumps(rec) * 2
    other = SharedValues()
    other.hint(1, [{"q": BIG[1]}])
    third = other.share(cbor2.dumps({"q": BIG[1]}), 1, 2)
    assert third is not None
    with pytest.raises(Damage, match="defines shared value 0 where the log holds 1"):
        decoder.expand_shared(third, table, 0)


@pytest.mark.parametrize(
    ("cut", "reason"),
    [
        (lambda s: s[:6], "shorter than its lengths"),
        (lambda s: s[:4] + F.U32.pack(len(s)) + s[8:], "tokens and literals run past the stream"),
        (lambda s: s[:8] + F.U32.pack(0) + s[12:], "literal of 47 bytes runs past the literals"),
        (lambda s: F.U32.pack(F.MAX_BATCH_BYTES + 1) + s[4:], "past the 67108864-byte limit"),
        (lambda s: F.U32.pack(len(s)) + s[4:], "declared"),
        (lambda s: s + b"x", "placing"),
        (lambda s: s[:12] + bytes([s[12] | 3]) + s[13:], "unknown shared-values token kind 3"),
        (lambda s: s[:-1], "runs past the stream"),
    ],
)
def test_a_malformed_stream_is_damage_naming_what(cut: Any, reason: str) -> None:
    rec = {"a": "x" * 40, "p": BIG[0], "b": 1}
    good = stream(cbor2.dumps(rec), [rec])
    with pytest.raises(Damage, match=reason):
        decoder.expand_shared(cut(good), ValueTable((1, 0, 0)), 0)


def test_a_log_defines_at_most_shared_max_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(F, "SHARED_MAX_BYTES", 700)
    recs = [{"p": BIG[0]}, {"p": BIG[1]}, {"p": BIG[1]}]
    payload = b"".join(map(cbor2.dumps, recs))
    out = stream(payload, recs)
    table = ValueTable((1, 0, 0))
    assert decoder.expand_shared(out, table, 0) == payload
    assert len(table.values) == 1 and table.size <= 700  # BIG[1] written as it is, twice
    monkeypatch.setattr(F, "SHARED_MAX_BYTES", 10_000)  # a writer that knew no limit
    forged = SharedValues()
    stream(cbor2.dumps(recs[0]), recs[:1], forged)
    over = stream(b"".join(map(cbor2.dumps, recs[1:])), recs[1:], forged, lsn=2)
    monkeypatch.setattr(F, "SHARED_MAX_BYTES", 700)
    with pytest.raises(Damage, match="pass the 700-byte limit"):
        decoder.expand_shared(over, table, 0)


def test_a_batch_framed_again_after_an_interruption_defines_its_values_again() -> None:
    """An interrupted framing is done again from the start: what the first attempt
    defined is taken back, so the batch that reaches storage defines every value it uses."""
    recs = records(4)
    payload = b"".join(map(cbor2.dumps, recs))
    sv = SharedValues()
    sv.hint(10, recs)
    once = sv.share(payload, 10, 14)
    again = sv.share(payload, 10, 14)  # the same batch (first LSN 10) framed again
    assert once == again and once is not None
    table = ValueTable((1, 0, 0))
    assert decoder.expand_shared(again, table, 0) == payload
    assert len(table.values) == sv.defined


# -- every reader path -------------------------------------------------------------------


@pytest.fixture
def multi_segment(tmp_path: Path) -> tuple[str, list[Any]]:
    """A log whose shared snapshot spans several segments and batches."""
    url = str(tmp_path / "log")
    recs = records(120)
    lg = snapshot_log(url, recs, segment_bytes=4096, batch_bytes=2048)
    lg.close()
    assert len(list_logs(open_destination(url))[2]) >= 3
    return url, recs + [{"k": "u1", "queue": [BIG[0]]}, {"k": "u2"}]


def test_a_read_from_a_position_inside_the_snapshot_resolves_references(multi_segment: tuple[str, list[Any]]) -> None:
    url, model = multi_segment
    first = list(persistlog.read(url))[-len(model)].lsn
    for skip in (1, 57, 119, 121):
        got = [r.record for r in persistlog.read(url, first + skip)]
        assert got == model[skip:]
    # From a cursor a record handed out, in a later segment than the log's first.
    cursor = [r for r in persistlog.read(url, first)][80].cursor
    assert cursor.segment >= 1
    assert [r.record for r in persistlog.read(url, cursor)] == model[81:]


def test_a_scan_that_starts_inside_the_log_reads_its_start_once(multi_segment: tuple[str, list[Any]]) -> None:
    url, _ = multi_segment
    dest = open_destination(url)
    segments = list_logs(dest)[2]
    whole = LogScanner(dest, 2, segments)
    ends = [(b.segment, b.end) for b in whole]
    seg, end = ends[len(ends) // 2]
    reads: list[str] = []
    original = dest.read

    def counting(name: str, offset: int, length: int) -> bytes:
        reads.append(name)
        return original(name, offset, length)

    dest.read = counting  # type: ignore[method-assign]
    mid = LogScanner(dest, 2, segments, start=(seg, end, None))
    rest = list(mid)
    assert rest and any(b.header.flags & F.FLAG_SHARED for b in rest)
    assert F.segment_name(2, 0) in reads  # primed from the log's start
    handed = LogScanner(dest, 2, segments, start=(seg, end, None), values=mid.values)
    assert handed.values is not mid.values  # mid.values reached the end, not this start
    again = LogScanner(dest, 2, segments, start=(seg, end, None), values=ValueTable())
    assert [b.raw for b in again] == [b.raw for b in rest]


def test_followers_and_consumers_started_inside_the_snapshot(multi_segment: tuple[str, list[Any]]) -> None:
    url, model = multi_segment
    all_records = list(persistlog.read(url))
    start = all_records[-len(model) + 70].cursor  # after record 70 of the snapshot
    got: list[Any] = []
    f = persistlog.follow(url, got.append, cursor=start, poll_interval=0.01).start()
    assert f.wait_caught_up(20)
    f.stop()
    assert got == model[71:]
    seen: list[Any] = []
    with persistlog.consumers(url, poll_interval=0.01) as g:
        g.add("mid", replay=seen.append, position=start)
        assert g.wait_caught_up(20)
    assert seen == model[71:]


def test_the_cli_dump_shows_the_values(multi_segment: tuple[str, list[Any]]) -> None:
    url, model = multi_segment
    status, out = cli("dump", "--json", url)
    assert status == 0
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    records = [from_json(json.dumps(r["record"])) for r in rows if r.get("log") == 2]
    assert records == model


def test_a_queue_reads_shared_bodies_back_by_lsn(tmp_path: Path) -> None:
    body = b"the same message for everyone " * 20
    with persistlog.Queue.open(tmp_path / "q", share_values=True) as q:
        for _ in range(30):
            q.send(body)
        q.rotate()  # its enumeration copies every pending message: shared in the new log
        for _ in range(30):
            m = q.receive()
            assert m is not None and m.body == body
            assert q.ack(m.id)
    assert any(b.header.flags & F.FLAG_SHARED for b in batches(str(tmp_path / "q")))


def test_a_queue_shares_no_values_unless_asked(tmp_path: Path) -> None:
    """A queue's snapshot holds each pending body once: nothing to share, so its log is
    version 2 and its writer keeps no bookkeeping per message."""
    with persistlog.Queue.open(tmp_path / "q") as q:
        for i in range(20):
            q.send(b"%d" % i * 300)
        q.rotate()
    assert {b.header.flags & F.FLAG_SHARED for b in batches(str(tmp_path / "q"))} == {0}
    assert persistlog.restore(tmp_path / "q", lambda r: None).logs  # it reads back
    status = main(["info", "--json", str(tmp_path / "q")])
    assert status == 0


def test_the_writer_keeps_no_copy_of_the_values_its_log_defined(tmp_path: Path) -> None:
    """A writer remembers each value its log defined by its SHA-256, not its bytes, and
    drops the hints of a batch once it is handed over: after a snapshot of 8 MB of large
    values (each twice, so that all are shared), the Log holds well under 1 MB more."""
    import gc
    import tracemalloc

    values = [os.urandom(4000) for _ in range(2000)]
    lg = persistlog.open(str(tmp_path / "log"), lambda emit: emit.many([{"v": v, "w": v} for v in values]))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        lg.rotate(wait=True)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    lg.close()
    assert any(b.header.flags & F.FLAG_SHARED for b in batches(str(tmp_path / "log")))
    assert kept < 1_000_000, f"{kept / 1e6:.1f} MB kept after a snapshot of {len(values) * 4000 / 1e6:.0f} MB of values"


# -- a crash in the middle of a snapshot that shares values --------------------------------

CHILD = textwrap.dedent(
    """
    import sys, time
    import persistlog
    url = sys.argv[1]
    big = [bytes([i]) * 1500 for i in range(8)]
    store = persistlog.ResourceStore.open(url, durability="fsync", segment_bytes=65536, batch_bytes=16384)
    print("open", len(store), flush=True)
    i = max((v["i"] for v in store.values()), default=-1) + 1
    while True:
        store[f"k{i % 400}"] = {"i": i, "q": [big[i % 8], big[(i + 3) % 8]]}
        print("ack", i, flush=True)
        i += 1
        if i % 97 == 0:
            store.log.rotate(wait=True)
    """
)


@pytest.mark.slow
def test_sigkill_during_a_snapshot_that_shares_values_loses_no_acknowledged_update(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    acked: dict[str, int] = {}
    for round_ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", CHILD, url], stdout=subprocess.PIPE, text=True,
                                env={**os.environ})
        assert proc.stdout is not None
        first = proc.stdout.readline().split()
        assert first[0] == "open" and int(first[1]) >= len(acked)
        deadline = time.monotonic() + 0.4 + 0.15 * round_
        while time.monotonic() < deadline:
            line = proc.stdout.readline().split()
            if line and line[0] == "ack":
                i = int(line[1])
                acked[f"k{i % 400}"] = i
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for line in proc.stdout:  # acknowledged before the kill, read after it
            parts = line.split()
            if parts and parts[0] == "ack":
                acked[f"k{int(parts[1]) % 400}"] = int(parts[1])
        store = persistlog.ResourceStore.open(url)
        try:
            state = {k: v["i"] for k, v in store.items()}
            for k, i in acked.items():
                assert state[k] >= i, (round_, k)
            assert all(v["q"][0] == bytes([v["i"] % 8]) * 1500 for v in store.values())
        finally:
            store.close()
    dest = open_destination(url)
    assert any(b.header.flags & F.FLAG_SHARED for seq in list_logs(dest) for b in batches(url, seq))


def test_the_record_reader_reads_many_records_of_one_shared_batch_without_reading_the_log_again(
        tmp_path: Path) -> None:
    """A queue's bodies read one after another from one batch that shares values: the
    values are read from the log's start once, not once per body."""
    body = b"the same message for everyone " * 20
    url = tmp_path / "q"
    with persistlog.Queue.open(url, segment_bytes=4096) as q:
        for _ in range(200):
            q.send(body)
        q.rotate()
        dest = q._reader.dest  # type: ignore[union-attr]
        reads: list[tuple[str, int]] = []
        original = dest.read

        def counting(name: str, offset: int, length: int) -> bytes:
            reads.append((name, offset))
            return original(name, offset, length)

        dest.read = counting
        got = []
        for _ in range(200):
            m = q.receive()
            assert m is not None
            got.append(m.body)
            assert q.ack(m.id)
    assert got == [body] * 200
    # A read from a segment's start (its header) is a scan's: the log's start read to know
    # its values, or a new segment entered.
    starts = [r for r in reads if r[1] == 0]
    assert len(starts) <= 2 + len({n for n, _ in reads}), starts

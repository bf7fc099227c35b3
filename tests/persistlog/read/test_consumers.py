"""Named consumers of one log (``persistlog.consumers``): one poller reading once for every
consumer, positions committed beside the log and resumed after a restart or a SIGKILL,
retention that keeps what registered consumers have not read (up to its cap), and the
positions' bytes (docs/FORMAT.md, "CONSUMER-<name>")."""

from __future__ import annotations

import asyncio
import errno
import os
import uuid
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import persistlog
from child_scripts import Proc
from destinations import open_destination
from faults import FaultPlan
from follower_harness import Where, drain, make_where
from hypothesis_profiles import active_profile
from persistlog._aio.async_consumers import LoopClosed
from persistlog._format import decoder, encoder
from persistlog._format import constants as F
from threads import wait_until

STREAM = {"rotate_bytes": None}


def no_state(emit: Callable[[Any], None]) -> None:
    """A stream's enumeration: its records are events, there is no state to snapshot."""


def write(lg: persistlog.Log, first: int, count: int) -> None:
    for i in range(first, first + count):
        lg.update({"i": i})
    lg.sync()


class Collect:
    """A consumer's handler that keeps the ``i`` of every record and the LSNs it got."""

    def __init__(self) -> None:
        self.items: list[int] = []
        self.lsns: list[int] = []

    def __call__(self, batch: persistlog.FollowedBatch) -> None:
        assert len(batch.records) == batch.last_lsn - batch.first_lsn + 1
        self.items.extend(r["i"] for r in batch.records)
        self.lsns.extend(range(batch.first_lsn, batch.last_lsn + 1))


@pytest.fixture(params=["local", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    return make_where(request.param, request, tmp_path)


def group_at(where: Where, **options: Any) -> persistlog.ConsumerGroup:
    options.setdefault("poll_interval", 0.02)
    return persistlog.consumers(where.url, storage_options=where.so, **options)


def test_consumers_at_different_positions_share_one_read(place: Where) -> None:
    lg = persistlog.open(place.url, no_state, storage_options=place.so, **STREAM, **place.open_options)
    write(lg, 0, 300)
    batches = {name: Collect() for name in ("slow", "middle", "new")}
    g = group_at(place)
    g.add("slow", on_batch=batches["slow"], position=persistlog.Cursor(1, 0, 0, 1))
    # "middle" committed a position inside the log earlier; "new" has none.
    first = group_at(place, commit_interval=None)
    seen = Collect()
    first.add("middle", on_batch=seen)
    with first:
        assert first.wait_caught_up(20)
    assert first["middle"].committed is not None and first["middle"].committed.next_lsn == 301
    with g:
        g.add("middle", on_batch=batches["middle"])
        g.add("new", on_batch=batches["new"])
        write(lg, 300, 200)
        assert g.wait_caught_up(20)
    lg.close()
    assert batches["slow"].items == list(range(500))
    assert batches["middle"].items == list(range(300, 500))
    assert batches["new"].items == list(range(500))  # the newest complete log is log 1
    # Each record was read and decoded once however many consumers took it: the poller
    # read "slow"'s 500 records, and again only what a rewind for a consumer behind it
    # started over (at most the 300 "slow" had had when "new" joined).
    assert g.records_read <= 500 + 300 * g.rewinds


def test_a_restarted_consumer_resumes_right_after_its_committed_position(place: Where) -> None:
    lg = persistlog.open(place.url, no_state, storage_options=place.so, **STREAM, **place.open_options)
    write(lg, 0, 100)
    a = Collect()
    with group_at(place) as g:
        c = g.add("audit", on_batch=a)
        assert c.wait_caught_up(20)
    # stop() committed it: the file at the destination says where it resumes.
    assert g.registered() == {"audit": persistlog.Cursor(c.position.log, c.position.segment,
                                                          c.position.offset, 101)}
    write(lg, 100, 50)
    b = Collect()
    with group_at(place) as g2:
        c2 = g2.add("audit", on_batch=b)
        assert c2.position == c.committed
        assert c2.wait_caught_up(20)
    lg.close()
    assert a.items == list(range(100)) and b.items == list(range(100, 150))


def test_a_consumer_added_behind_the_poller_gets_everything_and_the_others_nothing_twice(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    lg = persistlog.open(url, no_state, **STREAM)
    write(lg, 0, 200)
    ahead, behind = Collect(), Collect()
    with persistlog.consumers(url, poll_interval=0.01) as g:
        g.add("ahead", on_batch=ahead)
        assert g.wait_caught_up(20)
        g.add("behind", on_batch=behind, position="1:0:0:1")
        write(lg, 200, 10)
        assert g.wait_caught_up(20)
    lg.close()
    assert g.rewinds >= 1
    assert ahead.items == list(range(210)) and behind.items == list(range(210))


def test_a_handler_that_raises_stops_its_consumer_only(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    lg = persistlog.open(url, no_state, **STREAM)
    write(lg, 0, 20)  # a batch of its own
    write(lg, 20, 30)
    good = Collect()

    def bad(records: list[Any]) -> None:
        if any(r["i"] >= 20 for r in records):
            raise KeyError("the app's own bug")

    with persistlog.consumers(url) as g:
        g.add("good", on_batch=good)
        broken = g.add("bad", replay_batch=bad)
        with pytest.raises(KeyError):
            broken.wait_caught_up(20)
        write(lg, 50, 10)
        assert g["good"].wait_caught_up(20)
    lg.close()
    assert good.items == list(range(60))
    # Its position stays before the batch it raised on: a restart gets that batch again.
    assert broken.committed is not None and broken.committed.next_lsn == 21
    assert persistlog.consumers(url).registered()["bad"] == broken.committed


def test_retention_keeps_what_a_registered_consumer_has_not_read(place: Where) -> None:
    lg = persistlog.open(place.url, no_state, storage_options=place.so, **STREAM, **place.open_options,
                         retain=1, keep_for_consumers=True)
    write(lg, 0, 10)
    g = group_at(place)
    g.add("offline", on_batch=Collect())  # registered at log 1, then gone for a while
    for n in range(1, 5):
        write(lg, n * 10, 10)
        lg.rotate()
    assert place.log_seqs() == [1, 2, 3, 4, 5]
    back = Collect()
    with group_at(place) as g2:
        c = g2.add("offline", on_batch=back, on_reset=lambda why: pytest.fail(why))
        assert c.wait_caught_up(20)
    assert back.items == list(range(50))
    # Read and committed: the next rotation deletes what it no longer needs, which is
    # everything before log 4, where its position is (after log 4's last record).
    assert c.committed is not None and c.committed.log == 4
    lg.rotate()
    assert place.log_seqs() == [4, 5, 6]
    lg.close()


def test_past_the_cap_a_consumer_resets_and_says_why(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    lg = persistlog.open(url, no_state, **STREAM, retain=1, keep_for_consumers=True, retain_max_logs=2)
    write(lg, 0, 10)
    persistlog.consumers(url).add("dead", on_batch=Collect())  # registered at log 1, never reads
    for n in range(1, 4):
        write(lg, n * 10, 10)
        lg.rotate()
    wait_until(lambda: len({n[:20] for n in os.listdir(url) if n.endswith(".plog")}) == 2)
    reasons: list[str] = []
    got = Collect()
    with persistlog.consumers(url) as g:
        c = g.add("dead", on_batch=got, on_reset=reasons.append)
        assert c.wait_caught_up(20)
        write(lg, 40, 5)
        assert c.wait_caught_up(20)
        stranded = g.add("strict", on_batch=Collect(), position="1:0:0:1")
        with pytest.raises(persistlog.ResetRequired, match="deleted by retention"):
            stranded.wait_caught_up(20)
    lg.close()
    assert c.resets == 1 and "deleted by retention" in reasons[0]
    # After the reset it replays from the newest complete log on (log 4, rotated to when
    # it held no record yet), so it gets what is written from then on.
    assert got.items == list(range(40, 45))


def test_retain_seconds_keeps_logs_whose_records_are_younger(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    lg = persistlog.open(url, no_state, **STREAM, retain=1, retain_seconds=3600)
    for n in range(4):
        write(lg, n * 10, 10)
        lg.rotate()
    assert sorted({int(n[:20]) for n in os.listdir(url) if n.endswith(".plog")}) == [1, 2, 3, 4, 5]
    lg.close()
    url2 = str(tmp_path / "short")
    lg = persistlog.open(url2, no_state, **STREAM, retain=1, retain_seconds=0.2, retain_max_logs=10)
    write(lg, 0, 10)
    lg.rotate()
    time.sleep(0.3)
    lg.rotate()
    lg.close()
    # Log 1's records are older than log 2's start, 0.3 s ago: gone. Log 2 (empty) ended
    # when log 3 started, a moment ago: kept.
    assert sorted({int(n[:20]) for n in os.listdir(url2) if n.endswith(".plog")}) == [2, 3]


def test_positions_in_the_apps_hands_store_nothing(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    lg = persistlog.open(url, no_state, **STREAM)
    write(lg, 0, 30)
    saved: dict[str, str] = {}
    got = Collect()

    def on_batch(batch: persistlog.FollowedBatch) -> None:
        got(batch)
        saved["pos"] = str(batch.cursor)  # in the app's own store, with its own state

    with persistlog.consumers(url, store_positions=False) as g:
        assert g.add("mine", on_batch=on_batch).wait_caught_up(20)
    write(lg, 30, 5)
    with persistlog.consumers(url, store_positions=False) as g:
        assert g.add("mine", on_batch=on_batch, position=saved["pos"]).wait_caught_up(20)
    lg.close()
    assert got.items == list(range(35))
    assert not os.path.exists(os.path.join(url, "consumers"))


def test_a_damaged_position_is_loud_and_a_bad_name_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    lg = persistlog.open(url, no_state, **STREAM)
    write(lg, 0, 5)
    g = persistlog.consumers(url)
    g.add("x", on_batch=Collect())
    path = tmp_path / "log" / "consumers" / "x"
    data = bytearray(path.read_bytes())
    data[20] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(persistlog.CorruptLogError, match="consumer 'x' is damaged"):
        persistlog.consumers(url).add("x", on_batch=Collect())
    for bad in ("", "a/b", "-x", "x" * 65, "é"):
        with pytest.raises(ValueError, match="bad consumer name"):
            g.add(bad, on_batch=Collect())
    with pytest.raises(TypeError, match="one of replay="):
        g.add("y")
    with pytest.raises(ValueError, match="starts at LSN 1, not 2"):
        g.add("y", on_batch=Collect(), position="1:0:0:2")
    with pytest.raises(ValueError, match="not a batch boundary"):
        g.add("y", on_batch=Collect(), position="1:0:41:1")
    assert "y" not in g
    with pytest.raises(ValueError, match="retain_max_logs"):
        persistlog.open(str(tmp_path / "other"), no_state, retain=3, retain_max_logs=2)
    lg.close()


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
       st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**63 - 1), st.data())
def test_a_position_reads_back_and_any_flipped_bit_is_caught(
    seq: int, segment: int, offset: int, next_lsn: int, us: int, data: st.DataObject
) -> None:
    buf = encoder.consumer_position(seq, segment, offset, next_lsn, us)
    assert len(buf) == F.CONSUMER_SIZE
    assert decoder.parse_consumer_position(buf) == (seq, segment, offset, next_lsn, us)
    bit = data.draw(st.integers(0, len(buf) * 8 - 1))
    flipped = bytearray(buf)
    flipped[bit // 8] ^= 1 << (bit % 8)
    assert decoder.parse_consumer_position(bytes(flipped)) is None
    assert decoder.parse_consumer_position(buf[:-1]) is None


def deliveries(path: Path) -> dict[str, list[tuple[str, int, int]]]:
    """What a consumer child wrote: per consumer, its lines as (kind, a, b)."""
    out: dict[str, list[tuple[str, int, int]]] = {}
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        assert parts[0] != "X", line
        if parts[0] == "D":
            out.setdefault(parts[1], []).append(("D", int(parts[2]), int(parts[3])))
        elif parts[0] == "S":
            out.setdefault(parts[1], []).append(("S", int(parts[2]), 0))
        else:
            raise AssertionError(f"unexpected line {line!r}")
    return out


@pytest.mark.slow
def test_sigkill_redelivers_only_what_was_not_committed(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    total = 900
    lg = persistlog.open(url, no_state, durability="flush", rotate_records=150, retain=1, keep_for_consumers=True)
    write(lg, 0, 300)
    names = ["a", "b", "c"]
    cfg = {"url": url, "names": names, "commit_interval": 0.05, "pause": 0.002}
    runs = []
    for run in range(2):
        out = tmp_path / f"run{run}.out"
        with open(out, "wb") as f:
            child = Proc("consumer.py", cfg, tmp_path, f"consumer{run}", stdout=f)
        try:
            if run == 0:
                # The writer goes on once the child added (registered) its consumers: each
                # then has hundreds of records ahead of it, however late the child started,
                # so that the kill lands mid-stream for every one of them.
                wait_until(lambda: sum(line.startswith("S") for line in out.read_text().splitlines()) == len(names),
                           timeout=60, describe=lambda: f"{out.read_text()!r} {child.stderr()}")
                for i in range(300, total):
                    lg.update({"i": i})
                    if i % 50 == 0:
                        time.sleep(0.02)
                lg.sync()
                wait_until(lambda: sum(line.startswith("D") for line in out.read_text().splitlines()) > 400,
                           timeout=30)
                child.kill()
                stored = persistlog.consumers(url).registered()
            else:
                def done() -> bool:
                    got = deliveries(out)
                    return all(got.get(n) and got[n][-1][2] == total for n in names)

                wait_until(done, timeout=60)
        finally:
            child.close()
        runs.append(deliveries(out))
    lg.close()
    for n in names:
        committed = stored[n]
        assert committed is not None
        first_run = [(a, b) for kind, a, b in runs[0][n] if kind == "D"]
        second = runs[1][n]
        # It starts again exactly after its last committed position...
        assert second[0] == ("S", committed.next_lsn, 0)
        second_run = [(a, b) for kind, a, b in second if kind == "D"]
        assert second_run[0][0] == committed.next_lsn
        # ... nothing is skipped: both runs together hold every LSN, in order within each...
        # (it first started at the newest complete log: what rotations left behind it
        # before it registered is not its stream).
        start = runs[0][n][0][1]
        assert runs[0][n][0][0] == "S" and first_run[0][0] == start
        lsns = [lsn for a, b in first_run + second_run for lsn in range(a, b + 1)]
        assert set(lsns) == set(range(start, total + 1))
        for part in (first_run, second_run):
            flat = [lsn for a, b in part for lsn in range(a, b + 1)]
            assert flat == list(range(flat[0], flat[-1] + 1))
        # ... and what both runs got is only what came after the committed position.
        again = {lsn for a, b in first_run for lsn in range(a, b + 1)} & {
            lsn for a, b in second_run for lsn in range(a, b + 1)}
        assert all(lsn >= committed.next_lsn for lsn in again)
    # The kill landed mid-stream for at least one consumer (else the test proves nothing).
    assert any(stored[n].next_lsn <= total for n in names)


def test_positions_are_small_files_beside_the_log_out_of_its_listing(place: Where) -> None:
    lg = persistlog.open(place.url, no_state, storage_options=place.so, **STREAM, **place.open_options)
    write(lg, 0, 3)
    g = group_at(place)
    c = g.add("one", on_batch=Collect())
    positions = open_destination(place.url + "/consumers", **(place.so or {}))
    assert positions.list() == ["one"] and positions.size("one") == F.CONSUMER_SIZE
    # What every reader of the log polls does not grow with the consumers.
    assert not [n for n in open_destination(place.url, **(place.so or {})).list() if "one" in n]
    assert c.committed is not None and g.registered() == {"one": c.committed}
    g.remove("one", forget=True)
    assert positions.list() == [] and g.registered() == {}
    lg.close()


def test_async_for_moves_a_position_only_past_the_batches_the_loop_finished(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    lg = persistlog.open(url, no_state, **STREAM)
    write(lg, 0, 20)  # a batch
    write(lg, 20, 10)  # another
    beside = Collect()

    async def first_run() -> list[int]:
        got: list[int] = []
        group = persistlog.consumers(url)
        group.add("beside", on_batch=beside)
        consumer = group.add_async("loop")
        group.start()
        async for batch in consumer:
            got.extend(r["i"] for r in batch.records)
            if batch.last_lsn == 30:
                break  # the loop leaves this batch unfinished
        await asyncio.sleep(0.3)  # the generator is finalized; the poller lets the batch go
        assert isinstance(consumer.error, LoopClosed)
        assert group["beside"].wait_caught_up(20)
        group.stop()
        return got

    async def second_run() -> list[int]:
        group = persistlog.consumers(url)
        consumer = group.add_async("loop")
        assert consumer.position is not None and consumer.position.next_lsn == 21
        got: list[int] = []
        with group:
            async for batch in consumer:
                got.extend(r["i"] for r in batch.records)
                if batch.last_lsn == 30:
                    break
        return got

    assert asyncio.run(first_run()) == list(range(30))
    assert beside.items == list(range(30))
    assert asyncio.run(second_run()) == list(range(20, 30))  # the unfinished batch again
    lg.close()


@active_profile(max_examples=12)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6),
       starts=st.lists(st.integers(0, 120), min_size=1, max_size=5),
       joins=st.lists(st.booleans(), min_size=5, max_size=5))
def test_every_consumer_gets_exactly_the_records_after_its_position(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], starts: list[int], joins: list[bool]
) -> None:
    """Invariant: whatever positions the consumers start at, and whether they join before
    the poller starts or while it runs, each gets every record after its position once, in
    order, and nothing before it."""
    url = str(tmp_path_factory.mktemp("prop") / "log")
    lg = persistlog.open(url, no_state, **STREAM)
    first = 0
    for size in sizes:
        write(lg, first, size)  # one batch each
        first += size
    total = first
    # The batches as a follower gives them: their record_cursor() is what an app stores.
    batches = list(drain(persistlog.follow(url), total))
    got = [Collect() for _ in starts]
    wanted = []
    group = persistlog.consumers(url, poll_interval=0.005, store_positions=False)
    late = []
    for i, start in enumerate(starts):
        # After `done` records: the log's start, or a record's cursor (a batch boundary
        # after a batch's last record, else inside the batch).
        done = min(start, total)
        cursor = persistlog.Cursor(1, 0, 0, 1) if not done else next(
            fb for fb in batches if fb.first_lsn <= done <= fb.last_lsn).record_cursor(done)
        wanted.append(list(range(cursor.next_lsn - 1, total)))
        (late if joins[i] else []).append((i, cursor))
        if not joins[i]:
            group.add(f"c{i}", on_batch=got[i], position=cursor)
    with group:
        for i, cursor in late:
            group.add(f"c{i}", on_batch=got[i], position=cursor)
        assert group.wait_caught_up(30)
    lg.close()
    for i, c in enumerate(got):
        assert c.items == wanted[i], (i, starts[i])


@pytest.mark.parametrize("interval", [0.05, 0])
def test_a_failed_commit_is_retried_and_stops_nobody(clean_memory_fs: None, interval: float) -> None:
    plan = FaultPlan()
    so = {"target_protocol": "memory", "faults": plan}
    url = f"faulty://c{uuid.uuid4().hex[:8]}/log"
    lg = persistlog.open(url, no_state, storage_options=so, rotate_bytes=None, flush_interval=0.02)
    write(lg, 0, 40)
    lg.close()
    got = Collect()
    group = persistlog.consumers(url, storage_options=so, commit_interval=interval, poll_interval=0.02)
    group.add("c", on_batch=got)  # registered: its first commit went through
    plan.fail("pipe_file", nth=plan.calls["pipe_file"] + 1, times=2, error=errno.EIO)  # the next two
    with group:
        assert group.wait_caught_up(20)
        wait_until(lambda: group.registered().get("c") == group["c"].position, timeout=20)
    assert ("pipe_file", plan.calls["pipe_file"]) not in plan.fired  # the last one went through
    assert len([f for f in plan.fired if f[0] == "pipe_file"]) == 2
    assert group.error is None and group["c"].error is None and got.items == list(range(40))


@pytest.mark.parametrize("on_reset", [True, False])
def test_a_new_consumer_whose_start_went_before_it_read_just_starts_at_the_newest_log(
    tmp_path: Path, on_reset: bool
) -> None:
    # Placed at the newest complete log, it was handed nothing when retention deleted that
    # log (no position stored: nothing kept it): no reset, no ResetRequired, it starts at
    # the newest complete log as a new consumer does.
    url = str(tmp_path / "log")
    lg = persistlog.open(url, no_state, **STREAM, retain=1)
    write(lg, 0, 10)
    group = persistlog.consumers(url, poll_interval=0.02, store_positions=False)
    got = Collect()
    reasons: list[str] = []
    c = group.add("new", on_batch=got, on_reset=reasons.append if on_reset else None)
    lg.rotate()
    lg.rotate()  # log 1, where it was placed, is gone
    write(lg, 10, 5)
    with group:
        assert c.wait_caught_up(20)
    lg.close()
    assert (c.resets, reasons, c.error) == (0, [], None)
    assert got.items == list(range(10, 15))

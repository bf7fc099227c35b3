"""Queue: a durable FIFO per log, bodies on storage (README "Durable queues"; docs/DESIGN.md,
"Queues"). Real logs on a local disk and on the moto S3 server; crashes by SIGKILL are in
test_queue_crashes.py, the model comparison in test_queue_stateful.py."""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from log_files import flip_bit, segment_files
from faults import FaultPlan
from threads import wait_until

import persistlog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def drain(q: persistlog.Queue, ack: bool = False) -> list[tuple[int, bytes]]:
    out = []
    while (m := q.receive()) is not None:
        out.append((m.id, m.body))
        if ack:
            assert q.ack(m.id)
    return out


def logged(url: str) -> list[Any]:
    """The records a restore of ``url`` replays."""
    records: list[Any] = []
    persistlog.restore(url, records.append, missing_ok=False)
    return records


def test_messages_come_in_send_order_and_an_ack_removes_one(tmp_path: Path) -> None:
    with persistlog.Queue.open(tmp_path / "q") as q:
        ids = [q.send(b"m%d" % i) for i in range(5)]
        assert ids == [1, 2, 3, 4, 5]
        first = q.receive()
        assert first == persistlog.Message(1, b"m0")
        assert q.in_flight == 1 and len(q) == 5
        assert q.ack(1) is True
        assert q.ack(1) is False, "acknowledged twice"
        assert q.ack(99) is False, "never sent"
        assert q.ack(3) is True, "a message may be acknowledged before it is delivered"
        assert drain(q) == [(2, b"m1"), (4, b"m3"), (5, b"m4")]
        assert q.receive() is None
        assert len(q) == 3 and q.in_flight == 3 and q.pending_bytes == 6


def test_a_restart_delivers_every_unacknowledged_message_again_and_never_an_acknowledged_one(tmp_path: Path) -> None:
    url = tmp_path / "q"
    with persistlog.Queue.open(url) as q:
        for i in range(6):
            q.send(b"m%d" % i)
        got = drain(q)
        q.ack(got[0][0])
        q.ack(got[2][0])
    with persistlog.Queue.open(url) as q:
        assert q.restored is not None and q.restored.found
        assert drain(q, ack=True) == [(2, b"m1"), (4, b"m3"), (5, b"m4"), (6, b"m5")]
        assert q.send(b"new") == 7, "ids are never given twice"
    with persistlog.Queue.open(url) as q:
        assert drain(q) == [(7, b"new")]


def test_ids_are_not_reused_once_every_message_was_acknowledged_and_rotated_away(tmp_path: Path) -> None:
    url = tmp_path / "q"
    with persistlog.Queue.open(url) as q:
        q.send(b"a")
        q.ack(1)
        q.rotate()
    with persistlog.Queue.open(url) as q:
        assert q.send(b"b") == 2


def test_a_rotation_writes_only_the_unacknowledged_messages_into_the_new_log(tmp_path: Path) -> None:
    url = str(tmp_path / "q")
    with persistlog.Queue.open(url) as q:
        for i in range(10):
            q.send(b"m%d" % i)
        for m in drain(q)[:7]:
            q.ack(m[0])
        q.rotate()
        assert drain(q) == [], "delivery state survives a rotation"
    assert logged(url) == [{"op": "next", "id": 11}] + [
        {"op": "send", "id": i, "body": b"m%d" % (i - 1)} for i in (8, 9, 10)
    ]
    with persistlog.Queue.open(url) as q:
        assert drain(q) == [(8, b"m7"), (9, b"m8"), (10, b"m9")]


def test_size_triggered_rotations_keep_every_message_readable(tmp_path: Path) -> None:
    url = str(tmp_path / "q")
    with persistlog.Queue.open(url, rotate_bytes=8 * 1024, batch_bytes=2048, retain=1) as q:
        for i in range(600):
            q.send(bytes([i % 256]) * 300)
            if i % 3 == 0:
                m = q.receive()
                assert m is not None
                q.ack(m.id)
            if i % 50 == 0:
                time.sleep(0.01)  # a rotation's last steps (marker, CURRENT, retention) run on a worker
        assert q.log.stats()["rotations"] >= 3, "too few rotations happened"
        rest = drain(q, ack=True)
    assert [mid for mid, _ in rest] == list(range(201, 601))


MESSAGES = 400  # of 32 KiB: 13 MB


@pytest.mark.slow
def test_bodies_stay_on_storage_memory_holds_a_few_fields_per_message(tmp_path: Path) -> None:
    with persistlog.Queue.open(tmp_path / "q", rotate_bytes=None) as q:
        body = os.urandom(32 * 1024)
        q.send(body)  # warm up what a first send allocates
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(MESSAGES):
                q.send(body)
            held = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.reset_peak()
            q.rotate()  # reads every body back and writes it again
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
        assert held < 300 * MESSAGES, f"{held} bytes held for 13 MB of messages"
        # A few batches (batch_bytes, 1 MiB): the one being filled, one on its way to the
        # file, the one being read (about 2.2 MB on a quiet machine); not every body.
        assert peak < 5 * 1024 * 1024, f"the rotation peaked at {peak} bytes for 13 MB of messages"
        assert drain(q)[-1] == (MESSAGES + 1, body)


def test_a_quota_refuses_before_anything_is_written(tmp_path: Path) -> None:
    with persistlog.Queue.open(tmp_path / "q", max_messages=3, max_bytes=100) as q:
        q.send(b"x" * 40)
        q.send(b"x" * 40)
        before = q.log.next_lsn
        with pytest.raises(persistlog.QuotaExceeded, match="max_bytes=100"):
            q.send(b"x" * 21)
        q.send(b"x" * 20)
        with pytest.raises(persistlog.QuotaExceeded, match="max_messages=3"):
            q.send(b"")
        assert q.log.next_lsn == before + 1
        q.ack(1)
        q.send(b"y")
    with persistlog.Queue.open(tmp_path / "q") as q:
        assert [b for _, b in drain(q)] == [b"x" * 40, b"x" * 20, b"y"]


def test_expired_messages_are_dropped_undelivered_also_by_the_quota_and_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    url = tmp_path / "q"
    with persistlog.Queue.open(url, clock=clock, ttl=10, max_messages=3) as q:
        q.send(b"a")
        q.send(b"b", ttl=100)
        q.send(b"c")
        clock.now += 11
        q.send(b"d")  # the quota drops the two expired messages first
        m = q.receive()
        assert m is not None and (m.id, m.body, m.expires_at) == (2, b"b", 1100.0)
        clock.now += 100
        assert q.ack(2) is False, "an expired message is gone, delivered or not"
        assert q.expire() == 1
        assert len(q) == 0 and q.in_flight == 0
    with persistlog.Queue.open(url, clock=clock) as q:
        assert len(q) == 0 and drain(q) == []
    # Expiry writes nothing; the restart's new log holds no expired message.
    assert logged(str(url)) == [{"op": "next", "id": 5}]


def test_a_message_not_acknowledged_within_its_visibility_timeout_is_delivered_again(tmp_path: Path) -> None:
    clock = Clock()
    with persistlog.Queue.open(tmp_path / "q", clock=clock, visibility_timeout=10) as q:
        for body in (b"a", b"b", b"c"):
            q.send(body)
        assert q.receive() == persistlog.Message(1, b"a")
        assert q.receive(visibility_timeout=4) == persistlog.Message(2, b"b")
        clock.now += 3
        assert q.change_visibility(2, 20) is True  # extended: now due at 1023
        clock.now += 7  # 1010: message 1's timeout ran out, message 2's not
        assert q.receive() == persistlog.Message(1, b"a"), "a timed-out message comes before one never delivered"
        assert q.receive() == persistlog.Message(3, b"c")
        assert q.receive() is None and q.in_flight == 3
        assert q.ack(1) is True
        clock.now += 100  # every timeout ran out: 3's (at 1020) before 2's (at 1023)
        assert [m.id for m in iter(q.receive, None)] == [3, 2]
        assert q.ack(3) is True and q.ack(2) is True
        clock.now += 1000
        assert q.receive() is None, "an acknowledged message is never delivered again"
        assert len(q) == 0 and q.in_flight == 0


def test_change_visibility_only_moves_a_message_in_flight(tmp_path: Path) -> None:
    clock = Clock()
    with persistlog.Queue.open(tmp_path / "q", clock=clock) as q:
        q.send(b"a")
        q.send(b"b")
        before = q.log.next_lsn
        assert q.change_visibility(1, 5) is False, "not delivered yet"
        assert q.receive() == persistlog.Message(1, b"a")  # no timeout: until a restart
        clock.now += 1e6
        assert q.receive() == persistlog.Message(2, b"b")
        assert q.change_visibility(1, 0) is True, "0 makes it receivable at once"
        assert q.change_visibility(1, 5) is False, "its timeout ran out already"
        assert q.receive() == persistlog.Message(1, b"a")
        assert q.ack(1) is True
        assert q.change_visibility(1, 5) is False, "acknowledged"
        assert q.change_visibility(7, 5) is False, "never sent"
        with pytest.raises(ValueError, match="timeout"):
            q.change_visibility(2, -1)
        with pytest.raises(ValueError, match="visibility_timeout"):
            q.receive(visibility_timeout=float("inf"))
        with pytest.raises(TypeError, match="int"):
            q.change_visibility("2", 1)  # type: ignore[arg-type]
        assert q.log.next_lsn == before + 1, "only the ack was logged"
    with pytest.raises(ValueError, match="visibility_timeout"):
        persistlog.Queue.open(tmp_path / "q2", visibility_timeout=-1)


def test_timeouts_survive_a_rotation_and_an_expired_message_is_not_delivered_again(tmp_path: Path) -> None:
    clock = Clock()
    with persistlog.Queue.open(tmp_path / "q", clock=clock, visibility_timeout=5) as q:
        q.send(b"a")
        q.send(b"b", ttl=8)
        assert [m.id for m in (q.receive(), q.receive())] == [1, 2]
        q.rotate()  # bodies copied into the new log; delivery state kept
        clock.now += 6
        assert q.receive() == persistlog.Message(1, b"a")
        clock.now += 3  # b's timeout ran out, and so did its ttl
        assert q.receive() is None and len(q) == 1


def test_bad_input_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="takes no replay"):
        persistlog.Queue.open(tmp_path / "q", replay=print)
    with pytest.raises(TypeError, match="strictly"):
        persistlog.Queue.open(tmp_path / "q", recovery="skip")
    with pytest.raises(ValueError, match="max_messages"):
        persistlog.Queue.open(tmp_path / "q", max_messages=0)
    with pytest.raises(ValueError, match="ttl"):
        persistlog.Queue.open(tmp_path / "q", ttl=-1)
    assert not (tmp_path / "q").exists()
    with persistlog.Queue.open(tmp_path / "q") as q:
        before = q.log.next_lsn
        with pytest.raises(TypeError, match="bytes"):
            q.send("text")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="ttl"):
            q.send(b"x", ttl=float("nan"))
        with pytest.raises(TypeError, match="int"):
            q.ack("1")  # type: ignore[arg-type]
        assert q.log.next_lsn == before
        assert q.send(bytearray(b"ok")) == 1


def test_a_damaged_body_raises_and_the_message_stays_queued(tmp_path: Path) -> None:
    url = tmp_path / "q"
    with persistlog.Queue.open(url, rotate_bytes=None) as q:
        q.send(b"A" * 1000)
        newest = segment_files(url)[-1]
        data = Path(newest).read_bytes()
        flip_bit(newest, data.rindex(b"A" * 1000) + 500, 1)
        with pytest.raises(persistlog.CorruptLogError):
            q.receive()
        assert len(q) == 1
        with pytest.raises(persistlog.CorruptLogError):
            q.receive()


def test_buffered_durability_reads_a_message_still_in_the_writer_s_buffer(tmp_path: Path) -> None:
    with persistlog.Queue.open(tmp_path / "q", durability="buffered", flush_interval=60) as q:
        q.send(b"just sent")
        assert drain(q) == [(1, b"just sent")]


def test_queues_in_a_log_set_each_have_their_own_log(tmp_path: Path) -> None:
    with persistlog.LogSet(tmp_path / "set") as logs:
        queues = {k: persistlog.Queue.open_in(logs, k, max_messages=5) for k in ("ab", "cd", "ef/gh")}
        for k, q in queues.items():
            q.send(k.encode())
        with pytest.raises(persistlog.WriterConflict):
            persistlog.Queue.open_in(logs, "ab")
        assert set(logs.open_logs) == set(queues)
        assert logs.open_logs["ab"].settings.durability == "flush"
    assert all(q.log.closed for q in queues.values()), "the set closes its queues"
    with persistlog.LogSet(tmp_path / "set", durability="fsync", concurrent_enumeration=True) as logs:
        assert sorted(logs.keys()) == ["ab", "cd", "ef/gh"]
        q = persistlog.Queue.open_in(logs, "ef/gh")
        assert q.log.settings.durability == "fsync"
        assert drain(q) == [(1, b"ef/gh")]
        # The set's concurrent_enumeration is not the queue's: its rotations hold updates.
        for i in range(40):
            q.send(b"%d" % i)
        q.rotate()
        assert [b for _, b in drain(q)] == [b"%d" % i for i in range(40)]
        with pytest.raises(TypeError, match="storage_options"):
            persistlog.Queue.open_in(logs, "x", storage_options={})


def test_a_queue_on_s3_delivers_across_a_restart(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    url = f"s3://{s3_bucket}/queues/q1"
    with persistlog.Queue.open(url, storage_options=s3_storage_options) as q:
        for i in range(4):
            q.send(b"s3-%d" % i)
        m = q.receive()
        assert m is not None and q.ack(m.id)
        q.rotate()
        assert drain(q) == [(2, b"s3-1"), (3, b"s3-2"), (4, b"s3-3")]
    with persistlog.Queue.open(url, storage_options=s3_storage_options) as q:
        assert drain(q) == [(2, b"s3-1"), (3, b"s3-2"), (4, b"s3-3")]


def test_open_many_opens_every_queue_of_a_set_several_at_a_time(tmp_path: Path) -> None:
    keys = [f"user-{i}" for i in range(12)]
    with persistlog.LogSet(tmp_path / "set") as logs:
        for key in keys:
            persistlog.Queue.open_in(logs, key).send(key.encode())
    with persistlog.LogSet(tmp_path / "set") as logs:
        queues = persistlog.Queue.open_many(logs, threads=4, max_messages=3)
        assert sorted(queues) == sorted(keys)
        assert {key: drain(q) for key, q in queues.items()} == {key: [(1, key.encode())] for key in keys}
        assert all(q.max_messages == 3 for q in queues.values())
        with pytest.raises(persistlog.WriterConflict):
            persistlog.Queue.open_many(logs, ["new", "user-3"])
        assert "new" in logs.open_logs, "what opened stays in the set"
        with pytest.raises(ValueError, match="threads"):
            persistlog.Queue.open_many(logs, [], threads=0)


def test_threads_sending_and_delivering_through_rotations_lose_and_repeat_nothing(tmp_path: Path) -> None:
    import threading

    url = str(tmp_path / "q")
    got: list[bytes] = []
    with persistlog.Queue.open(url, rotate_bytes=16 * 1024, batch_bytes=4096) as q:
        def produce(p: int) -> None:
            for i in range(300):
                q.send(b"%d:%d:" % (p, i) + b"x" * 100)

        def consume() -> None:
            while len(got) < 600:
                m = q.receive()
                if m is None:
                    time.sleep(0.001)
                    continue
                got.append(m.body)
                assert q.ack(m.id)

        threads = [threading.Thread(target=produce, args=(p,)) for p in (1, 2)] + [threading.Thread(target=consume)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        # A rotation counts once its log is complete. The last one started may still be
        # in its tail (the complete marker's sync, CURRENT, retention) on a persistlog
        # worker: the update that started it went on once the enumeration ended, so the
        # threads may be done before it is (under a loaded disk, seconds later).
        wait_until(lambda: not q.log.stats()["rotating"] and not q.log.stats()["retaining"], 60,
                   "the rotation under way to finish")
        st = q.log.stats()
        assert st["rotations"] >= 2, {k: st[k] for k in ("rotations", "rotation_due", "log_bytes")}
        assert len(q) == 0
    for p in (1, 2):
        mine = [int(b.split(b":")[1]) for b in got if b.startswith(b"%d:" % p)]
        assert mine == list(range(300)), "each producer's messages once each, in its order"
    with persistlog.Queue.open(url) as q:
        assert drain(q) == []



def test_a_restart_reads_the_bodies_once(request: pytest.FixtureRequest) -> None:
    """The restore reads every pending body; the open's enumeration writes those into the
    new log without reading them back. So a restart reads what a restore of the queue's
    log reads, plus the same few reads (open's checks) whatever is pending: each body
    here is over the reader's point-read size, so reading each back would add one read
    per message."""

    def reads(pending: int) -> tuple[int, int]:
        url = f"faulty://queue-reads-{pending}-{request.node.name}"
        opts: dict[str, Any] = {"target_protocol": "memory", "faults": FaultPlan()}
        q = persistlog.Queue.open(url, storage_options=opts)
        sent = [q.send(bytes([i]) * 40_000) for i in range(pending)]
        q.close()
        restoring = FaultPlan()
        persistlog.restore(url, lambda r: None, storage_options={"target_protocol": "memory", "faults": restoring})
        opening = FaultPlan()
        with persistlog.Queue.open(url, storage_options={"target_protocol": "memory", "faults": opening}) as q:
            done = opening.calls["cat_file"]
            assert [(m.id, m.body) for m in (q.receive() for _ in sent) if m] == [
                (mid, bytes([i]) * 40_000) for i, mid in enumerate(sent)]
        return restoring.calls["cat_file"], done

    (restore_1, open_1), (restore_12, open_12) = reads(1), reads(12)
    assert restore_12 > restore_1  # the restore reads each body (a segment object each here)
    # Reading each body back again made them grow with it (12 more than the restore
    # for 1 message, 67 for 12).
    assert open_12 - restore_12 == open_1 - restore_1, (restore_1, open_1, restore_12, open_12)


def test_a_restart_past_the_kept_bytes_reads_the_rest_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past KEEP_REPLAYED_BYTES of bodies the restore keeps no more; the open's enumeration
    reads those back by position. Acknowledged ones free their room as the replay meets
    the acks, so later bodies are kept in their place."""
    from persistlog._apps import message_queue

    monkeypatch.setattr(message_queue, "KEEP_REPLAYED_BYTES", 100_000)
    url = str(tmp_path / "q")
    with persistlog.Queue.open(url) as q:
        sent = [q.send(bytes([i]) * 40_000) for i in range(3)]
        for mid in sent:
            assert q.ack(mid)  # the replay frees their room: 3 and 4 are kept, 5-11 read back
        sent += [q.send(bytes([i]) * 40_000) for i in range(3, 12)]
    with persistlog.Queue.open(url) as q:
        assert drain(q, ack=True) == [(mid, bytes([i]) * 40_000) for i, mid in enumerate(sent) if i >= 3]
    with persistlog.Queue.open(url) as q:
        assert drain(q) == []

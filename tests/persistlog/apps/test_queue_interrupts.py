"""Ctrl-C at any point of a queue's send, receive, ack and rotation: nothing acknowledged
comes back, nothing sent is lost, and no call stalls."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from interrupt_points import PointInterrupter, Retrier, every_point

import persistlog


def _queue_path_files() -> tuple[str, ...]:
    """Where a queue's calls run on the app's thread: the queue and its record reader,
    the writer, the runtime and the destinations."""
    import destinations

    package = Path(persistlog.__file__).parent
    return (
        str(package / "_apps" / "message_queue.py"), str(package / "_read" / "record_reader.py"),
        str(package / "_write") + os.sep, str(package / "_runtime.py"), str(Path(destinations.__file__).parent) + os.sep,
    )


def _interrupted_at_point(root: Path, durability: str, nth: int | None) -> tuple[int, int, str]:
    """Send 8 messages to a queue (a count trigger of 5: rotations, each copying the
    messages not acknowledged), receiving and acknowledging one after every second send,
    then close, with a KeyboardInterrupt at the ``nth`` point where CPython can run a
    signal handler on the app's thread in the queue's path (None: none). Each call is
    retried as an app would. Then the queue is opened again and drained: each message
    whose ``send`` returned and that was not acknowledged comes back, none acknowledged
    does, and nothing else but a message whose interrupted ``send`` was logged, which the
    queue held (the queue held what comes back). Returns
    (points passed, interruptions, the point interrupted)."""
    url = str(root / f"queue-{nth}")
    q = persistlog.Queue.open(url, durability=durability, rotate_records=5, retain=1, segment_bytes=4096,
                              flush_interval=3600)
    sent: set[int] = set()  # the id each send that returned gave
    tried: set[bytes] = set()  # every body a send was called with
    acked: set[int] = set()  # ids whose ack returned (True, or False: acknowledged already)
    retried = Retrier()
    with PointInterrupter(_queue_path_files(), nth) as at:
        for i in range(8):
            body = f"message {i} ".encode() + b"x" * 200
            tried.add(body)
            sent.add(retried(lambda: q.send(body)))
            if i % 2:
                m = retried(q.receive)
                assert m is not None, at.where
                retried(lambda: q.ack(m.id))
                acked.add(m.id)
        held = retried(lambda: len(q))  # the messages not acknowledged, as the queue holds them
        retried(q.close)
    point, interrupts = at.where, retried.interrupts
    assert retried.slowest < 5, (point, retried.slowest)
    try:
        again = persistlog.Queue.open(url)
    except persistlog.WriterConflict as e:
        raise AssertionError(f"the lock is still held after close() (interrupted at {point})") from e
    delivered: dict[int, bytes] = {}
    while (m := again.receive()) is not None:
        assert m.id not in delivered, (point, m.id)
        delivered[m.id] = m.body
        again.ack(m.id)
    again.close()
    # What the queue held is what its log holds: a message whose interrupted send was
    # logged is held too (a rotation copies what the queue holds: it was once dropped
    # there), and one whose interrupted ack was logged is not.
    assert len(delivered) == held, (point, held, delivered.keys())
    assert not delivered.keys() & acked, (point, delivered.keys() & acked)
    assert delivered.keys() >= sent - acked, (point, sent - acked - delivered.keys())
    # Nothing else: but a message whose interrupted send was logged (sent again, under
    # another id, by the retry).
    assert set(delivered.values()) <= tried, point
    assert len(delivered.keys() - sent) <= interrupts, (point, delivered.keys() - sent)
    return at.points, interrupts, point


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["flush", "buffered"])
def test_an_interruption_at_any_point_of_a_queue_loses_nothing_and_redelivers_nothing_acknowledged(
        tmp_path: Path, durability: str) -> None:
    """A KeyboardInterrupt at each point where CPython could run Ctrl-C's handler on the
    app's thread in a queue's path (the queue, its record reader, the writer, the runtime,
    the destinations: as each Python function starts, and after each C call returns),
    through sends, receives, acks and the rotations a count trigger starts (each copying
    the messages not acknowledged into a new log), and ``close()``: the retried calls go
    through without waiting for a timeout, and after a restart every message sent and
    not acknowledged is delivered, and none acknowledged is."""
    every_point(lambda nth: _interrupted_at_point(tmp_path, durability, nth))

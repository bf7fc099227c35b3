"""Ctrl-C at any point of a queue's send, receive, ack and rotation: nothing acknowledged
comes back, nothing sent is lost, and no call stalls."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

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


def _retried(call: Any) -> tuple[Any, int]:
    """``call()`` until no KeyboardInterrupt stops it: (what it returned, interruptions)."""
    interrupts = 0
    while True:
        try:
            return call(), interrupts
        except KeyboardInterrupt:
            interrupts += 1


def _interrupted_at_point(root: Path, durability: str, nth: int | None) -> tuple[int, int, str]:
    """Send 8 messages to a queue (a count trigger of 5: rotations, each copying the
    messages not acknowledged), receiving and acknowledging one after every second send,
    then close, with a KeyboardInterrupt at the ``nth`` point where CPython can run a
    signal handler on the app's thread in the queue's path (None: none). Each call is
    retried as an app would. Then the queue is opened again and drained: each message
    whose ``send`` returned and that was not acknowledged comes back, none acknowledged
    does, and nothing else but a message whose interrupted ``send`` was logged. Returns
    (points passed, interruptions, the point interrupted)."""
    url = str(root / f"queue-{nth}")
    files = _queue_path_files()
    points = {"n": 0}
    where: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        # (Not in a __del__: one of an earlier run's Logs, collected here by the cycle
        # collector, where CPython reports an exception instead of raising it.)
        if event in ("call", "c_return") and frame.f_code.co_filename.startswith(files) \
                and frame.f_code.co_name != "__del__":
            points["n"] += 1
            if points["n"] == nth:
                after = "" if event == "call" else f" after {getattr(arg, '__qualname__', arg)}"
                where.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}{after}")
                raise KeyboardInterrupt(where[-1])

    q = persistlog.Queue.open(url, durability=durability, rotate_records=5, retain=1, segment_bytes=4096,
                              flush_interval=3600)
    sent: set[int] = set()  # the id each send that returned gave
    tried: set[bytes] = set()  # every body a send was called with
    acked: set[int] = set()  # ids whose ack returned (True, or False: acknowledged already)
    interrupts = 0
    slowest = 0.0

    def timed(call: Any) -> Any:
        nonlocal interrupts, slowest
        began = time.monotonic()
        result, n = _retried(call)
        interrupts += n
        slowest = max(slowest, time.monotonic() - began)
        return result

    sys.setprofile(profile)
    try:
        for i in range(8):
            body = f"message {i} ".encode() + b"x" * 200
            tried.add(body)
            sent.add(timed(lambda: q.send(body)))
            if i % 2:
                m = timed(q.receive)
                assert m is not None, where
                timed(lambda: q.ack(m.id))
                acked.add(m.id)
        timed(q.close)
    finally:
        sys.setprofile(None)
    point = where[0] if where else ""
    assert slowest < 5, (point, slowest)
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
    assert not delivered.keys() & acked, (point, delivered.keys() & acked)
    assert delivered.keys() >= sent - acked, (point, sent - acked - delivered.keys())
    # Nothing else: but a message whose interrupted send was logged (sent again, under
    # another id, by the retry).
    assert set(delivered.values()) <= tried, point
    assert len(delivered.keys() - sent) <= interrupts, (point, delivered.keys() - sent)
    return points["n"], interrupts, point


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
    points, interrupts, _ = _interrupted_at_point(tmp_path, durability, None)
    assert points >= 300 and interrupts == 0, points
    missed = 0
    for nth in range(1, points + 1):
        passed, interrupts, point = _interrupted_at_point(tmp_path, durability, nth)
        if interrupts == 0:
            assert passed < nth, (nth, passed)  # a run may pass a few points fewer
            missed += 1
        else:
            assert interrupts == 1, (nth, point)
    assert missed <= points // 20, (missed, points)

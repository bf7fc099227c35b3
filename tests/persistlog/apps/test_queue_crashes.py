"""A Queue's delivery guarantees with real processes killed by SIGKILL (docs/DESIGN.md,
"Queues").

One queue directory lives through every round: a child broker (``queue_crash_child.py``)
restores it, then sends, receives, acknowledges and rotates (small rotation triggers, so
rotations also start inside sends and acks), reporting each call before and after it. The
parent kills it while it sends, while it acknowledges, in a rotation, or while it opens, then opens the
queue itself and drains it without acknowledging: every message whose send returned and
whose ack never returned is there, with its id; no message whose ack returned is; nothing
else is. The next child starts from what the kill left.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import persistlog
import pytest
from child_scripts import child_env

CHILD = Path(__file__).resolve().parents[1] / "queue_crash_child.py"
MODES = ["send", "ack", "rotate", "open"]
ROUNDS = 12


@dataclass
class History:
    """What every child said, across rounds."""

    attempted: set[str] = field(default_factory=set)  # S?
    sent: dict[str, int] = field(default_factory=dict)  # S+ body -> id
    bodies: dict[int, str] = field(default_factory=dict)  # id -> body (S+ and R)
    acked: set[int] = field(default_factory=set)  # A+
    ack_tried: set[int] = field(default_factory=set)  # A?

    def take(self, lines: list[str]) -> None:
        for line in lines:
            kind, _, rest = line.partition(" ")
            if kind == "S?":
                self.attempted.add(rest)
            elif kind == "S+":
                body, mid = rest.rsplit(" ", 1)
                self.sent[body] = int(mid)
                self.bodies[int(mid)] = body
            elif kind == "R":
                mid, body = rest.split(" ", 1)
                self.bodies[int(mid)] = body
            elif kind == "A?":
                self.ack_tried.add(int(rest))
            elif kind == "A+":
                self.acked.add(int(rest))


def run_round(url: str, round_no: int, mode: str, rng: random.Random) -> list[str]:
    lines: list[str] = []
    seen = threading.Condition()
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), url, str(round_no), str(rng.randrange(2**32))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None

    def reader() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            with seen:
                lines.append(raw.rstrip("\n"))
                seen.notify_all()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    # "open": killed early, often while it restores or writes its first log (the
    # enumeration copying every message into it).
    marker, want = {"send": ("S?", rng.randrange(5, 120)), "ack": ("A?", rng.randrange(2, 40)),
                    "rotate": ("E?", rng.randrange(1, 3)), "open": ("O", 0)}[mode]
    deadline = time.monotonic() + 30
    try:
        with seen:
            while sum(1 for x in lines if x.startswith(marker)) < want and proc.poll() is None:
                if time.monotonic() > deadline:
                    break
                seen.wait(0.5)
        time.sleep(rng.uniform(0.15, 0.45) if mode == "open" else rng.uniform(0.0, 0.002))
        assert proc.poll() is None, f"child exited early:\n{proc.stderr.read()}"
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        t.join(10)
    err = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, f"child ended with {proc.returncode}:\n{err}"
    assert not [x for x in lines if x.startswith("X ")], (lines[-5:], err)
    return lines


def drain(url: str) -> dict[int, str]:
    """Every message the queue holds, by id, delivered and left unacknowledged."""
    q = persistlog.Queue.open(url)
    try:
        found: dict[int, str] = {}
        while (m := q.receive()) is not None:
            assert m.id not in found, f"message {m.id} delivered twice in one life"
            found[m.id] = m.body.decode()
        assert len(found) == len(q)
        return found
    finally:
        q.close()


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_sigkill_never_loses_an_unacknowledged_message_nor_redelivers_an_acknowledged_one(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    url = str(tmp_path / "queue")
    history = History()
    kinds = dict.fromkeys(MODES, 0)
    for round_no in range(ROUNDS):
        mode = MODES[round_no % len(MODES)]
        lines = run_round(url, round_no, mode, rng)
        history.take(lines)
        kinds[mode] += 1
        found = drain(url)
        for mid, body in found.items():
            assert mid not in history.acked, f"message {mid} ({body}) acknowledged, and delivered again"
            assert body in history.attempted, f"message {mid} ({body}) was never sent"
            if body in history.sent:
                assert history.sent[body] == mid, f"{body} was sent as {history.sent[body]}, comes back as {mid}"
        present = set(found.values())
        for body, mid in history.sent.items():
            if mid not in history.acked and mid not in history.ack_tried:
                assert body in present, f"message {mid} ({body}) was sent, never acknowledged, and is lost"
    assert history.acked and history.sent, "the rounds sent and acknowledged nothing"
    assert all(kinds.values())

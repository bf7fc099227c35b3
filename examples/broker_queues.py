"""A message broker's storage: one durable queue per recipient, thousands of them, killed
with ``kill -9`` and restarted.

    python examples/broker_queues.py /tmp/broker --queues 2000 --messages 5

Each recipient's queue is a ``persistlog.Queue`` in a ``persistlog.LogSet`` (one log per
queue, in shard directories ``root/ab/<recipient>``): bodies stay on disk, memory holds a
few fields per message. The run has two lives:

1. A broker process (this script with ``--serve``) opens every queue, sends ``messages``
   messages to each, and delivers and acknowledges some of them, then keeps sending,
   delivering and acknowledging at random. It reports on stdout each send and each
   acknowledgement *after* the call returned (and each acknowledgement it is about to
   make), so what it reported is what it promised.
2. Once it reported enough, this process kills it with SIGKILL, restarts the broker's
   storage (opens every queue the set holds: each restores its messages), delivers every
   message, and checks the two promises: no message whose acknowledgement returned comes
   back, and every message whose send returned and that was never acknowledged does. It
   prints a summary line and exits 1 if a promise was broken.

The root must be new or empty: the check counts what this run sent.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time

import persistlog


def recipients(n: int) -> list[str]:
    return [f"user-{i:05d}" for i in range(n)]


def say(kind: str, key: str, message_id: int) -> None:
    sys.stdout.write(f"{kind} {key} {message_id}\n")
    sys.stdout.flush()


def serve(root: str, n: int, messages: int, seed: int) -> None:
    """The broker: fill every queue, deliver some, then work at random until killed."""
    rng = random.Random(seed)
    mailboxes = persistlog.LogSet(root, durability="flush")
    queues = persistlog.Queue.open_many(mailboxes, recipients(n))

    def send(key: str) -> None:
        say("SENT", key, queues[key].send(f"{key} says hi {rng.random():.6f}".encode()))

    def deliver(key: str) -> None:
        m = queues[key].receive()
        if m is not None and rng.random() < 0.7:
            say("ACKING", key, m.id)
            queues[key].ack(m.id)
            say("ACKED", key, m.id)

    for key in queues:
        for _ in range(messages):
            send(key)
    for key in queues:
        deliver(key)
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    keys = list(queues)
    while True:  # until SIGKILL
        key = rng.choice(keys)
        send(key) if rng.random() < 0.5 else deliver(key)


def run(root: str, n: int, messages: int, seed: int, after: int) -> int:
    if os.path.isdir(root) and os.listdir(root):
        print(f"{root} is not empty: give a new directory", file=sys.stderr)
        return 2
    broker = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), root, "--serve", "--queues", str(n),
         "--messages", str(messages), "--seed", str(seed)],
        stdout=subprocess.PIPE, text=True,
    )
    assert broker.stdout is not None
    # What the broker reported: sends and acks that returned, acks it was about to make.
    reported: dict[str, set[tuple[str, int]]] = {"SENT": set(), "ACKING": set(), "ACKED": set()}
    sent, acking, acked = reported["SENT"], reported["ACKING"], reported["ACKED"]
    ready_at = None
    started = time.monotonic()
    for line in broker.stdout:
        if line == "READY\n":
            ready_at = len(sent) + len(acked)
            continue
        kind, key, message_id = line.split()
        reported[kind].add((key, int(message_id)))
        if ready_at is not None and len(sent) + len(acked) >= ready_at + after:
            break
    broker.send_signal(signal.SIGKILL)  # kill -9: nothing closed, nothing sealed
    broker.wait()
    killed_after = time.monotonic() - started
    # What it reported before it died and was not read yet: an acknowledgement it was
    # about to make is in the pipe before the call, so every ack it made is known here.
    for line in broker.stdout.read().splitlines():
        if line != "READY" and len(parts := line.split()) == 3:
            reported[parts[0]].add((parts[1], int(parts[2])))

    started = time.monotonic()
    with persistlog.LogSet(root, create=False) as mailboxes:
        queues = persistlog.Queue.open_many(mailboxes)  # every key the set holds, 4 at a time
        restart_s = time.monotonic() - started
        delivered: set[tuple[str, int]] = set()
        for key, q in queues.items():
            while (m := q.receive()) is not None:
                delivered.add((key, m.id))
    redelivered = sorted(delivered & acked)
    lost = sorted(sent - acking - delivered)
    summary = {
        "queues": len(queues), "sent": len(sent), "acked": len(acked), "pending": len(delivered),
        "acked_redelivered": len(redelivered), "unacked_lost": len(lost),
        "broker_seconds": round(killed_after, 2), "restart_seconds": round(restart_s, 2),
    }
    print(json.dumps(summary))
    if redelivered or lost:
        print(f"broken promises: acknowledged and delivered again {redelivered[:5]}, lost {lost[:5]}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", help="the LogSet's root directory (new or empty)")
    parser.add_argument("--queues", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=5, help="messages sent to each queue at first")
    parser.add_argument("--after", type=int, default=2000, help="calls reported after the fill before the kill")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--serve", action="store_true", help="be the broker (what the run starts and kills)")
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.root, args.queues, args.messages, args.seed)
        return 0
    return run(args.root, args.queues, args.messages, args.seed, args.after)


if __name__ == "__main__":
    sys.exit(main())

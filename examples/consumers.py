"""A durable message stream with several consumers, each replaying it from its own position.

    python examples/consumers.py /tmp/stream                 # publish, consume, kill one, resume
    python examples/consumers.py /tmp/stream --messages 20000 --consumers billing,audit,search

The pattern of a durable-storage message broker (EMQX's durable storage, Kafka's consumer
groups): every message is stored once, in one log, however many consumers read it; each
consumer has a *name* and a *position* of its own, stored beside the log, and replays the
stream from there, at its own pace, across restarts and crashes.

- The **publisher** (this process) writes messages with ``persistlog.open(...,
  keep_for_consumers=True, retain_max_logs=...)``: rotation deletes no log that a registered
  consumer has not read, up to the cap.
- Each **consumer** is a child process (this script with ``--consumer NAME``) holding a
  ``persistlog.consumers(url)`` group with one consumer in it: it delivers each message to
  its "client" (a line in ``NAME.delivered``) and commits its position every 50 ms. A
  process serving many consumers adds them all to one group: one poller reads the log
  for all of them.
- Halfway through, the publisher **kills** one consumer with SIGKILL and starts it again:
  it resumes right after its last committed position. What it had delivered after that
  commit is delivered again (at-least-once), and nothing is skipped.

At the end each consumer's deliveries are checked against what was published and a line
per consumer is printed; the exit status is 0 when every consumer got every message.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Any

import persistlog

TOPICS = ["sensors/temp", "sensors/door", "alerts/fire"]


def no_state(emit: Any) -> None:
    """A stream's enumeration: messages are events, there is no state to snapshot."""


def consume(url: str, name: str, outdir: str) -> None:
    """One consumer process: deliver each message (a line in NAME.delivered), forever."""
    fd = os.open(os.path.join(outdir, f"{name}.delivered"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def deliver(messages: list[dict[str, Any]]) -> None:
        os.write(fd, "".join(f"{m['seq']} {m['topic']}\n" for m in messages).encode())
        time.sleep(0.001)  # a client that takes its time

    group = persistlog.consumers(url, commit_interval=0.05, wait_for_log=True)
    consumer = group.add(name, replay_batch=deliver, on_reset=lambda why: print(f"{name} reset: {why}"))
    print(f"{name}: starting at {consumer.position}", flush=True)
    with group:
        while True:
            time.sleep(1)


def spawn(url: str, name: str, outdir: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), url, "--consumer", name, "--out", outdir])


def delivered(outdir: str, name: str) -> list[int]:
    try:
        with open(os.path.join(outdir, f"{name}.delivered")) as f:
            return [int(line.split()[0]) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def check(name: str, seqs: list[int], published: int) -> bool:
    """Every message from the first one delivered on, in order, repeats only as a resume
    after a crash makes them (a run of messages delivered again, then on in order)."""
    missing = sorted(set(range(seqs[0] if seqs else 0, published)) - set(seqs))
    again = len(seqs) - len(set(seqs))
    ok = bool(seqs) and not missing and seqs[-1] == published - 1
    print(f"{name:>10}: {len(set(seqs))} messages from #{seqs[0] if seqs else '-'}, "
          f"{again} delivered again after a crash, {len(missing)} missing")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="where the stream lives (a directory or an fsspec URL)")
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--consumers", default="billing,analytics,archive")
    parser.add_argument("--consumer", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help="where the consumers' deliveries go (default: URL + '.out')")
    args = parser.parse_args()
    outdir = args.out or args.url.rstrip("/") + ".out"
    if args.consumer:
        consume(args.url, args.consumer, outdir)
        return 0
    os.makedirs(outdir, exist_ok=True)
    names = args.consumers.split(",")
    stream = persistlog.open(args.url, no_state, durability="flush", rotate_records=max(100, args.messages // 10),
                             retain=1, keep_for_consumers=True, retain_max_logs=100, discard_existing=True)
    group = persistlog.consumers(args.url)
    for name in group.registered():  # a demo starts afresh: forget an earlier run's consumers
        group.remove(name, forget=True)
    procs = {name: spawn(args.url, name, outdir) for name in names}
    # Registered (a position stored) before the first message: retention keeps it for them.
    wait_for(lambda: set(names) <= set(group.registered()), 60)
    victim = names[len(names) // 2]
    try:
        for seq in range(args.messages):
            stream.update({"seq": seq, "topic": TOPICS[seq % len(TOPICS)], "payload": f"reading {seq}"})
            if seq == args.messages // 2:
                wait_for(lambda: delivered(outdir, victim), 30)
                procs[victim].send_signal(signal.SIGKILL)
                procs[victim].wait()
                print(f"{victim}: killed (SIGKILL) after {len(delivered(outdir, victim))} deliveries", flush=True)
                procs[victim] = spawn(args.url, victim, outdir)
            if seq % 100 == 0:
                time.sleep(0.01)
        stream.sync()
        wait_for(lambda: all(delivered(outdir, n)[-1:] == [args.messages - 1] for n in names), 120)
    finally:
        for p in procs.values():
            p.terminate()
            p.wait()
        stream.close()
    ok = all([check(name, delivered(outdir, name), args.messages) for name in names])
    print("every consumer has every message" if ok else "a consumer missed messages")
    return 0 if ok else 1


def wait_for(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for the consumers")
        time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main())

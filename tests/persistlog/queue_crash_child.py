"""A broker process for test_queue_crashes.py, killed by SIGKILL at a random moment.

``python queue_crash_child.py URL ROUND SEED``: opens the queue at URL (restoring it:
every message not acknowledged is delivered again), then sends, receives, acknowledges
and rotates at random, forever. On stdout, one line per step, flushed before and after
each call that writes: ``S? body`` / ``S+ body id``, ``R id body`` (delivered), ``A? id`` /
``A+ id``, ``E?`` / ``E+`` (a rotation), ``X error`` if anything raises.
"""

from __future__ import annotations

import random
import sys

import persistlog


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    url, round_no, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    q = persistlog.Queue.open(url, durability="flush", rotate_bytes=24 * 1024, batch_bytes=8 * 1024)
    say("O")
    delivered: list[int] = []
    n = 0
    try:
        while True:
            step = rng.random()
            if step < 0.45:
                body = f"r{round_no}n{n}-".encode() + b"x" * rng.randrange(0, 600)
                n += 1
                say(f"S? {body.decode()}")
                mid = q.send(body)
                say(f"S+ {body.decode()} {mid}")
            elif step < 0.7:
                m = q.receive()
                if m is not None:
                    say(f"R {m.id} {m.body.decode()}")
                    delivered.append(m.id)
            elif step < 0.97:
                if delivered:
                    mid = delivered.pop(rng.randrange(len(delivered)))
                    say(f"A? {mid}")
                    q.ack(mid)
                    say(f"A+ {mid}")
            else:
                say("E?")
                q.rotate()
                say("E+")
    except BaseException as e:
        say(f"X {e!r}")
        raise


if __name__ == "__main__":
    main()

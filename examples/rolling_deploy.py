"""A stateful service replaced by new versions of itself under load, without downtime.

    python examples/rolling_deploy.py /tmp/counters --generations 3 --seconds 2

Each generation is a process running the same service: a ``ResourceStore`` of counters
opened with ``handover=True``, serving "requests" (incrementing a counter) as fast as it
can and printing each increment once it is acknowledged. The script starts generation 1,
lets it serve, then starts generation 2 beside it, and so on:

* the new generation's ``ResourceStore.open(..., handover=True)`` finds the log held and
  asks its writer to hand it over (a ``HANDOVER`` request beside the lock);
* the old generation's ``on_handover`` hook stops its request loop; its store closes with a
  fresh snapshot and lets the lock go; a request it was still serving gets ``HandedOver``
  (not acknowledged, not counted) once the log is sealed;
* the new generation restores that snapshot (no enumeration) and serves.

At the end the script restores the counters and checks that they equal the acknowledged
increments of every generation: nothing acknowledged lost, nothing counted twice. Each
generation reports how long its open took, from the request to being ready to serve.

Run with ``--serve NAME`` it is one generation (what the script starts).
"""

from __future__ import annotations

import argparse
import collections
import random
import subprocess
import sys
import threading
import time

import persistlog

KEYS = 50


def serve(url: str, name: str, seconds: float) -> None:
    """One generation: take the log (over from a live one, if any), serve until handed over
    or ``seconds`` have passed, print each acknowledged increment."""
    stop = threading.Event()
    asked = time.monotonic()
    store = persistlog.ResourceStore.open(url, durability="flush", handover=True, on_handover=stop.set)
    print(f"ready {name} {time.monotonic() - asked:.3f}", flush=True)
    rnd = random.Random(name)
    deadline = time.monotonic() + seconds
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            key = f"c{rnd.randrange(KEYS)}"
            store[key] = store.get(key, 0) + 1  # logged, then applied; returns once written
            print(f"ack {key}", flush=True)
    except persistlog.HandedOver as e:
        print(f"handed over to {e.to}", flush=True)
    store.close()  # after a handover: nothing left to do
    print("stopped", flush=True)


def deploy(url: str, generations: int, seconds: float) -> int:
    """Start ``generations`` services one after another, each replacing the last while it
    serves; then check the counters against every acknowledged increment."""
    acked: collections.Counter[str] = collections.Counter()
    procs: list[subprocess.Popen[str]] = []
    readers: list[threading.Thread] = []
    lock = threading.Lock()
    opened: dict[str, float] = {}

    def read(name: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            word, *rest = line.split()
            with lock:
                if word == "ack":
                    acked[rest[0]] += 1
                elif word == "ready":
                    opened[name] = float(rest[1])
                    print(f"generation {name}: ready {float(rest[1]) * 1000:.0f} ms after asking")

    for g in range(1, generations + 1):
        name = str(g)
        proc = subprocess.Popen([sys.executable, __file__, url, "--serve", name, "--seconds", str(seconds * 2)],
                                stdout=subprocess.PIPE, text=True)
        reader = threading.Thread(target=read, args=(name, proc))
        reader.start()
        procs.append(proc)
        readers.append(reader)
        while name not in opened and proc.poll() is None:
            time.sleep(0.01)
        if g < generations:
            time.sleep(seconds)  # serve a while, then the next version takes over
    for proc in procs:
        if proc.wait(120) != 0:
            print(f"a generation exited with {proc.returncode}", file=sys.stderr)
            return 1
    for reader in readers:
        reader.join()
    counters: dict[str, int] = {}
    persistlog.restore(url, replay=lambda r: counters.__setitem__(r["key"], r["value"]), missing_ok=False)
    lost = {k: n - counters.get(k, 0) for k, n in acked.items() if counters.get(k, 0) < n}
    extra = {k: v - acked.get(k, 0) for k, v in counters.items() if v > acked.get(k, 0)}
    print(f"{sum(acked.values())} acknowledged increments over {generations} generations; "
          f"lost {sum(lost.values())}, counted twice {sum(extra.values())}")
    return 0 if not lost and not extra else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="where the log lives (a directory, or an fsspec URL)")
    parser.add_argument("--generations", type=int, default=3, help="how many versions serve in turn (default 3)")
    parser.add_argument("--seconds", type=float, default=2.0, help="how long each serves before the next (default 2)")
    parser.add_argument("--serve", metavar="NAME", help="run one generation (what the script starts)")
    args = parser.parse_args()
    if args.generations < 1 or args.seconds <= 0:
        parser.error("--generations must be >= 1 and --seconds > 0")
    if args.serve is not None:
        serve(args.url, args.serve, args.seconds)
        return 0
    return deploy(args.url, args.generations, args.seconds)


if __name__ == "__main__":
    sys.exit(main())

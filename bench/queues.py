"""Many durable queues: one ``persistlog.Queue`` per recipient in a ``LogSet``, against one
shared log for every queue whose pending messages stay in memory.

A message broker holds thousands of queues, most of them with a few messages waiting.
Each measurement runs in a child process of its own, so that its memory is its own:

1. **fill** (``--child fill``): open ``queues`` queues in a LogSet (``durability="flush"``,
   ``Queue.open_many``),
   send ``pending_mb`` MB of 2 KiB messages spread evenly over them, and read the RSS over
   the interpreter's with persistlog imported (``rss_empty`` with the queues open and
   empty, ``rss_full`` with every message pending); then run send + receive + ack
   cycles round the queues for ``seconds`` (the rate is cycles, each three calls and two
   writes); then exit without closing anything (``os._exit``: what SIGKILL leaves);
2. **restart** (``--child restart``): open every queue of the set again
   (``Queue.open_many``, 4 at a time: each restores, then writes its messages into a new
   log), time it, receive one message from each to
   show it is ready to deliver, and read the RSS;
3. **shared** (``--child shared``): the same fill and cycles with one Log for all queues
   (records ``{"q": key, ...}``) and every pending body in a dict of deques: the design
   the queues replace;
4. **memory** (``--child memory``): ``MEMORY_QUEUES`` queues with as many messages each as
   the fill gives a queue, under ``tracemalloc``: the bytes each open queue's ``Log`` holds
   (allocated under ``persistlog.open``), the bytes the queue holds itself (everything else
   its open allocated), per queue, and per pending message.

Run as a script it is one child (``--child MODE --root DIR --queues N --pending-mb M
--seconds S``), printing its figures as one JSON line; ``python bench/queues.py --queues
N`` runs every step and prints the figures without the bench table.

Each child reports the machine's load average (1 minute) at its start: the figures are
taken on a shared machine. Open logs hold no descriptor while idle (a bounded cache of
``PERSISTLOG_OPEN_FILES`` serves the ones writing), so the fill child also reports its
threads and descriptors.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from figures import Figure, at_least, at_most, info, vs_baseline
from workload import Config, Scratch

log = logging.getLogger("bench")

AREA = "queues"
MESSAGE_BYTES = 2048
#: Targets: memory over the interpreter's with every message pending, cycles per second in
#: flush mode, a restart's time until every queue can deliver, the per-queue logs' rate
#: against one shared log's.
MAX_RSS_MB = 40.0
MIN_CYCLES_PER_S = 20_000.0
MAX_RESTART_S = 10.0
MIN_VS_SHARED = 0.5
#: Queues of the tracemalloc child (the split per queue and per message does not depend
#: on the count; tracemalloc makes each allocation slower).
MEMORY_QUEUES = 1000
#: Threads ``Queue.open_many`` opens with at the restart (its default).
OPEN_THREADS = None


def rss_mb() -> float:
    """This process's resident set, MB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def keys(n: int) -> list[str]:
    return [f"q{i:06d}" for i in range(n)]


def spread(pending_mb: float, names: list[str], send: Callable[[str], Any]) -> int:
    """Send ``pending_mb`` MB of messages round the queues ``names`` (each gets the same
    number, give or take one); returns how many."""
    total = max(len(names), round(pending_mb * 1e6 / MESSAGE_BYTES))
    for i in range(total):
        send(names[i % len(names)])
    return total


def _cycles(send: Callable[[str, bytes], None], take: Callable[[str], None], names: list[str], seconds: float) -> dict[str, Any]:
    """Send to a queue, then receive and acknowledge its oldest message, round the queues."""
    done = 0
    cpu = time.process_time()
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        for key in names[done % len(names): done % len(names) + 200]:
            send(key, os.urandom(MESSAGE_BYTES))
            take(key)
            done += 1
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    # On a shared machine the process may get a fraction of a core: CPU time per cycle
    # is the steadier figure, wall time the one a broker sees.
    return {"cycles": done, "cycle_seconds": wall, "cycles_per_s": done / wall, "cycle_cpu_seconds": cpu,
            "cycles_per_cpu_s": done / cpu if cpu else float("nan"), "cpu_share": cpu / wall}


def fill_child(root: str, n: int, pending_mb: float, seconds: float) -> dict[str, Any]:
    import persistlog

    base = rss_mb()
    load = os.getloadavg()[0]
    names = keys(n)
    started = time.perf_counter()
    logs = persistlog.LogSet(root, durability="flush")
    queues = persistlog.Queue.open_many(logs, names)
    open_s = time.perf_counter() - started
    rss_empty = rss_mb() - base
    started = time.perf_counter()
    total = spread(pending_mb, names, lambda key: queues[key].send(os.urandom(MESSAGE_BYTES)))
    fill_s = time.perf_counter() - started
    rss_full = rss_mb() - base

    def take(key: str) -> None:
        q = queues[key]
        m = q.receive()
        assert m is not None
        q.ack(m.id)

    cycles = _cycles(lambda key, b: queues[key].send(b) and None, take, names, seconds)
    return {
        "queues": n, "open_seconds": open_s, "messages": total, "pending_mb": total * MESSAGE_BYTES / 1e6,
        "fill_seconds": fill_s, "rss_base_mb": base, "rss_empty_mb": rss_empty, "rss_full_mb": rss_full, **cycles,
        "fill_load": load, "fill_fds": fds(), "fill_threads": threads(),
    }


def restart_child(root: str, n: int) -> dict[str, Any]:
    import persistlog

    base = rss_mb()
    load = os.getloadavg()[0]
    started = time.perf_counter()
    cpu = time.process_time()
    logs = persistlog.LogSet(root, durability="flush")
    opened = persistlog.Queue.open_many(logs) if OPEN_THREADS is None else persistlog.Queue.open_many(logs, threads=OPEN_THREADS)
    queues = list(opened.values())
    open_s = time.perf_counter() - started
    pending = sum(len(q) for q in queues)
    first = [q.receive() for q in queues]
    ready_s = time.perf_counter() - started
    cpu = time.process_time() - cpu
    assert all(m is not None for m in first), "a queue lost its messages"
    del first  # the messages received (a 2 KiB body each) are the bench's, not the queues'
    rss = rss_mb() - base
    logs.close()
    assert len(queues) == n, f"{len(queues)} queues found, {n} opened before"
    return {"queues": n, "restart_open_seconds": open_s, "restart_ready_seconds": ready_s,
            "restart_cpu_seconds": cpu, "restart_messages": pending, "restart_rss_mb": rss, "restart_load": load}


def shared_child(root: str, n: int, pending_mb: float, seconds: float) -> dict[str, Any]:
    import persistlog

    base = rss_mb()
    load = os.getloadavg()[0]
    pending: dict[str, collections.deque[tuple[int, bytes]]] = {k: collections.deque() for k in keys(n)}
    lg = persistlog.open(os.path.join(root, "shared"), lambda emit: None, durability="flush", rotate_bytes=None)
    next_id = 1

    def send(key: str, body: bytes) -> None:
        nonlocal next_id
        lg.update({"q": key, "op": "send", "id": next_id, "body": body})
        pending[key].append((next_id, body))
        next_id += 1

    def take(key: str) -> None:
        mid, _body = pending[key][0]
        lg.update({"q": key, "op": "ack", "id": mid})
        pending[key].popleft()

    spread(pending_mb, list(pending), lambda key: send(key, os.urandom(MESSAGE_BYTES)))
    rss_full = rss_mb() - base
    cycles = _cycles(send, take, list(pending), seconds)
    lg.close()
    return {"queues": n, "shared_rss_full_mb": rss_full, "shared_load": load,
            **{f"shared_{k}": v for k, v in cycles.items()}}


def memory_child(root: str, n: int, per_queue: int) -> dict[str, Any]:
    """Bytes per open queue (its Log's, its own) and per pending message, by tracemalloc:
    an allocation is the Log's when ``persistlog.open`` is on its stack."""
    import gc
    import tracemalloc

    import persistlog

    names = keys(n)
    logs = persistlog.LogSet(root, durability="flush")
    tracemalloc.start(64)
    queues = persistlog.Queue.open_many(logs, names, threads=1)
    gc.collect()
    opened = tracemalloc.take_snapshot()
    body = os.urandom(MESSAGE_BYTES)
    for _ in range(per_queue):
        for key in names:
            queues[key].send(body)
    gc.collect()
    full = tracemalloc.take_snapshot()
    tracemalloc.stop()

    queue_files = ("_apps/message_queue.py", "_read/record_reader.py")

    def split(snapshot: tracemalloc.Snapshot) -> tuple[int, int]:
        """(the Logs' bytes, the queues' bytes): an allocation is the Log's under
        ``persistlog.open`` or when the innermost persistlog module on its stack is not
        the queue's (a ``Log.update`` a ``send`` makes); the queue's when that module is
        ``_apps/message_queue.py`` or ``_read/record_reader.py`` (the destination its reader reads through
        included); the log set's own bookkeeping is neither."""
        log_bytes = queue_bytes = 0
        for stat in snapshot.statistics("traceback"):
            names = [f.filename for f in stat.traceback]  # oldest first
            if any(name.endswith(os.path.join("persistlog", "_api.py")) for name in names):
                log_bytes += stat.size
                continue
            ours = [name for name in names if os.sep + "persistlog" + os.sep in name]
            if not ours or ours[-1].endswith("_apps/log_set.py"):
                continue
            if ours[-1].endswith(queue_files):
                queue_bytes += stat.size
            else:
                log_bytes += stat.size
        return log_bytes, queue_bytes

    log_open, queue_open = split(opened)
    log_full, queue_full = split(full)
    messages = n * per_queue
    return {"memory_queues": n, "memory_messages": messages,
            "log_bytes_per_queue": log_open / n, "queue_bytes_per_queue": queue_open / n,
            "queue_bytes_per_message": (queue_full - queue_open) / messages,
            "log_bytes_per_message": (log_full - log_open) / messages}


def run_child(mode: str, root: str, n: int, pending_mb: float, seconds: float) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", mode, "--root", root, "--queues", str(n),
         "--pending-mb", str(pending_mb), "--seconds", str(seconds)],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the queues child ({mode}) failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def measure(root: str, n: int, pending_mb: float, seconds: float) -> dict[str, Any]:
    os.makedirs(root, exist_ok=True)
    r: dict[str, Any] = {"queues_wanted": n}
    log.info("queues: %d queues, %g MB pending, filling", n, pending_mb)
    r |= run_child("fill", os.path.join(root, "set"), n, pending_mb, seconds)
    log.info("queues: restarting %d queues", n)
    r |= run_child("restart", os.path.join(root, "set"), n, pending_mb, seconds)
    log.info("queues: one shared log for %d queues", n)
    r |= run_child("shared", root, n, pending_mb, seconds)
    m = min(n, MEMORY_QUEUES)
    log.info("queues: memory of %d queues by tracemalloc", m)
    r |= run_child("memory", os.path.join(root, "memory"), m, pending_mb * m / n, seconds)
    return r


def figures_of(r: dict[str, Any]) -> list[Figure]:
    n = r["queues"]
    where = f"{n:,} queues"
    mb = r["pending_mb"]
    return [
        at_most(f"RSS over interpreter, {where}, {mb:.0f} MB pending", AREA, round(r["rss_full_mb"], 1), MAX_RSS_MB, "MB",
                round(r["shared_rss_full_mb"], 1), "one shared log, bodies in memory", raw=r),
        info(f"  of which the open empty queues, {where}", AREA, round(r["rss_empty_mb"], 1), "MB"),
        at_least(f"send+receive+ack cycles, {where}, flush", AREA, round(r["cycles_per_s"]), MIN_CYCLES_PER_S, "/s"),
        info(f"  per CPU second (the process had {r['cpu_share']:.0%} of a core)", AREA,
             round(r["cycles_per_cpu_s"]), "/s"),
        # Against the shared log per CPU second: each child gets what share of a core the
        # machine leaves it, so the wall-clock ratio says more about the machine's load.
        vs_baseline(f"cycles per CPU second, a log per queue vs one shared log, {where}", AREA,
                    round(r["cycles_per_cpu_s"]), round(r["shared_cycles_per_cpu_s"]), "one shared log", "/s",
                    MIN_VS_SHARED),
        info("  the same by the wall clock", AREA, round(r["cycles_per_s"]), "/s",
             round(r["shared_cycles_per_s"]), f"one shared log ({r['shared_cpu_share']:.0%} of a core)"),
        at_most(f"restart until every queue delivers, {where}", AREA, round(r["restart_ready_seconds"], 2),
                MAX_RESTART_S, "s"),
        info(f"  open() per queue at restart, {where}", AREA, round(1e3 * r["restart_open_seconds"] / n, 2), "ms"),
        info(f"  RSS over interpreter after restart, {where}", AREA, round(r["restart_rss_mb"], 1), "MB"),
        info("  restart CPU seconds (all threads)", AREA, round(r["restart_cpu_seconds"], 1), "s"),
        info(f"  first open() per queue, {where}", AREA, round(1e3 * r["open_seconds"] / n, 2), "ms"),
        info(f"  threads / descriptors, {where} open", AREA, r["fill_threads"], "", r["fill_fds"], "fds"),
        info("  per open queue: its Log / the queue itself (tracemalloc)", AREA,
             round(r["log_bytes_per_queue"]), "B", round(r["queue_bytes_per_queue"]), "the queue"),
        info("  per pending message, the queue's", AREA, round(r["queue_bytes_per_message"]), "B"),
        info("  load average (1 min) at fill / restart / shared", AREA, round(r["fill_load"], 1), "",
             round(r["restart_load"], 1), f"restart; shared {r['shared_load']:.1f}"),
    ]


def many_queues(cfg: Config, s: Scratch) -> list[Figure]:
    """RSS, cycle rate and restart time of ``cfg.queues`` queues against one shared log."""
    return figures_of(measure(s.fresh("queues"), cfg.queues, cfg.queue_pending_mb, cfg.queue_seconds))


BENCHMARKS: dict[str, Callable[[Config, Scratch], Sequence[Figure]]] = {
    "many": many_queues,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", choices=["fill", "restart", "shared", "memory"], help="run as one child")
    parser.add_argument("--root", help="where the child's logs go")
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--pending-mb", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the cycles run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    logging.getLogger("persistlog").setLevel(logging.WARNING)
    if args.child == "fill":
        r = fill_child(args.root, args.queues, args.pending_mb, args.seconds)
        print(json.dumps(r), flush=True)
        os._exit(0)  # what SIGKILL leaves: nothing closed, nothing sealed
    if args.child == "restart":
        print(json.dumps(restart_child(args.root, args.queues)))
        return
    if args.child == "shared":
        print(json.dumps(shared_child(args.root, args.queues, args.pending_mb, args.seconds)))
        return
    if args.child == "memory":
        per_queue = max(1, round(args.pending_mb * 1e6 / MESSAGE_BYTES / args.queues))
        print(json.dumps(memory_child(args.root, args.queues, per_queue)))
        os._exit(0)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="queues-") as root:
        r = measure(root, args.queues, args.pending_mb, args.seconds)
    print(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()

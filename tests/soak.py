"""SIGKILL soak: a supervisor kills a busy writer process at random moments, then restores
and checks that no acknowledged update was lost (docs/DESIGN.md invariant 1), over and over.

    python tests/soak.py --iterations 200 --seconds 600 --destinations local,s3 --json soak.json

Each iteration runs a child writer on one *lane* (a primary and maybe a secondary that keep
their logs from one iteration to the next): local primary; local primary with an S3
secondary; S3 primary; S3 primary with a local secondary (S3 lanes need ``s3`` in
``--destinations``; the supervisor starts a moto server on 127.0.0.1 for them). The child
restores, opens the log with ``durability="fsync"``, fast rotations (a random record
trigger), a random ``retain``, segment size and compression, and runs several threads of
updates. After each update returns, the thread reports it to the supervisor on stdout: that
line is the acknowledgement. The supervisor SIGKILLs the child at a random moment (during
start-up, restore, the first enumeration, or while it writes and rotates), restores the
primary and each secondary, and checks, per writer thread, that the restored state is the
thread's state after a prefix of its updates holding every acknowledged one. Secondaries
are asynchronous: they must hold a prefix, not every acknowledged update, and restoring one
must never fail. How far each secondary trailed its primary at each kill (LSNs and steps of
the writer threads) is reported as percentiles.

It stops by itself after ``--iterations`` or ``--seconds`` (or, with ``--min-acknowledged``,
once that many updates were acknowledged, for twice ``--seconds`` at most) and prints the figures (and
writes them as JSON with ``--json``). Exit status 1 if any acknowledged update was lost or
any check failed.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import kv_app  # noqa: E402 - tests/, this script's directory; after the repository root

KEYS = 5  # keys per writer thread
LEASE_TTL = 1.5


# -- the update sequence of one writer thread (shared by child and supervisor) -----------------


def data_op(t: int, i: int) -> dict[str, Any]:
    """Step ``i`` (from 1) of thread ``t``: a put, or every 7th step a delete."""
    key = f"t{t}/{i % KEYS}"
    if i % 7 == 0:
        return {"op": "del", "key": key}
    return {"op": "put", "key": key, "value": value(t, i)}


def value(t: int, i: int) -> str:
    return f"{i}:" + "x" * ((i * 31 + t * 17) % 240)


def progress_key(t: int) -> str:
    return f"t{t}/n"


def expected(t: int, j: int) -> dict[str, Any]:
    """Thread ``t``'s keys after its first ``j`` steps (closed form)."""
    out: dict[str, Any] = {}
    for r in range(KEYS):
        last = j - ((j - r) % KEYS)
        if last >= 1 and last % 7 != 0:
            out[f"t{t}/{r}"] = value(t, last)
    if j:
        out[progress_key(t)] = j
    return out


def two_step(t: int) -> bool:
    """Odd threads log the data op and the progress mark as two updates; even threads as
    one ``update_many`` (which must be atomic)."""
    return t % 2 == 1


def check_thread(t: int, state: dict[str, Any]) -> tuple[int, str | None]:
    """``(j, problem)``: how many steps of thread ``t`` the state holds, and what is wrong."""
    mine = {k: v for k, v in state.items() if k.startswith(f"t{t}/")}
    j = mine.get(progress_key(t), 0)
    if not isinstance(j, int) or j < 0:
        return 0, f"thread {t}: bad progress mark {j!r}"
    if mine == expected(t, j):
        return j, None
    if two_step(t):
        # The data op of step j+1 may be durable without its progress mark.
        half = expected(t, j + 1)
        half.pop(progress_key(t))
        if j:
            half[progress_key(t)] = j
        if mine == half:
            return j, None
    return j, f"thread {t}: state is not a prefix of its updates at step {j}: {sorted(mine.items())[:6]}"


# -- the child ------------------------------------------------------------------------------


def child(spec: dict[str, Any]) -> int:
    import persistlog

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    out_lock = threading.Lock()

    def say(line: str) -> None:
        with out_lock:
            os.write(1, (line + "\n").encode())

    rng = random.Random(spec["seed"])
    so = spec.get("primary_options") or None
    state: dict[str, Any] = {}

    apply = functools.partial(kv_app.apply, state)
    persistlog.restore(spec["primary"], apply, storage_options=so)
    say("RESTORED")
    threads = spec["threads"]
    locks = [threading.Lock() for _ in range(threads)]

    def enumerate_all(emit: Any) -> None:
        for t in range(threads):
            with locks[t]:  # a thread's keys change only under its lock
                for k, v in list(state.items()):
                    if k.startswith(f"t{t}/"):
                        emit({"op": "put", "key": k, "value": v})

    secondaries = [(s["url"], s.get("options") or {}) for s in spec["secondaries"]]
    options = dict(
        durability="fsync",
        rotate_records=rng.choice([40, 150, 600]),
        retain=rng.choice([1, 2]),
        segment_bytes=rng.choice([4096, 16384, 65536]),
        compression=rng.choice([None, None, "gzip", "zstd"]),
        lease_ttl=LEASE_TTL,
        storage_options=so,
        secondaries=secondaries or None,
    )
    deadline = time.monotonic() + 6 * LEASE_TTL + 5
    while True:
        try:
            lg = persistlog.open(spec["primary"], enumerate_all, **options)
            break
        except persistlog.WriterConflict:
            # A killed writer's S3 lease outlives it by up to its TTL.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    say("READY")

    def writer(t: int) -> None:
        i = state.get(progress_key(t), 0)
        try:
            while True:
                i += 1
                op = data_op(t, i)
                mark = {"op": "put", "key": progress_key(t), "value": i}
                with locks[t]:
                    if two_step(t):
                        lg.update(op)
                        apply(op)
                        lg.update(mark)
                    else:
                        lg.update_many([op, mark])
                        apply(op)
                    apply(mark)
                say(f"A {t} {i}")
        except BaseException as e:  # noqa: BLE001 - reported to the supervisor
            say(f"E {t} {type(e).__name__}: {e}".replace("\n", " "))
            os._exit(3)

    for t in range(threads):
        threading.Thread(target=writer, args=(t,), daemon=True).start()
    time.sleep(spec["max_life"])
    lg.close()
    say("CLOSED")
    return 0


# -- the supervisor ---------------------------------------------------------------------------


@dataclass
class Lane:
    name: str
    primary: str
    primary_options: dict[str, Any] = field(default_factory=dict)
    secondaries: list[dict[str, Any]] = field(default_factory=list)
    acked: dict[int, int] = field(default_factory=dict)  # thread -> highest acknowledged step
    iterations: int = 0


@dataclass
class Figures:
    iterations: int = 0
    seconds: float = 0.0
    destinations: list[str] = field(default_factory=list)
    threads: int = 0
    kills: int = 0
    kills_before_ready: int = 0
    clean_exits: int = 0
    updates_acknowledged: int = 0
    updates_lost: int = 0
    restores_checked: int = 0
    secondary_restores_checked: int = 0
    secondary_restore_errors: int = 0
    #: Per kill and secondary: LSNs (records) the secondary's restore trails the primary's.
    secondary_lag_records: list[int] = field(default_factory=list)
    #: ... and writer-thread steps (acknowledged update calls) it trails by.
    secondary_lag_steps: list[int] = field(default_factory=list)
    check_failures: int = 0
    child_errors: int = 0
    lanes: dict[str, int] = field(default_factory=dict)
    lane_kills: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.updates_lost == 0 and self.check_failures == 0 and self.child_errors == 0
                and self.secondary_restore_errors == 0)

    def lag_summary(self) -> dict[str, Any]:
        return {"records": percentiles(self.secondary_lag_records), "steps": percentiles(self.secondary_lag_steps)}


def percentiles(values: list[int]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def at(q: float) -> int:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"n": len(ordered), "p50": at(0.50), "p99": at(0.99), "max": ordered[-1],
            "zero": sum(1 for v in ordered if v == 0)}


class MotoServer:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": self.endpoint}}

    def bucket(self) -> str:
        import fsspec

        name = f"soak-{uuid.uuid4().hex[:12]}"
        fsspec.filesystem("s3", **self.options, skip_instance_cache=True).call_s3("create_bucket", Bucket=name)
        return name

    def stop(self) -> None:
        self.server.stop()


def make_lanes(kinds: list[str], root: str, moto: MotoServer | None) -> list[Lane]:
    lanes = []
    if "local" in kinds:
        lanes.append(Lane("local", os.path.join(root, "local")))
    if moto is not None:
        bucket = moto.bucket()
        if "local" in kinds:
            lanes.append(Lane("local+s3", os.path.join(root, "local-s3"),
                              secondaries=[{"url": f"s3://{bucket}/secondary", "options": moto.options}]))
            lanes.append(Lane("s3+local", f"s3://{bucket}/primary", dict(moto.options),
                              secondaries=[{"url": os.path.join(root, "s3-local"), "options": {}}]))
        lanes.append(Lane("s3", f"s3://{bucket}/alone", dict(moto.options)))
    if not lanes:
        raise SystemExit("no destinations: use --destinations local,s3")
    return lanes


def run_iteration(lane: Lane, figures: Figures, rng: random.Random, threads: int, log_file: Any) -> str:
    """One child, killed; then the checks. Returns a one-line account."""
    spec = {
        "primary": lane.primary,
        "primary_options": lane.primary_options,
        "secondaries": lane.secondaries,
        "threads": threads,
        "seed": rng.randrange(1 << 30),
        "max_life": 20.0,
    }
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
        stdout=subprocess.PIPE, stderr=log_file, env=env,
    )
    lines: list[str] = []
    ready = threading.Event()
    ready_at: list[float] = []
    acks = 0

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            lines.append(line)
            if line == "READY":
                ready_at.append(time.monotonic())
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    spawned = time.monotonic()
    if rng.random() < 0.25:
        # Anywhere in start-up: imports, restore, lease, the first enumeration.
        kill_after = rng.uniform(0.0, 1.5)
        deadline = time.monotonic() + kill_after
    else:
        ready.wait(60)
        deadline = time.monotonic() + rng.uniform(0.0, 1.2)
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    was_ready = "READY" in lines
    killed_at = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        figures.kills += 1
        figures.lane_kills[lane.name] = figures.lane_kills.get(lane.name, 0) + 1
        figures.kills_before_ready += not was_ready
    else:
        figures.clean_exits += 1
    proc.wait()
    reader.join(30)
    for line in lines:
        parts = line.split(" ", 2)
        if parts[0] == "A" and len(parts) == 3 and parts[2].isdigit():
            t, i = int(parts[1]), int(parts[2])
            figures.updates_acknowledged += 1
            acks += 1
            lane.acked[t] = max(lane.acked.get(t, 0), i)
        elif parts[0] == "E":
            figures.child_errors += 1
            figures.problems.append(f"{lane.name}: child error: {line[:300]}")
    if proc.returncode not in (0, -signal.SIGKILL):
        figures.child_errors += 1
        figures.problems.append(f"{lane.name}: child exited with {proc.returncode}")
    check_lane(lane, figures, threads, clean=proc.returncode == 0 and "CLOSED" in lines)
    when = f"ready after {ready_at[0] - spawned:.2f}s, killed {killed_at - ready_at[0]:.2f}s later" \
        if ready_at and ready_at[0] <= killed_at else f"killed {killed_at - spawned:.2f}s after start, before ready"
    return f"{acks} acknowledged ({when})"


def check_lane(lane: Lane, figures: Figures, threads: int, clean: bool = False) -> None:
    import persistlog

    try:
        state, presult = kv_app.restore_state(lane.primary, storage_options=lane.primary_options or None)
    except persistlog.PersistLogError as e:
        figures.check_failures += 1
        figures.problems.append(f"{lane.name}: restore of the primary failed: {type(e).__name__}: {e}")
        return
    figures.restores_checked += 1
    steps = {}
    for t in range(threads):
        j, problem = check_thread(t, state)
        steps[t] = j
        if problem:
            figures.check_failures += 1
            figures.problems.append(f"{lane.name}: primary: {problem}")
        acked = lane.acked.get(t, 0)
        if j < acked:
            figures.updates_lost += acked - j
            figures.problems.append(f"{lane.name}: thread {t}: restored step {j} < acknowledged {acked}")
    for sec in lane.secondaries:
        try:
            sstate, sresult = kv_app.restore_state(sec["url"], storage_options=sec.get("options") or None)
        except persistlog.PersistLogError as e:
            # A secondary may trail its primary, never fail to restore.
            figures.secondary_restore_errors += 1
            if len(figures.problems) < 200:
                figures.problems.append(f"{lane.name}: secondary restore: {type(e).__name__}: {e}"[:300])
            continue
        figures.secondary_restores_checked += 1
        figures.secondary_lag_records.append(presult.last_lsn - sresult.last_lsn)
        behind = 0
        for t in range(threads):
            sj, problem = check_thread(t, sstate)
            behind += max(0, steps[t] - sj)
            if problem:
                figures.check_failures += 1
                figures.problems.append(f"{lane.name}: secondary: {problem}")
        figures.secondary_lag_steps.append(behind)
        if clean and sstate != state:
            # After a clean close() a secondary holds exactly the primary's state.
            figures.check_failures += 1
            figures.problems.append(f"{lane.name}: secondary differs from the primary after a clean close")


def supervise(args: argparse.Namespace) -> Figures:
    kinds = [k.strip() for k in args.destinations.split(",") if k.strip()]
    unknown = set(kinds) - {"local", "s3"}
    if unknown:
        raise SystemExit(f"unknown destinations {sorted(unknown)}: use local and/or s3")
    figures = Figures(destinations=kinds, threads=args.threads)
    rng = random.Random(args.seed)
    root = args.workdir or tempfile.mkdtemp(prefix="pl-soak-")
    os.makedirs(root, exist_ok=True)
    moto = MotoServer() if "s3" in kinds else None
    started = time.monotonic()
    try:
        lanes = make_lanes(kinds, root, moto)
        if args.lanes:
            wanted = {n.strip() for n in args.lanes.split(",") if n.strip()}
            unknown_lanes = wanted - {lane.name for lane in lanes}
            if unknown_lanes:
                raise SystemExit(f"unknown lanes {sorted(unknown_lanes)} for --destinations {args.destinations}")
            lanes = [lane for lane in lanes if lane.name in wanted]
        with open(os.path.join(root, "children.log"), "ab") as log_file:
            def more() -> bool:
                # --seconds, then on (at most --seconds again) until --min-acknowledged: a
                # busy machine slows the writers, and the run must still test something.
                elapsed = time.monotonic() - started
                if figures.iterations >= args.iterations or elapsed >= 2 * args.seconds:
                    return False
                return elapsed < args.seconds or figures.updates_acknowledged < args.min_acknowledged

            while more():
                lane = lanes[figures.iterations % len(lanes)]
                account = run_iteration(lane, figures, rng, args.threads, log_file)
                figures.iterations += 1
                lane.iterations += 1
                figures.lanes[lane.name] = lane.iterations
                if not args.quiet:
                    print(f"[{figures.iterations}] {lane.name}: {account}; total acknowledged "
                          f"{figures.updates_acknowledged}, lost {figures.updates_lost}, "
                          f"failures {figures.check_failures}", flush=True)
    finally:
        figures.seconds = round(time.monotonic() - started, 1)
        if moto is not None:
            moto.stop()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--min-acknowledged", type=int, default=0,
                        help="past --seconds, go on (for --seconds more at most) until this many updates were acknowledged")
    parser.add_argument("--destinations", default="local,s3", help="comma-separated: local, s3")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--lanes", help="comma-separated lane names to run (default: all of the destinations')")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--workdir", help="keep the logs here (default: a temporary directory)")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(json.loads(args.child))
    figures = supervise(args)
    summary = {**asdict(figures), "ok": figures.ok, "secondary_lag": figures.lag_summary()}
    del summary["secondary_lag_records"], summary["secondary_lag_steps"]
    summary["problems"] = figures.problems[:50]
    print(json.dumps({k: v for k, v in summary.items() if k != "problems"}, indent=2))
    for p in figures.problems[:20]:
        print("PROBLEM:", p)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if figures.ok else 1


if __name__ == "__main__":
    sys.exit(main())

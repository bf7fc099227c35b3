"""The systematic layer's engine: a deterministic workload, the update model, the prefix
check (docs/DESIGN.md invariant 1) and the crash-point matrix built on ``tests/crashsim.py``.

The matrix works in two passes, as LevelDB's fault_injection_test and the ALICE study do:

1. run the workload once through a *recording* :class:`~crashsim.CrashSim`: it lists every
   failpoint passed, as ``(label, point, occurrence)``;
2. for each of them, run the workload again from an empty destination with a crash armed
   at exactly that step, stop the dead Log, optionally apply a power loss, restore through
   the plain driver and check that the state is the model's state after a prefix of the
   update sequence containing every acknowledged update. Then open a new writer on what
   survived, log one more update, close, and check the restore again (the next writer must
   continue the chain).

Everything here is deterministic for a given configuration: explicit ``rotate()`` calls (no
size triggers), a flush interval of an hour (no background flushes), one updating thread.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTS)
# The repository root first (tests/destinations must not shadow the destinations package),
# tests/ last (for the crashsim and faults helper modules).
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if TESTS not in sys.path:
    sys.path.append(TESTS)

import crashsim  # noqa: E402
from crashsim import CrashSim, SimulatedCrash  # noqa: E402
from kv_app import App, prefix_states, restore_state  # noqa: E402

import persistlog  # noqa: E402
from persistlog._write.log import parts_of  # noqa: E402

POWER_MODES = ("process", "drop", "zeros", "partial")

# Padding so that a few updates fill a 4 KiB segment and segments roll over.
PAD = "x" * 150


# -- the model -----------------------------------------------------------------------------


@dataclass
class Model:
    """The update sequence as the app attempted it, and how much of it was acknowledged."""

    base: dict[Any, Any] = field(default_factory=dict)
    ops: list[tuple[Any, ...]] = field(default_factory=list)
    acked: int = 0  # ops[:acked] were acknowledged as durable

    def states(self) -> list[dict[Any, Any]]:
        return prefix_states(self.base, self.ops)

    def matching_prefixes(self, state: dict[Any, Any]) -> list[int]:
        return [k for k, s in enumerate(self.states()) if s == state]


def check_prefix(model: Model, state: dict[Any, Any], *, need_acked: bool = True) -> str | None:
    """None if ``state`` is the model after a prefix holding every acknowledged update."""
    ks = model.matching_prefixes(state)
    if not ks:
        return (f"restored state is no prefix of the update sequence "
                f"({len(model.ops)} ops, {model.acked} acked): {_short(state)}")
    if need_acked and max(ks) < model.acked:
        return f"lost acknowledged updates: restored prefix {max(ks)} < {model.acked} acknowledged"
    return None


def _short(state: dict[Any, Any]) -> str:
    text = repr(dict(sorted(state.items(), key=repr)))
    return text if len(text) < 300 else text[:300] + "..."


# -- configurations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One shape of the workload."""

    name: str
    durability: str = "fsync"  # "fsync", or "buffered" with explicit syncs
    remote: bool = False  # primary on memory:// (object-store PUTs) instead of a local dir
    secondary: bool = False  # a local secondary destination as well
    remote_secondary: bool = False  # ... on memory:// (object-store PUTs and a lease)
    compression: str | None = None
    rounds: int = 2  # writer sessions (close + reopen between them)
    updates: int = 14  # updates per phase (three phases per session)

    def open_options(self) -> dict[str, Any]:
        return dict(
            durability=self.durability,
            segment_bytes=4096,
            batch_bytes=1 << 20,
            rotate_bytes=None,
            retain=1,
            flush_interval=3600.0,
            compression=self.compression,
        )


CONFIGS = {
    "local-fsync": Config("local-fsync"),
    "local-buffered": Config("local-buffered", durability="buffered"),
    "local-gzip-secondary": Config("local-gzip-secondary", secondary=True, compression="gzip", updates=10),
    "memory-fsync": Config("memory-fsync", remote=True, updates=10),
    "local-memory-secondary": Config("local-memory-secondary", secondary=True, remote_secondary=True, updates=8),
}


class Site:
    """Where one run writes: fresh directories (and a fresh memory:// prefix)."""

    def __init__(self, config: Config, root: str) -> None:
        self.config = config
        self.root = root
        os.makedirs(root, exist_ok=True)
        self.primary = os.path.join(root, "primary")
        self.secondary = os.path.join(root, "secondary")
        self.memory = f"memory://crashsim-{uuid.uuid4().hex[:12]}/log"
        self.secondary_memory = f"memory://crashsim-{uuid.uuid4().hex[:12]}/secondary"

    @property
    def plain_primary(self) -> str:
        return self.memory if self.config.remote else self.primary

    @property
    def plain_secondary(self) -> str | None:
        if not self.config.secondary:
            return None
        return self.secondary_memory if self.config.remote_secondary else self.secondary

    def secondary_exists(self) -> bool:
        url = self.plain_secondary
        if url is None:
            return False
        from destinations import open_destination

        return open_destination(url).exists()

    def urls(self, sim: CrashSim) -> tuple[str, dict[str, Any], list[tuple[str, dict[str, Any]]]]:
        if self.config.remote:
            url, opts = sim.remote(self.memory, label="primary")
        else:
            url, opts = sim.local(self.primary, label="primary")
        secondaries = []
        if self.config.remote_secondary:
            secondaries.append(sim.remote(self.secondary_memory, label="secondary"))
        elif self.config.secondary:
            secondaries.append(sim.local(self.secondary, label="secondary"))
        return url, opts, secondaries

    def after_crash(self) -> None:
        """What the world does to a dead writer: a local flock dies with it; an object-store
        lease expires (here: at once, by deleting it; the soak waits for real expiry)."""
        from destinations import open_destination

        for url, remote in ((self.memory, self.config.remote), (self.secondary_memory, self.config.remote_secondary)):
            if remote:
                open_destination(url).delete("LEASE")

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        from fsspec.implementations.memory import MemoryFileSystem

        for url, remote in ((self.memory, self.config.remote), (self.secondary_memory, self.config.remote_secondary)):
            if not remote:
                continue
            prefix = url.split("://", 1)[1]
            for key in [k for k in MemoryFileSystem.store if k.lstrip("/").startswith(prefix)]:
                MemoryFileSystem.store.pop(key, None)
            MemoryFileSystem.pseudo_dirs[:] = [
                d for d in MemoryFileSystem.pseudo_dirs if not d.lstrip("/").startswith(prefix.split("/")[0])
            ] or [""]


# -- the workload -----------------------------------------------------------------------------


def run_workload(config: Config, sim: CrashSim, site: Site, model: Model, app: App) -> None:
    """Sessions of updates, syncs, rotations (with retention at retain=1) and closes.

    ``model`` records every op before it is attempted and the acknowledgements as they
    happen; an exception (the simulated crash) leaves it exactly as far as the app got.
    """
    url, opts, secondaries = site.urls(sim)
    options = config.open_options()
    fsync = config.durability == "fsync"
    n = config.updates
    counter = len(model.ops)

    def put(key: str, sync: bool = False) -> None:
        nonlocal counter
        counter += 1
        value = f"{counter}:{PAD}"
        model.ops.append(("put", key, value))
        assert app.log is not None
        with app._lock(key):
            app.log.update({"op": "put", "key": key, "value": value}, sync=sync)
            app.data[key] = value
        if fsync or sync:
            model.acked = len(model.ops)

    def delete(key: str) -> None:
        model.ops.append(("del", key))
        assert app.log is not None
        with app._lock(key):
            app.log.update({"op": "del", "key": key})
            app.data.pop(key, None)
        if fsync:
            model.acked = len(model.ops)

    def put_many(keys: list[str]) -> None:
        nonlocal counter
        recs = []
        for key in keys:
            counter += 1
            model.ops.append(("put", key, counter))
            recs.append({"op": "put", "key": key, "value": counter})
        assert app.log is not None
        app.log.update_many(recs)
        for r in recs:
            app.data[r["key"]] = r["value"]
        if fsync:
            model.acked = len(model.ops)

    def phase(tag: str) -> None:
        for i in range(n):
            key = f"k{(i * 7 + len(tag)) % 9}"
            if i % 6 == 5:
                delete(key)
            elif i % 5 == 4:
                put_many([f"m{i % 4}", key])
            else:
                # Values grow so that segments roll over within a phase.
                put(key, sync=(not fsync and i % 4 == 3))
            if not fsync and i == n // 2:
                assert app.log is not None
                app.log.sync()
                model.acked = len(model.ops)

    for session in range(config.rounds):
        app.open(url, storage_options=opts, secondaries=secondaries or None, **options)
        assert app.log is not None
        model.acked = len(model.ops)  # open returns with a complete log holding the state
        phase(f"a{session}")
        rotate(app.log, sim)
        model.acked = len(model.ops)
        wait_idle(app.log)
        phase(f"bb{session}")
        rotate(app.log, sim)
        model.acked = len(model.ops)
        wait_idle(app.log)
        phase(f"ccc{session}")
        app.log.close()
        model.acked = len(model.ops)
        app.log = None


def rotate(lg: persistlog.Log, sim: CrashSim) -> int:
    """``lg.rotate()``, except that a simulated dead process never waits for it.

    A crash on the rotation thread (in retention, say) ends that thread; in a real process
    the app's threads would be dead too, but here the app's thread goes on and would wait
    for a rotation nobody will run.
    """
    parts = parts_of(lg)
    parts.writer.check()
    fut = parts.rotator.request(coalesce=False)
    while True:
        try:
            return fut.result(0.05)
        except TimeoutError:
            if sim.frozen:
                raise SimulatedCrash("the rotation thread died with the process") from None


def wait_idle(lg: persistlog.Log, timeout: float = 30.0) -> None:
    """Wait until the rotation thread (and the retention it runs after a rotation) is idle,
    so the I/O sequence of the workload is the same on every run."""
    r = parts_of(lg).rotator
    deadline = time.monotonic() + timeout
    while not r.idle():
        if time.monotonic() > deadline:
            raise TimeoutError("rotation thread did not go idle")
        time.sleep(0.005)


# -- the matrix -------------------------------------------------------------------------------


@dataclass
class CrashOutcome:
    label: str
    point: str
    occurrence: int
    power: str
    reached: bool = False
    acked: int = 0
    attempted: int = 0
    restored_prefix: int | None = None
    error: str | None = None
    seconds: float = 0.0


def record_points(config: Config, workdir: str) -> list[tuple[str, str, int]]:
    """Every failpoint the workload passes, in order."""
    site = Site(config, os.path.join(workdir, f"record-{uuid.uuid4().hex[:8]}"))
    try:
        sim = CrashSim()
        model, app = Model(), App()
        run_workload(config, sim, site, model, app)
        return list(sim.points)
    finally:
        site.cleanup()


def crash_once(config: Config, label: str, point: str, occurrence: int, power: str,
               workdir: str) -> CrashOutcome:
    """Crash the workload at one failpoint, restore, check; then reopen and check again."""
    started = time.monotonic()
    out = CrashOutcome(label, point, occurrence, power)
    site = Site(config, os.path.join(workdir, f"crash-{uuid.uuid4().hex[:8]}"))
    sim = CrashSim(record=False, seed=occurrence)
    sim.crash_at(point, nth=occurrence, label=label)
    model, app = Model(), App()
    try:
        with crashsim.quiet_crash_threads():
            try:
                run_workload(config, sim, site, model, app)
            except BaseException as e:  # noqa: BLE001 - the simulated crash, however wrapped
                if not sim.frozen:
                    out.error = f"workload failed without a crash: {e!r}"
                    return out
            out.reached = sim.crashed_at is not None
            if app.log is not None:
                sim.abandon(app.log)
            else:
                sim.crash()
            if not out.reached:
                return out
            if power != "process" and not config.remote:
                sim.power_loss(power)
        site.after_crash()
        out.acked, out.attempted = model.acked, len(model.ops)
        out.error = _check_site(config, site, model, out)
    except Exception as e:  # noqa: BLE001 - reported as the outcome's error
        out.error = f"{type(e).__name__}: {e}"
    finally:
        out.seconds = time.monotonic() - started
        site.cleanup()
    return out


def _check_site(config: Config, site: Site, model: Model, out: CrashOutcome) -> str | None:
    try:
        state, _result = restore_state(site.plain_primary)
    except persistlog.PersistLogError as e:
        return f"restore after the crash raised {type(e).__name__}: {e}"
    problem = check_prefix(model, state)
    if problem:
        return problem
    ks = model.matching_prefixes(state)
    out.restored_prefix = max(ks)
    secondary = site.plain_secondary if site.secondary_exists() else None
    if secondary is not None:
        try:
            sstate, _ = restore_state(secondary)
        except persistlog.PersistLogError as e:
            return f"restore of the secondary raised {type(e).__name__}: {e}"
        problem = check_prefix(model, sstate, need_acked=False)
        if problem:
            return "secondary: " + problem
    if secondary is not None:
        problem = _restart_dying_in_enumeration(site, secondary, model, state)
        if problem:
            return problem
    # A new writer continues from what survived, on the same secondary.
    state, _ = restore_state(site.plain_primary)
    app = App(state)
    try:
        lg = app.open(site.plain_primary, durability="fsync", segment_bytes=4096, retain=1,
                      secondaries=[secondary] if secondary is not None else None)
        lg.update({"op": "put", "key": "after-crash", "value": -1})
        lg.close()
    except persistlog.PersistLogError as e:
        return f"reopening after the crash raised {type(e).__name__}: {e}"
    expected = dict(state)
    expected["after-crash"] = -1
    for where, url in (("", site.plain_primary), (" of the secondary", secondary)):
        if url is None:
            continue
        try:
            again, _ = restore_state(url)
        except persistlog.PersistLogError as e:
            return f"restore{where} after the reopen raised {type(e).__name__}: {e}"
        if again != expected:
            # A clean close leaves the secondary with exactly the primary's state.
            return f"after reopen + 1 update the restore{where} differs: {_short(again)} != {_short(expected)}"
    return None


def _restart_dying_in_enumeration(site: Site, secondary: str, model: Model, state: dict[Any, Any]) -> str | None:
    """A restarted writer whose first enumeration fails (as if it died there) leaves a new,
    incomplete log on the secondary, which may not continue what the crash left there:
    restoring the secondary must still give a prefix, and the primary what it held."""
    app = App(state)

    def dies(emit: Callable[[Any], None]) -> None:
        app.enumerate_all(emit)
        raise RuntimeError("the restarted writer died in its first enumeration")

    try:
        persistlog.open(site.plain_primary, dies, durability="fsync", segment_bytes=4096, retain=1,
                        secondaries=[secondary])
        return "the failing enumeration did not fail open()"
    except persistlog.EnumerateError:
        pass
    for where, url in (("", site.plain_primary), (" of the secondary", secondary)):
        try:
            got, _ = restore_state(url)
        except persistlog.PersistLogError as e:
            return f"restore{where} after a restart that died raised {type(e).__name__}: {e}"
        problem = check_prefix(model, got, need_acked=not where)
        if problem:
            return f"after a restart that died{where}: {problem}"
    return None


def new_workdir() -> str:
    return tempfile.mkdtemp(prefix="pl-reliability-")


def select_points(points: list[tuple[str, str, int]], budget: int | None) -> list[tuple[str, str, int]]:
    """All points if ``budget`` is None or enough; else every point of the rare operations
    (create, replace, delete, put, lock) and an evenly spaced sample of the appends."""
    if budget is None or len(points) <= budget:
        return list(points)
    rare = [p for p in points if ":append." not in p[1]]
    common = [p for p in points if ":append." in p[1]]
    room = max(budget - len(rare), 0)
    if room == 0:
        return rare
    step = len(common) / room
    sample = [common[int(i * step)] for i in range(room)]
    return sorted(rare + sample, key=points.index)


@dataclass
class MatrixFigures:
    config: str
    points: int = 0  # distinct failpoints the workload passes
    runs: int = 0  # crash runs made (points x power modes tried)
    covered: int = 0  # distinct points crashed at
    reached: int = 0
    acked: int = 0  # acknowledged updates summed over the runs
    lost: int = 0  # runs that lost an acknowledged update
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    by_point: dict[str, int] = field(default_factory=dict)


def run_matrix(config: Config, *, budget: int | None, all_modes: bool, workdir: str) -> MatrixFigures:
    """Crash the workload at (a sample of) its failpoints; see the module docstring."""
    started = time.monotonic()
    points = record_points(config, workdir)
    chosen = select_points(points, budget)
    modes = ("process",) if config.remote else POWER_MODES
    figures = MatrixFigures(config.name, points=len(points), covered=len(chosen))
    for i, (label, point, occurrence) in enumerate(chosen):
        for power in (modes if all_modes else (modes[i % len(modes)],)):
            out = crash_once(config, label, point, occurrence, power, workdir)
            figures.runs += 1
            figures.reached += out.reached
            figures.acked += out.acked
            key = f"{label} {point}"
            figures.by_point[key] = figures.by_point.get(key, 0) + 1
            if not out.reached:
                figures.failures.append(f"{label} {point} #{occurrence}: not reached on the rerun")
            elif out.error:
                if "lost acknowledged" in out.error:
                    figures.lost += 1
                figures.failures.append(f"{label} {point} #{occurrence} ({power}): {out.error}")
    figures.seconds = round(time.monotonic() - started, 2)
    return figures

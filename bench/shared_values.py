"""A broker's snapshot whose subscribers share payloads: values stored once per log.

A message broker persists its whole state at each snapshot: ``subscribers`` clients, each
with a queue of pending messages, where one message published to a topic is queued for
every subscriber of that topic (``payloads`` distinct bodies of 100 B to 2.5 KB, about 1.3
KB on average, ``entries`` queued entries in all; smaller messages are queued more often).
The app logs one record per subscriber, its queue included, as it holds it: the app does
nothing to deduplicate.

Each contender writes the same state, in this process, round-robin (``repeats``):

- ``ResourceStore.close(rotate=True)`` with ``compression`` gzip and zstd, with shared
  values (format version 3, the default) and without (``share_values=False``, format
  version 2: what persistlog wrote before); the newest log's bytes on disk, CPU and wall
  time of the close (the enumeration, framing, compression, writing, the seal);
- the broker's own design as its reference: payloads moved into a table, references in
  the state, transient packet identifiers dropped, one CBOR stream through gzip (level 6)
  into one file.

Shapes: ``flat`` (``{"topic", "qos", "payload"}`` per entry), ``nested`` (the payload
three maps down, beside a header map), ``wide`` (a packet identifier and twenty small
fields beside the payload). Each shape's restore is checked equal to the state.
"""

from __future__ import annotations

import gzip
import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any

import cbor2

import persistlog

from figures import Figure, at_most, info
from workload import Config, Scratch, dir_bytes

log = logging.getLogger("bench")

AREA = "shared"
#: Targets: the newest log's bytes and the close's time (CPU seconds of this process, all
#: its threads: the steadier figure on a shared machine; wall time beside it), flat shape,
#: gzip.
MAX_MB = 1.0
MAX_CLOSE_S = 1.0
SUBSCRIBERS = 1000
PAYLOADS = 2000
ENTRIES = 99_295
WORDS = ("temp", "humidity", "pressure", "battery", "status", "alarm", "level", "door", "fan", "mode")
SHAPES = ("flat", "nested", "wide")


def payload_bodies(rng: random.Random, n: int) -> list[bytes]:
    """``n`` JSON telemetry bodies of 100 B to 2.5 KB."""
    bodies = []
    for i in range(n):
        size = rng.randrange(100, 2500)
        parts = [f'"device": "dev-{i % 500:04d}"', f'"seq": {i}']
        while sum(map(len, parts)) + 2 * len(parts) < size:
            w = rng.choice(WORDS)
            parts.append(f"\"{w}_{rng.randrange(4)}\": {round(rng.gauss(20, 4), 1)}")
        bodies.append(("{" + ", ".join(parts) + "}").encode()[:size])
    return bodies


def entry(shape: str, topic: str, k: int, body: bytes) -> dict[str, Any]:
    """A queued message (no packet identifier: one is given at delivery, transient);
    ``wide`` adds one and twenty small fields."""
    if shape == "nested":
        return {"header": {"topic": topic, "qos": 1}, "message": {"envelope": {"retain": False, "payload": body}}}
    if shape == "wide":
        fields: dict[str, Any] = {f"f{j}": (k * 31 + j) % 1000 for j in range(20)}
        return {"topic": topic, "qos": 1, "packet": k, **fields, "payload": body}
    return {"topic": topic, "qos": 1, "payload": body}


def broker_state(shape: str = "flat", subscribers: int = SUBSCRIBERS, payloads: int = PAYLOADS,
                 entries: int = ENTRIES, seed: int = 0) -> dict[str, Any]:
    """The broker's state: client id -> its subscriptions and queue."""
    rng = random.Random(seed)
    bodies = payload_bodies(rng, payloads)
    weights = [len(b) ** -1.5 for b in bodies]
    picks = rng.choices(range(payloads), weights, k=entries)
    state: dict[str, Any] = {}
    at = 0
    for s in range(subscribers):
        n = entries // subscribers + (1 if s < entries % subscribers else 0)
        queue = [entry(shape, f"devices/{p % 97}/telemetry", k, bodies[p]) for k, p in enumerate(picks[at:at + n])]
        at += n
        state[f"client-{s:04d}"] = {"subscriptions": [f"devices/{t}/telemetry" for t in range(s % 7, 97, 7)],
                                    "queue": queue}
    return state


def reference_snapshot(state: dict[str, Any], path: str) -> float:
    """The broker's own snapshot (payloads in a table, references in the state, transient
    packet identifiers dropped, gzip); returns its wall seconds."""
    t0 = time.perf_counter()
    ids: dict[bytes, int] = {}

    def ref(e: dict[str, Any]) -> dict[str, Any]:
        out = dict(e)
        out.pop("packet", None)  # transient: the broker drops in-use packet identifiers
        holder = out
        if "message" in out:  # nested
            message = out["message"] = dict(out["message"])
            holder = message["envelope"] = dict(message["envelope"])
        holder["payload"] = ids.setdefault(holder["payload"], len(ids))
        return out

    slim = {c: {"subscriptions": v["subscriptions"], "queue": [ref(e) for e in v["queue"]]} for c, v in state.items()}
    table = sorted(ids, key=ids.__getitem__)
    with gzip.open(path, "wb", compresslevel=6) as f:
        f.write(cbor2.dumps({"payloads": table, "state": slim}))
    return time.perf_counter() - t0


def close_rotating(root: str, state: dict[str, Any], compression: str, share: bool) -> tuple[float, float, int]:
    """Fill a ResourceStore with ``state``, then time ``close(rotate=True)``: (wall s, CPU
    s, bytes of the newest log)."""
    shutil.rmtree(root, ignore_errors=True)
    store = persistlog.ResourceStore.open(root, compression=compression, share_values=share)
    for k, v in state.items():
        store[k] = v
    store.sync()
    c0, t0 = time.process_time(), time.perf_counter()
    store.close(rotate=True)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    newest = max(name[:20] for name in os.listdir(root) if name.endswith(".plog"))
    size = sum(os.path.getsize(os.path.join(root, n)) for n in os.listdir(root) if n.startswith(newest))
    return wall, cpu, size


def restored_equal(root: str, state: dict[str, Any]) -> bool:
    store = persistlog.ResourceStore.open(root)
    try:
        return dict(store) == state
    finally:
        store.close()


def snapshot(cfg: Config, s: Scratch) -> list[Figure]:
    figures: list[Figure] = []
    load = os.getloadavg()[0]
    for shape in SHAPES if not cfg.quick else ("flat",):
        state = broker_state(shape)
        raw = sum(len(cbor2.dumps(v)) for v in state.values())
        ref_path = s.fresh(f"shared-ref-{shape}.gz")
        contenders: dict[str, Callable[[], tuple[float, float, int]]] = {
            f"{c}{'' if share else ' unshared'}": (
                lambda c=c, share=share: close_rotating(s.fresh(f"shared-{shape}"), state, c, share)
            )
            for c in ("gzip", "zstd") for share in (True, False)
        }
        runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in contenders}
        ref_runs: list[float] = []
        for _ in range(max(1, cfg.repeats // 2)):
            for name, run in contenders.items():
                runs[name].append(run())
                if name == "gzip":
                    assert restored_equal(s.path(f"shared-{shape}"), state), "restore differs"
            ref_runs.append(reference_snapshot(state, ref_path))
        ref_mb = os.path.getsize(ref_path) / 1e6
        ref_s = min(ref_runs)
        raw_info = {"load": load, "raw_mb": raw / 1e6, "runs": runs, "reference_s": ref_runs}
        for name, rs in runs.items():
            wall = min(r[0] for r in rs)
            cpu = min(r[1] for r in rs)
            mb = rs[-1][2] / 1e6
            tag = f"broker snapshot {shape}, {name}"
            if name == "gzip" and shape == "flat":
                figures.append(at_most(f"{tag}: newest log", AREA, mb, MAX_MB, "MB", ref_mb, "broker's dedup+gzip",
                                       raw=raw_info))
                figures.append(at_most(f"{tag}: close(rotate=True) CPU", AREA, cpu, MAX_CLOSE_S, "s", ref_s,
                                       "broker's dedup+gzip (wall)"))
            else:
                figures.append(info(f"{tag}: newest log", AREA, mb, "MB", ref_mb, "broker's dedup+gzip"))
                figures.append(info(f"{tag}: close(rotate=True) CPU", AREA, cpu, "s", ref_s,
                                    "broker's dedup+gzip (wall)"))
            figures.append(info(f"{tag}: close(rotate=True) wall", AREA, wall, "s", raw={"load": load}))
        figures.append(info(f"broker snapshot {shape}: records as CBOR", AREA, raw / 1e6, "MB"))
        figures.append(info(f"broker snapshot {shape}: broker's dedup+gzip", AREA, ref_mb, "MB",
                            raw={"seconds": ref_s}))
        shutil.rmtree(s.path(f"shared-{shape}"), ignore_errors=True)
    return figures


BENCHMARKS: dict[str, Callable[[Config, Scratch], Sequence[Figure]]] = {
    "snapshot": snapshot,
}


if __name__ == "__main__":
    import sys
    import tempfile

    shape = sys.argv[1] if len(sys.argv) > 1 else "flat"
    st = broker_state(shape)
    with tempfile.TemporaryDirectory() as d:
        print("raw MB", sum(len(cbor2.dumps(v)) for v in st.values()) / 1e6)
        t = reference_snapshot(st, os.path.join(d, "ref.gz"))
        print("reference MB", os.path.getsize(os.path.join(d, "ref.gz")) / 1e6, "s", round(t, 3))
        for comp in ("gzip", "zstd"):
            for share in (True, False):
                wall, cpu, size = close_rotating(os.path.join(d, "s"), st, comp, share)
                print(comp, share, "MB", size / 1e6, "wall", round(wall, 3), "cpu", round(cpu, 3),
                      "restore ok", restored_equal(os.path.join(d, "s"), st) if share else "-", dir_bytes)

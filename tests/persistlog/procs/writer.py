"""A writer process for the follower and lease tests: restore, open, apply seeded operations.

Run as ``python writer.py CONFIG_JSON``. The config names the destination (``url``,
``storage_options``), the operations (``seed``, ``ops``, ``keys``, ``rotate_every``,
``sync_every``, ``pace``) and the log options (``open``: keyword arguments of
``persistlog.open``). The process restores the state first (restore, then open), retries
``open`` on :class:`persistlog.WriterConflict` for ``open_retry`` seconds (a dead writer's
lease must expire), then applies the operations. Progress goes to ``progress`` (a JSON file
replaced atomically): how many operations are done and the last LSN acknowledged as durable.
With ``hold``, the process syncs, writes ``result`` and waits to be killed instead of
closing; otherwise it closes the log and writes ``result``: the final state and next LSN.
"""

from __future__ import annotations

import functools
import json
import random
import sys
import time
from typing import Any

import kv_app
import persistlog
from results import dump


def main() -> None:
    cfg = json.loads(sys.argv[1])
    url = cfg["url"]
    so = cfg.get("storage_options") or None
    state: dict[str, Any] = {}

    apply = functools.partial(kv_app.apply, state)
    def enumerate_all(emit: Any) -> None:
        for k, v in list(state.items()):
            emit({"op": "put", "key": k, "value": v})

    restored = persistlog.restore(url, apply, storage_options=so)
    deadline = time.monotonic() + cfg.get("open_retry", 0)
    conflicts = 0
    while True:
        try:
            log = persistlog.open(url, enumerate_all, storage_options=so, **cfg.get("open", {}))
            break
        except persistlog.WriterConflict:
            conflicts += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
            # The dead writer may have flushed nothing more, but restore again all the same:
            # what we replay must be what is at the destination when we take over.
            state.clear()
            restored = persistlog.restore(url, apply, storage_options=so)
    rng = random.Random(cfg["seed"])
    keys = cfg.get("keys", 40)
    progress = cfg.get("progress")
    acked = 0
    opened_at = log.next_lsn
    for i in range(cfg["ops"]):
        key = f"k{rng.randrange(keys)}"
        if rng.random() < 0.25:
            rec: dict[str, Any] = {"op": "del", "key": key}
        else:
            rec = {"op": "put", "key": key, "value": [cfg["seed"], i, "x" * rng.randrange(60)]}
        sync = cfg.get("sync_every") and i % cfg["sync_every"] == 0
        lsn = log.update(rec, sync=bool(sync))
        apply(rec)
        if sync:
            acked = lsn
        if cfg.get("rotate_every") and (i + 1) % cfg["rotate_every"] == 0:
            log.rotate()
        if progress and (i % 10 == 0 or i == cfg["ops"] - 1):
            dump(progress, {"ops": i + 1, "acked_lsn": acked, "opened_lsn": opened_at, "conflicts": conflicts})
        if cfg.get("pace"):
            time.sleep(cfg["pace"])
    if cfg.get("hold"):
        log.sync()
        if cfg.get("result"):
            dump(cfg["result"], {"state": state, "next_lsn": log.next_lsn, "conflicts": conflicts})
        if progress:
            dump(progress, {"ops": cfg["ops"], "acked_lsn": log.next_lsn - 1, "held": True,
                            "opened_lsn": opened_at, "conflicts": conflicts})
        while True:
            time.sleep(1)
    log.close()
    dump(cfg["result"], {
        "state": state,
        "next_lsn": log.next_lsn,
        "restored_from": restored.last_lsn,
        "conflicts": conflicts,
    })


if __name__ == "__main__":
    main()

"""A writer process that reports every acknowledgement as it happens, for the tests that
stop, resume or kill a writer and then check that every acknowledged update restores.

Run as ``python acking_writer.py CONFIG_JSON``. The config names the destination (``url``,
``storage_options``), the log options (``open``: keyword arguments of ``persistlog.open``),
``threads`` updater threads, ``name`` (the prefix of every key, so that two writers' keys
never meet), ``count`` (updates per thread; none: until killed), ``sync`` (the ``sync=``
argument of each update) and ``hold`` (after the updates, wait for a line on stdin, then
close). The process restores and opens in one step (``replay=``), trying again for
``open_retry`` seconds while ``open`` raises ``WriterConflict``. Thread ``t`` puts key
``NAME.t.j`` with value ``j`` for j = 0, 1, ..., so a restored state shows which of its
updates survived. Each event is one line on stdout (one ``os.write``, so lines of
threads never interleave):

    O seq next_lsn       the Log is open
    W message            open() raised WriterConflict (the process then exits 0)
    A t j lsn            thread t's update j returned: acknowledged
    F t message          thread t's update raised (the process then exits 3)
    H                    on_handover was called (with ``handover_sleep``: it then sleeps
                         that many seconds before the log is handed over)
    D                    closed cleanly
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any


def out(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main() -> None:
    import persistlog

    cfg = json.loads(sys.argv[1])
    state: dict[str, Any] = {}

    def apply(record: dict[str, Any]) -> None:
        state[record["key"]] = record["value"]

    def enumerate_all(emit: Any) -> None:
        for key, value in list(state.items()):
            emit({"op": "put", "key": key, "value": value})

    options = dict(cfg.get("open", {}))
    if "handover_sleep" in cfg:
        def on_handover() -> None:
            out("H")
            time.sleep(cfg["handover_sleep"])

        options["on_handover"] = on_handover

    deadline = time.monotonic() + cfg.get("open_retry", 0)
    while True:
        state.clear()
        try:
            lg = persistlog.open(
                cfg["url"], enumerate_all, replay=apply, storage_options=cfg.get("storage_options"),
                **options,
            )
            break
        except persistlog.WriterConflict as e:
            if time.monotonic() < deadline:
                time.sleep(0.1)  # a killed writer's lease runs out
                continue
            out("W " + str(e).replace("\n", " "))
            return
    out(f"O {lg.seq} {lg.next_lsn}")
    name, count, sync = cfg["name"], cfg.get("count"), bool(cfg.get("sync"))

    def worker(t: int) -> None:
        j = 0
        while count is None or j < count:
            key = f"{name}.{t}.{j}"
            try:
                lsn = lg.update({"op": "put", "key": key, "value": j}, sync=sync)
            except Exception as e:
                out(f"F {t} {type(e).__name__}: {e}".replace("\n", " "))
                os._exit(3)
            state[key] = j
            out(f"A {t} {j} {lsn}")
            j += 1

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(cfg.get("threads", 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if cfg.get("hold"):
        sys.stdin.readline()
    lg.close()
    out("D")


if __name__ == "__main__":
    main()

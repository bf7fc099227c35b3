"""A writer process the test interrupts with SIGINT over and over, as Ctrl-C would.

``python interrupted_writer.py URL DURABILITY STOPFILE RESULT [pure]``: opens URL (restoring it
first), prints ``READY``, then logs numbered records ``{"i": i}`` (with an ``update_many``,
a ``sync()`` and a ``rotate()`` now and then, and rotations by record count) until STOPFILE
exists. A KeyboardInterrupt is caught and the same record tried again; ``i`` moves on only
once ``update()`` returned (the record is acknowledged). An enumeration writes
``{"upto": i}``: every record before ``i`` was acknowledged. Then it closes (trying again if
interrupted) and writes RESULT: ``{"acked": n, "interrupts": k, "interrupted_records": r,
"accelerated": bool}``, where ``r`` counts the records of the update calls interrupted.
With ``pure``, the C accelerator is hidden: the Python path of every hot call is taken.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from results import dump


def main() -> None:
    url, durability, stop_file, result_file = sys.argv[1:5]
    if sys.argv[5:] == ["pure"]:
        sys.modules["persistlog._cbor_json"] = None  # type: ignore[assignment]
    import persistlog

    state = {"i": 0, "interrupts": 0, "interrupted_records": 0, "armed": False}
    app_lock = threading.Lock()  # held while a record is logged and counted

    def enumerate_all(emit: Callable[[Any], None]) -> None:
        with app_lock:
            emit({"upto": state["i"]})  # every record before that one was acknowledged

    lg = persistlog.open(
        url, enumerate_all, replay=lambda r: None, durability=durability,
        segment_bytes=4096, batch_bytes=512, rotate_records=400, retain=1,
        concurrent_enumeration=True,  # app_lock is held while logging and while emitting
    )

    def on_sigint(signum: int, frame: Any) -> None:
        # Ctrl-C's KeyboardInterrupt, raised wherever the log's code is (the default
        # handler does the same), but not in this loop's own bookkeeping, which would
        # make the test lose track of what was acknowledged.
        if state["armed"]:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    print("READY", flush=True)

    def interruptible(call: Callable[[], Any], step: int = 0, lock: Any = app_lock) -> bool:
        with lock:
            try:
                state["armed"] = True
                call()
                state["armed"] = False
                state["i"] += step
                return True
            except KeyboardInterrupt:
                state["armed"] = False
                state["interrupts"] += 1
                state["interrupted_records"] += step
                return False

    while not os.path.exists(stop_file):
        i = state["i"]
        if i % 37 == 36:
            interruptible(lambda: lg.update_many([{"i": i}, {"i": i + 1}]), 2)
        else:
            interruptible(lambda: lg.update({"i": i}), 1)
        if i % 101 == 100:
            interruptible(lg.sync)
        if i % 997 == 996:
            interruptible(lg.rotate, lock=contextlib.nullcontext())  # the enumeration takes app_lock
    while not interruptible(lg.close, lock=contextlib.nullcontext()):  # close waits for an enumeration
        pass
    accelerated = lg._buffer.accelerated
    dump(result_file, {"acked": state["i"], "interrupts": state["interrupts"],
                       "interrupted_records": state["interrupted_records"], "accelerated": accelerated})


if __name__ == "__main__":
    main()

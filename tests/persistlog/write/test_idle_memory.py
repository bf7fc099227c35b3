"""What an idle Log holds: nothing sized by the biggest record it ever wrote.

Many logs in one process (a LogSet, a queue per recipient) sit idle most of the time,
so what each keeps between calls is multiplied by their number. Those measuring memory
run in a child process whose memory is its own.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest

import persistlog
from persistlog._write.log import parts_of
from tests.childproc import run_json

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/statm")

_CHILD = """
import ctypes, gc, json, os, sys, tempfile
import persistlog

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6

def settle():
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed memory back to the OS: what is left is held

durability, size, count, shape = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
root = tempfile.mkdtemp()
logs = persistlog.LogSet(root, durability=durability)
opened = [logs.open(f"k{i}", lambda emit: None) for i in range(count)]
settle()
before = rss_mb()
for i, lg in enumerate(opened):
    record = {"i": i, "blob": os.urandom(size)}
    if shape == "cbor2":
        record["big"] = 1 << 70  # past 64 bits: the record goes to cbor2's encoder whole
    lg.update(record)
    lg.sync()
settle()
held = rss_mb() - before
logs.close()
restored = []
for i in range(count):
    persistlog.restore(logs.url(f"k{i}"), restored.append)
print(json.dumps({"held_mb": held, "restored": sorted(r["i"] for r in restored)}))
"""


@linux_only
@pytest.mark.slow
@pytest.mark.parametrize("shape", ["plain", "cbor2"])
@pytest.mark.parametrize("durability", ["buffered", "flush", "fsync"])
def test_logs_idle_after_a_big_record_each_do_not_hold_it(durability: str, shape: str) -> None:
    # 100 logs that wrote one 1 MiB record each held 100 MB for good (cbor2's encoder
    # kept a buffer the size of the largest record it encoded). A plain record is
    # encoded in C where the accelerator is built; one with a value past the common
    # subset goes to cbor2.
    out = run_json(_CHILD, durability, str(1 << 20), "100", shape)
    assert out["restored"] == list(range(100))
    assert out["held_mb"] < 20, out


_PER_LOG = """
import gc, json, tempfile, tracemalloc
import persistlog
logs = persistlog.LogSet(tempfile.mkdtemp(), durability="flush")
logs.open("first", lambda emit: None)  # what the first open makes once (the runtime...)
gc.collect()
tracemalloc.start()
before = tracemalloc.get_traced_memory()[0]
opened = [logs.open(f"k{i}", lambda emit: None) for i in range(200)]
gc.collect()
print(json.dumps({"per_log": (tracemalloc.get_traced_memory()[0] - before) / 200}))
"""


def test_an_open_idle_log_in_a_set_holds_under_8_kb() -> None:
    # Everything an open, idle Log of a LogSet holds, its destination, lock and the set's
    # bookkeeping included (tracemalloc). It was 8.8 KB; a broker holds one per queue.
    out = run_json(_PER_LOG)
    assert out["per_log"] < 8000, out


def test_an_idle_log_keeps_no_rotation_job_or_request_table(tmp_path: Any) -> None:
    lg = persistlog.open(str(tmp_path / "log"), lambda emit: emit({"k": 1}), durability="flush")
    try:
        rotator = parts_of(lg).rotator
        # The open's rotation ran on this thread: no job was made for it.
        assert rotator.idle() and rotator._job is None and rotator._requests is None
        assert lg.rotate(wait=True) == 2
        deadline = time.monotonic() + 30
        while rotator._job is not None and time.monotonic() < deadline:
            time.sleep(0.01)  # the job lets go of itself once its run ends
        assert rotator._job is None and rotator._requests is None
        assert lg.stats()["last_rotation"]["seq"] == 2
        lg.update({"k": 2})
        assert lg.rotate(wait=True) == 3  # a new job for the next request
    finally:
        lg.close()
    records: list[Any] = []
    persistlog.restore(str(tmp_path / "log"), records.append)
    assert records == [{"k": 1}]


def test_the_opening_enumeration_on_a_local_disk_runs_on_the_opening_thread(tmp_path: Any) -> None:
    seen: list[threading.Thread] = []

    def enumerate_all(emit: Any) -> None:
        seen.append(threading.current_thread())
        emit({"k": 1})

    lg = persistlog.open(str(tmp_path / "log"), enumerate_all, durability="flush")
    try:
        assert seen == [threading.current_thread()]
        assert lg.rotate(wait=True) == 2  # a later one runs on a runtime worker
        assert len(seen) == 2 and seen[1].name.startswith("persistlog-worker")
    finally:
        lg.close()

"""What an idle Log holds: nothing sized by the biggest record it ever wrote.

Many logs in one process (a LogSet, a queue per recipient) sit idle most of the time,
so what each keeps between calls is multiplied by their number. These run in a child
process whose resident memory is its own.
"""

from __future__ import annotations

import sys

import pytest

from tests.childproc import run_json

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/statm")

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

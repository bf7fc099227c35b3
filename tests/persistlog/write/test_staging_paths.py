"""update()'s staging in C (``_cbor_json.Staging``, where the accelerator is built) and in
Python give the same log: the same LSNs, the same records, the same batches cut by the
same rules, in every durability mode, from threads and from an event loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from childproc import run_json

try:
    from persistlog._cbor_json import Staging  # noqa: F401

    ACCELERATED = True
except ImportError:
    ACCELERATED = False

WORKLOAD = """
import asyncio, json, sys, threading
import persistlog

url, durability = sys.argv[1], sys.argv[2]
state = {"n": 0}


def enumerate_all(emit):
    emit({"upto": state["n"]})


lg = persistlog.open(url, enumerate_all, durability=durability, batch_bytes=2048)
lsns = []
for i in range(500):
    lsns.append(lg.update({"i": i, "pad": "x" * (i % 97)}, sync=i % 50 == 0))
    state["n"] += 1
    if i == 250:
        lg.rotate()
# A record bigger than the batch: the slow path, then the fast one again.
lsns.append(lg.update({"big": "b" * 5000}))
lsns.append(lg.update_many([{"m": k} for k in range(20)]))
for bad in ({"x": object()}, {"s": {1, 2, object()}}):
    try:
        lg.update(bad)
    except TypeError:
        lsns.append("TypeError")


def worker(t):
    for k in range(100):
        lg.update({"t": t, "k": k})


threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
lsns.append(lg.update({"after_threads": True}))
accelerated = lg._buffer.accelerated
lg.close()
records = []
restored = persistlog.restore(url, records.append)


async def tasks():
    alog = await persistlog.open_async(url, enumerate_all, durability=durability, replay=lambda r: None)
    got = await asyncio.gather(*(alog.update({"task": k}) for k in range(64)))
    await alog.close()
    return sorted(got)


lsns.extend(asyncio.run(tasks()))
after = []
persistlog.restore(url, after.append)
print(json.dumps({
    "accelerated": accelerated, "lsns": lsns, "records": records, "after": after,
    "last_lsn": restored.last_lsn,
}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not ACCELERATED, reason="the C accelerator is not built")
@pytest.mark.parametrize("durability", ["buffered", "flush", "fsync"])
def test_c_and_python_staging_write_the_same_log(tmp_path: Path, durability: str) -> None:
    c = run_json(WORKLOAD, str(tmp_path / "c"), durability)
    pure = run_json(WORKLOAD, str(tmp_path / "pure"), durability, hide=["persistlog._cbor_json"])
    assert c["accelerated"] is True and pure["accelerated"] is False
    assert c["lsns"].count("TypeError") == 2
    assert c["records"][0] == {"upto": 251}  # the rotation's snapshot, then what followed it
    # Threads interleave differently from run to run: compare what does not depend on it.
    threaded = [r for r in c["records"] if "t" in r]
    assert sorted((r["t"], r["k"]) for r in threaded) == [(t, k) for t in range(4) for k in range(100)]
    assert c["after"][0] == {"upto": 500} and sorted(r["task"] for r in c["after"][1:]) == list(range(64))
    for out in (c, pure):
        out["records"] = sorted(map(repr, out["records"]))
    assert {k: v for k, v in c.items() if k != "accelerated"} == {
        k: v for k, v in pure.items() if k != "accelerated"
    }

"""Where ``update()``'s time goes, beside the naive write loop's: ``python bench/write_floor.py [N] [REPEATS] [SHAPES]``.

Not part of ``make bench``: it times the pieces of both loops on the same records, each
alone, in CPU nanoseconds per record (best of REPEATS, round-robin), so that the ratio
``update()`` / naive loop of the ``shapes`` group can be read as a sum of parts.
bench/README.md quotes a run. ``PERSISTLOG_PURE=1`` hides the C accelerator (the paths
taken where it is not built).
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

if os.environ.get("PERSISTLOG_PURE") == "1":
    sys.modules["persistlog._cbor_json"] = None  # type: ignore[assignment]

import cbor2

import persistlog
from persistlog import Codec
from persistlog._write.batch_buffer import BatchBuffer

import baselines
import shapes


def _naive_framing(encoded: Sequence[bytes], path: str) -> None:
    """The naive loop without its ``cbor2.dumps``: header, CRC, write."""
    with open(path, "wb") as f:
        write = f.write
        for b in encoded:
            write(baselines._header(len(b), baselines._crc32(b)) + b)


def _dumps_alone(dumps: Callable[[Any], bytes], records: Sequence[Any]) -> None:
    for r in records:
        dumps(r)


def _update_loop(records: Sequence[Any], url: str) -> None:
    lg = persistlog.open(url, lambda emit: None, rotate_bytes=None)
    try:
        update = lg.update
        for r in records:
            update(r)
        lg.sync()
    finally:
        lg.close()


def _encode_into_buffer(records: Sequence[Any], checked: bool) -> None:
    """The Codec's record encoder (depth-checked; in C for the common subset of records
    where the accelerator is built), or cbor2's streaming encoder alone."""
    fp = io.BytesIO()
    if checked:
        encode: Callable[[Any], Any] = Codec().record_encoder(fp)
        for r in records:
            encode(r)
    else:
        raw, tell = cbor2.CBOREncoder(fp).encode, fp.tell
        for r in records:
            raw(r)
            tell()


def _staging_alone(records: Sequence[Any]) -> None:
    """The batch buffer's staging call as ``update()`` makes it (in C where the accelerator
    is built): lock, encode, end and LSN, cut rule; a full batch is only dropped."""
    buffer = BatchBuffer(Codec(), 1, 1 << 20, eager=False)
    stage = buffer.fast_stage
    for r in records:
        if type(stage(r)) is not int:
            buffer.detach()
            buffer.handed_over()


def _lock_alone(records: Sequence[Any]) -> None:
    lock = threading.Lock()
    for _r in records:
        with lock:
            pass


class _Empty:
    def update(self, record: Any, sync: bool = False) -> int:
        return 0


def _method_call_alone(records: Sequence[Any]) -> None:
    update = _Empty().update
    for r in records:
        update(r)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    names = sys.argv[3].split(",") if len(sys.argv) > 3 else list(shapes.SHAPES)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            records = shapes.SHAPES[name].records(n)
            encoded = [cbor2.dumps(r) for r in records]
            dumps = cbor2.dumps
            runs: dict[str, Callable[[], None]] = {
                "naive loop": lambda: baselines.naive_write(records, os.path.join(tmp, "naive")),
                "  cbor2.dumps": lambda: _dumps_alone(dumps, records),
                "  header + CRC + write": lambda: _naive_framing(encoded, os.path.join(tmp, "framing")),
                "update()": lambda: _update_loop(records, os.path.join(tmp, f"log-{time.monotonic_ns()}")),
                "  the batch buffer's staging call": lambda: _staging_alone(records),
                "  the record encoder into the batch buffer, tell": lambda: _encode_into_buffer(records, True),
                "  cbor2's encoder into a buffer, tell (no depth check)": lambda: _encode_into_buffer(records, False),
                "  `with lock:` around nothing": lambda: _lock_alone(records),
                "  a Python method call doing nothing": lambda: _method_call_alone(records),
            }
            best = {label: float("inf") for label in runs}
            for _ in range(repeats):
                for label, run in runs.items():
                    start = time.process_time()
                    run()
                    best[label] = min(best[label], time.process_time() - start)
            print(f"{name} ({n} records, CPU ns per record, best of {repeats})")
            for label, seconds in best.items():
                print(f"  {label:<52} {seconds / n * 1e9:8.0f}")
            print(f"  update() vs naive loop (rate ratio, as in the shapes group): "
                  f"{best['naive loop'] / best['update()']:.2f}x")


if __name__ == "__main__":
    main()

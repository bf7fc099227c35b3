"""What each lever of the restore path gives: ``python bench/levers.py [N] [REPEATS] [SHAPES]``.

Not part of ``make bench``: it reaches into persistlog's internals (``persistlog._format.decoder``,
``persistlog._read.restore``) to turn each lever off in turn, and builds a variant of the C
extension without string sharing (needs a C compiler). Each variant restores the same log
(written with ``update()`` per record, so ~1 MiB batches) into a dict with
``replay_batch=``; best of REPEATS runs in CPU seconds, round-robin. bench/README.md
quotes a run.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from importlib.machinery import ExtensionFileLoader
from typing import Any

import persistlog
from persistlog._format import decoder
from persistlog._read import restore as _restore

import shapes

SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "persistlog", "_cbor_json.c")


def unshared_build(tmp: str) -> Any:
    """``decode_slice`` of the C extension compiled with no string sharing, or None."""
    out = os.path.join(tmp, "_cbor_json" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    cmd = ["cc", "-O2", "-shared", "-fPIC", "-DSHARED_TEXT_MAX=0", f"-I{sysconfig.get_paths()['include']}", SOURCE, "-o", out]
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        return None
    loader = ExtensionFileLoader("persistlog._cbor_json", out)
    spec = importlib.util.spec_from_loader("persistlog._cbor_json", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module.decode_slice


class _NoPause:
    @contextlib.contextmanager
    def during_replay(self) -> Iterator[None]:
        yield


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    names = sys.argv[3].split(",") if len(sys.argv) > 3 else ["flat", "nested", "wide"]
    bounds, build = decoder._record_bounds, decoder._decode_slice
    with tempfile.TemporaryDirectory() as tmp:
        unshared = unshared_build(tmp)
        variants: dict[str, dict[str, Any]] = {
            "whole batch, cbor2 (before)": {"bounds": None, "build": None, "pause": False},
            "slices, cbor2": {"bounds": bounds, "build": None, "pause": False},
            "slices, cbor2, GC paused": {"bounds": bounds, "build": None, "pause": True},
            "slices, C, no string sharing, GC paused": {"bounds": bounds, "build": unshared, "pause": True},
            "slices, C, shared strings": {"bounds": bounds, "build": build, "pause": False},
            "slices, C, shared strings, GC paused (as shipped)": {"bounds": bounds, "build": build, "pause": True},
        }
        if unshared is None:
            del variants["slices, C, no string sharing, GC paused"]
        sizes = [1024, 2048, 4096, 8192, 16384, 65536]
        for name in names:
            shape = shapes.SHAPES[name]
            url = os.path.join(tmp, name)
            lg = persistlog.open(url, lambda emit: None, rotate_bytes=None)
            for r in shape.records(n):
                lg.update(r)
            lg.close()
            runs: dict[str, list[float]] = {}

            def restore(label: str) -> None:
                gc.collect()
                state: dict[Any, Any] = {}
                start = time.process_time()
                persistlog.restore(url, replay_batch=shape.apply_batch(state))
                runs.setdefault(label, []).append(time.process_time() - start)
                assert len(state) == n

            try:
                for _ in range(repeats):
                    for label, v in variants.items():
                        decoder._record_bounds, decoder._decode_slice = v["bounds"], v["build"]
                        _restore.gc_pause = _restore._GcPause() if v["pause"] else _NoPause()  # type: ignore[assignment]
                        restore(label)
                    decoder._record_bounds, decoder._decode_slice = bounds, build
                    _restore.gc_pause = _restore._GcPause()
                    for size in sizes:
                        decoder.SLICE_BYTES = size
                        restore(f"slices of {size} bytes")
                    decoder.SLICE_BYTES = 4096
            finally:
                decoder._record_bounds, decoder._decode_slice = bounds, build
                _restore.gc_pause = _restore._GcPause()
                decoder.SLICE_BYTES = 4096
            for label, t in runs.items():
                print(f"{name:7s} {label:50s} {n / min(t) / 1e3:8.0f} k rec/s   spread {(max(t) - min(t)) / min(t):4.0%}")


if __name__ == "__main__":
    main()

"""``update()`` of two trees side by side: ``python bench/update_ab.py TREE_A TREE_B [N] [ROUNDS] [SHAPES] [pure]``.

Not part of ``make bench``. Each tree is imported in its own child process (a package
cannot be imported twice in one), and every child times ``update()`` (buffered, then
``sync()``) and the naive write loop on the same records, in CPU seconds, one after the
other; the parent runs the children's rounds alternately, so that other work on the
machine falls on both alike. The figure per tree is its rate against its own process's
naive loop (best of ROUNDS each), the measure of the ``shapes`` and ``core`` groups.
With ``pure`` the children hide the C accelerator (the paths taken without a compiler).
SHAPES: the shapes group's names, and ``go`` (the Go original's record).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

_CHILD = r"""
import json, os, sys, tempfile
import persistlog, baselines, shapes
assert os.path.dirname(os.path.dirname(os.path.abspath(persistlog.__file__))) == os.getcwd(), persistlog.__file__
from workload import cpu_timed, no_enumeration

def updates(lg, records):
    update = lg.update
    for r in records:
        update(r)
    lg.sync()

def update_run(records, path):
    lg = persistlog.open(path, no_enumeration, rotate_bytes=None)
    try:
        return cpu_timed(lambda: updates(lg, records))  # opening and closing are not timed
    finally:
        lg.close()

def naive_run(records, path):
    return cpu_timed(lambda: baselines.naive_write(records, path))

cache = {}
with tempfile.TemporaryDirectory() as tmp:
    for k, line in enumerate(sys.stdin):
        name, n = line.split()
        records = cache.get(name)
        if records is None:
            records = cache[name] = shapes.SHAPES[name].records(int(n)) if name != "go" else [
                {"op": 0, "id": i % 50_000, "data": {"name": "n" * 32, "n": i}} for i in range(int(n))]
        u = update_run(records, os.path.join(tmp, f"log{k}"))
        v = naive_run(records, os.path.join(tmp, f"naive{k}"))
        print(json.dumps({"update": u, "naive": v}), flush=True)
"""


def _child(tree: str, pure: bool) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, HERE]))
    hide = "import sys; sys.modules['persistlog._cbor_json'] = None\n" if pure else ""
    # Run from the tree itself: ``python -c`` puts the working directory first on sys.path.
    return subprocess.Popen([sys.executable, "-c", hide + _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, cwd=tree)


def main() -> None:
    trees = sys.argv[1:3]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 200_000
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    names = sys.argv[5].split(",") if len(sys.argv) > 5 else ["flat", "nested", "wide", "go"]
    pure = sys.argv[6:] == ["pure"]
    kids = [_child(t, pure) for t in trees]
    try:
        for name in names:
            best: list[dict[str, float]] = [{"update": 1e9, "naive": 1e9} for _ in trees]
            for r in range(rounds):
                order = range(len(trees)) if r % 2 == 0 else reversed(range(len(trees)))
                for i in order:
                    kid = kids[i]
                    assert kid.stdin is not None and kid.stdout is not None
                    kid.stdin.write(f"{name} {n}\n")
                    kid.stdin.flush()
                    got: dict[str, Any] = json.loads(kid.stdout.readline())
                    for k in best[i]:
                        best[i][k] = min(best[i][k], got[k])
            cells = [
                f"{os.path.basename(t.rstrip('/')) or t}: update {n / b['update'] / 1e6:.3f} M/s, "
                f"{b['naive'] / b['update']:.2f}x naive"
                for t, b in zip(trees, best)
            ]
            print(f"{name:<7} " + " | ".join(cells), flush=True)
    finally:
        for kid in kids:
            if kid.stdin is not None:
                kid.stdin.close()
            kid.wait()


if __name__ == "__main__":
    main()

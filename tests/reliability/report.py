"""Regenerate the figures of docs/RELIABILITY.md: crash matrix, soak and fuzz, in one command.

    python tests/reliability/report.py                       # ~5 minutes
    python tests/reliability/report.py --soak-seconds 600 --all-modes --fuzz 10000

Runs the crash-point matrix over every recorded failpoint of every configuration (one
power-loss mode per point, rotating; ``--all-modes`` tries every mode at every point), a
SIGKILL soak (tests/soak.py) of the given length, and the seeded fuzz campaign, then
rewrites the table between the ``figures`` markers of docs/RELIABILITY.md and writes the
raw figures as JSON (``--json``). Exit status 1 if anything failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hostile_input  # noqa: E402
import crash_matrix  # noqa: E402
from crashsim import quiet_crash_threads  # noqa: E402

DOC = os.path.join(crash_matrix.ROOT, "docs", "RELIABILITY.md")
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"


def run_matrix(all_modes: bool) -> list[crash_matrix.MatrixFigures]:
    from fsspec.implementations.memory import MemoryFileSystem

    out = []
    for name, config in crash_matrix.CONFIGS.items():
        workdir = tempfile.mkdtemp(prefix="pl-report-")
        try:
            with quiet_crash_threads():
                figures = crash_matrix.run_matrix(config, budget=None, all_modes=all_modes, workdir=workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            MemoryFileSystem.store.clear()
        print(f"matrix {name}: {figures.covered}/{figures.points} points, {figures.runs} runs, "
              f"{len(figures.failures)} failures, {figures.seconds}s", flush=True)
        for f in figures.failures[:10]:
            print("  FAIL", f)
        out.append(figures)
    return out


def run_soak(seconds: float, iterations: int, destinations: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="pl-report-soak-") as tmp:
        path = os.path.join(tmp, "soak.json")
        subprocess.run(
            [sys.executable, os.path.join(crash_matrix.TESTS, "soak.py"), "--iterations", str(iterations),
             "--seconds", str(seconds), "--destinations", destinations, "--json", path, "--quiet",
             "--workdir", os.path.join(tmp, "work")],
            cwd=crash_matrix.ROOT, check=False,
        )
        with open(path) as f:
            return json.load(f)


def run_fuzz(n: int, seed: int) -> hostile_input.FuzzFigures:
    started = time.monotonic()
    figures = hostile_input.campaign(n, seed=seed)
    print(f"fuzz: {figures.inputs} inputs, {figures.escapes} escapes, {time.monotonic() - started:.1f}s", flush=True)
    for e in figures.escape_examples[:10]:
        print("  ESCAPE", e)
    return figures


def table(matrix: list[crash_matrix.MatrixFigures], soak: dict, fuzz: hostile_input.FuzzFigures, args: argparse.Namespace) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = [
        f"Last run: {when}, `python tests/reliability/report.py --soak-seconds {args.soak_seconds:g} "
        f"--fuzz {args.fuzz}{' --all-modes' if args.all_modes else ''}` "
        f"({platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores).",
        "",
        "| crash-point matrix | failpoints | crashed at | crash runs | acked before the crash (sum over runs) | runs losing an acked update | failures | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in matrix:
        rows.append(f"| {m.config} | {m.points} | {m.covered} | {m.runs} | {m.acked} | {m.lost} | "
                    f"{len(m.failures)} | {m.seconds} |")
    total = sum(m.runs for m in matrix)
    rows.append(f"| **total** | {sum(m.points for m in matrix)} | {sum(m.covered for m in matrix)} | {total} | "
                f"{sum(m.acked for m in matrix)} | {sum(m.lost for m in matrix)} | "
                f"{sum(len(m.failures) for m in matrix)} | {round(sum(m.seconds for m in matrix), 1)} |")
    rows += [
        "",
        "| SIGKILL soak | value |",
        "|---|---:|",
        f"| destinations | {', '.join(soak.get('destinations', []))} |",
        f"| iterations (kills) | {soak.get('iterations')} ({soak.get('kills')}, of which {soak.get('kills_before_ready')} during start-up) |",
        f"| lanes | {', '.join(f'{k}: {v}' for k, v in soak.get('lanes', {}).items())} |",
        f"| updates acknowledged | {soak.get('updates_acknowledged')} |",
        f"| **updates lost** | **{soak.get('updates_lost')}** |",
        f"| restores checked (primary / secondary) | {soak.get('restores_checked')} / {soak.get('secondary_restores_checked')} |",
        f"| **secondary restores failed** | **{soak.get('secondary_restore_errors')}** |",
        f"| secondary behind its primary at a kill, records (LSNs): p50 / p99 / max | {lag_text(soak, 'records')} |",
        f"| ... writer-thread steps: p50 / p99 / max | {lag_text(soak, 'steps')} |",
        f"| check failures / child errors | {soak.get('check_failures')} / {soak.get('child_errors')} |",
        f"| seconds | {soak.get('seconds')} |",
        "",
        "| hostile input | value |",
        "|---|---:|",
        f"| corrupt or hostile destinations tried | {fuzz.inputs} |",
        f"| reads (restore strict, restore skip, follower poll, Spark reader as JSON) | {fuzz.ok + fuzz.corrupt + fuzz.escapes} |",
        f"| read cleanly / refused with CorruptLogError | {fuzz.ok} / {fuzz.corrupt} |",
        f"| **escapes (any other exception)** | **{fuzz.escapes}** |",
        f"| records holding a non-inert type | {fuzz.foreign} |",
        f"| records that are cyclic (CBOR value-sharing tags 28/29) | {fuzz.cyclic} |",
        f"| mutation kinds | {', '.join(f'{k} {v}' for k, v in sorted(fuzz.kinds.items()))} |",
    ]
    return "\n".join(rows)


def lag_text(soak: dict, unit: str) -> str:
    lag = soak.get("secondary_lag", {}).get(unit, {})
    if not lag.get("n"):
        return "-"
    return f"{lag['p50']} / {lag['p99']} / {lag['max']} (none behind: {lag['zero']} of {lag['n']})"


def rewrite_doc(text: str) -> None:
    with open(DOC) as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC} lacks the {BEGIN} ... {END} markers")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(DOC, "w") as f:
        f.write(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--soak-seconds", type=float, default=120.0)
    parser.add_argument("--soak-iterations", type=int, default=400)
    parser.add_argument("--destinations", default="local,s3")
    parser.add_argument("--fuzz", type=int, default=5000, help="mutated destinations to try")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--all-modes", action="store_true", help="every power-loss mode at every failpoint")
    parser.add_argument("--json", help="also write the raw figures here")
    parser.add_argument("--no-doc", action="store_true", help="do not rewrite docs/RELIABILITY.md")
    args = parser.parse_args()
    logging.getLogger("persistlog").setLevel(logging.CRITICAL)
    logging.getLogger("destinations").setLevel(logging.CRITICAL)

    matrix = run_matrix(args.all_modes)
    fuzz = run_fuzz(args.fuzz, args.seed)
    soak = run_soak(args.soak_seconds, args.soak_iterations, args.destinations)
    print(f"soak: {soak.get('iterations')} iterations, {soak.get('updates_acknowledged')} acknowledged, "
          f"{soak.get('updates_lost')} lost", flush=True)
    text = table(matrix, soak, fuzz, args)
    print(text)
    if not args.no_doc:
        rewrite_doc(text)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({
                "matrix": [m.__dict__ for m in matrix],
                "soak": soak,
                "fuzz": {**fuzz.__dict__, "kinds": dict(fuzz.kinds)},
            }, f, indent=2, default=str)
    ok = (all(not m.failures for m in matrix) and fuzz.escapes == 0 and fuzz.foreign == 0
          and soak.get("ok") is True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

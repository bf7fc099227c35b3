"""Figures: one measured value, what it is compared with, its target and verdict; the table
``make bench`` prints and the JSON file it saves under ``bench/results/``."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


@dataclass
class Figure:
    """One row of the table.

    ``measured`` and ``baseline`` are in ``unit``; ``ratio`` is measured / baseline where a
    target is a ratio. ``passed`` is None for figures reported for information only.
    """

    name: str
    area: str
    measured: float
    unit: str
    target: str = "info"
    passed: bool | None = None
    baseline: float | None = None
    baseline_label: str = ""
    ratio: float | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    #: (slowest - fastest) / fastest over the runs behind the figure, where it is a best-of.
    spread: float | None = None


def vs_baseline(
    name: str,
    area: str,
    measured: float,
    baseline: float,
    baseline_label: str,
    unit: str,
    min_ratio: float,
    raw: dict[str, Any] | None = None,
) -> Figure:
    """A rate that must reach ``min_ratio`` times a baseline measured in the same run."""
    ratio = measured / baseline if baseline else float("nan")
    return Figure(
        name, area, measured, unit, f">= {min_ratio:g}x", ratio >= min_ratio,
        baseline, baseline_label, ratio, raw or {},
    )


def at_least(
    name: str,
    area: str,
    measured: float,
    limit: float,
    unit: str,
    raw: dict[str, Any] | None = None,
) -> Figure:
    """A rate that must reach ``limit`` on its own."""
    return Figure(name, area, measured, unit, f">= {_fmt(limit, unit)}", measured >= limit, raw=raw or {})


def at_most(
    name: str,
    area: str,
    measured: float,
    limit: float,
    unit: str,
    baseline: float | None = None,
    baseline_label: str = "",
    raw: dict[str, Any] | None = None,
) -> Figure:
    """A cost (latency, memory, requests) that must stay at or under ``limit``."""
    return Figure(
        name, area, measured, unit, f"<= {_fmt(limit, unit)}", measured <= limit,
        baseline, baseline_label, None, raw or {},
    )


def info(
    name: str,
    area: str,
    measured: float,
    unit: str,
    baseline: float | None = None,
    baseline_label: str = "",
    raw: dict[str, Any] | None = None,
) -> Figure:
    """A figure reported without a target."""
    ratio = measured / baseline if baseline else None
    return Figure(name, area, measured, unit, "info", None, baseline, baseline_label, ratio, raw or {})


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    if value != value:  # NaN
        return "n/a"
    if unit == "rec/s":
        if value >= 1e6:
            return f"{value / 1e6:.2f} M/s"
        if value >= 1e4:
            return f"{value / 1e3:.1f} k/s"
        return f"{value:.0f} /s"
    if unit == "ms" and abs(value) < 1:
        return f"{value * 1e3:.3g} µs"
    if unit in ("ms", "MiB", "MiB/s", "B/rec", "s"):
        return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    if abs(value) >= 1e4:
        return f"{value:,.0f} {unit}".strip()
    return f"{value:g} {unit}".strip()


def table(figures: list[Figure]) -> str:
    """The figures as a plain-text table: benchmark | measured | baseline | ratio | target |
    result | spread."""
    head = ("area", "benchmark", "measured", "baseline", "ratio", "target", "result", "spread")
    rows = [head]
    for f in figures:
        base = _fmt(f.baseline, f.unit)
        if base and f.baseline_label:
            base = f"{base} ({f.baseline_label})"
        ratio = "" if f.ratio is None else f"{f.ratio:.2f}x"
        result = "info" if f.passed is None else "PASS" if f.passed else "FAIL"
        spread = "" if f.spread is None else f"{f.spread:.0%}"
        rows.append((f.area, f.name, _fmt(f.measured, f.unit), base, ratio, f.target, result, spread))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for i, r in enumerate(rows):
        lines.append(" | ".join(c.ljust(w) if j < 2 or j == 3 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
            cwd=os.path.dirname(RESULTS_DIR),
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
            cwd=os.path.dirname(RESULTS_DIR),
        )
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def save(figures: list[Figure], options: dict[str, Any], seconds: float) -> str:
    """Write the run's raw results as JSON; returns the file's path."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(RESULTS_DIR, f"{stamp}{'-quick' if options.get('quick') else ''}.json")
    doc = {
        "started": stamp,
        "seconds": round(seconds, 1),
        "options": options,
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "git": _git_revision(),
        "figures": [asdict(f) for f in figures],
    }
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=2, default=str)
    return path

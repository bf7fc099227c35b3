"""``persistlog dump`` between bounds: --from-lsn/--to-lsn, --from-time/--to-time (both ends
inclusive), and the usage errors (exit 2) of bounds that contradict each other."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from cli_logs import cli


def records(*argv: str) -> list[dict]:
    run = cli("dump", *argv, "--json")
    assert run.status == 0, run.err
    return [json.loads(line) for line in run.out.splitlines()]


def test_lsn_bounds_are_inclusive(logdir: str) -> None:
    everything = records(logdir)
    a, b = everything[len(everything) // 4]["lsn"], everything[len(everything) * 3 // 4]["lsn"]
    assert records(logdir, "--from-lsn", str(a), "--to-lsn", str(b)) == [r for r in everything if a <= r["lsn"] <= b]
    assert records(logdir, "--to-lsn", str(a)) == [r for r in everything if r["lsn"] <= a]


def test_time_bounds_are_the_commit_times_of_batches(logdir: str) -> None:
    everything = records(logdir)
    times = sorted({r["commit_time"] for r in everything})
    t0, t1 = times[len(times) // 3], times[len(times) * 2 // 3]
    got = records(logdir, "--from-time", t0, "--to-time", t1)
    assert got == [r for r in everything if t0 <= r["commit_time"] <= t1] and got
    # Without a zone, a time is UTC.
    naive = datetime.fromisoformat(t0.replace("Z", "+00:00")).replace(tzinfo=None).isoformat()
    assert records(logdir, "--from-time", naive) == [r for r in everything if r["commit_time"] >= t0]


@pytest.mark.parametrize("argv, message", [
    (["--from-lsn", "5", "--from-time", "2026-01-01T00:00:00Z"], "--from-lsn or --from-time"),
    (["--to-lsn", "5", "--to-time", "2026-01-01T00:00:00Z"], "--to-lsn or --to-time"),
    (["--from-lsn", "9", "--to-lsn", "5"], "before --from-lsn"),
    (["--from-time", "2026-01-02T00:00:00Z", "--to-time", "2026-01-01T00:00:00Z"], "before --from-time"),
    (["--to-lsn", "-1"], "must be >= 0"),
    (["--from-time", "yesterday"], "not an ISO 8601 time"),
])
def test_contradicting_bounds_are_usage_errors(logdir: str, argv: list[str], message: str) -> None:
    run = cli("dump", logdir, *argv)
    assert run.status == 2 and message in run.err and run.out == ""


@pytest.mark.parametrize("argv", [["--from-lsn", "999999999"], ["--from-time", "2999-01-01T00:00:00Z"]])
def test_bounds_past_the_end_print_nothing_and_say_what_was_read(logdir: str, argv: list[str]) -> None:
    last = records(logdir)[-1]["lsn"]
    run = cli("dump", logdir, *argv)
    assert run.status == 0 and run.out == ""
    assert "no record within the bounds given" in run.err and f"{last}" in run.err

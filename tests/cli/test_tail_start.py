"""``persistlog tail --from-lsn N`` / ``--from-time TIME``: the start found by persistlog's
seek (dump's bounds options, parsed by the same code), in any retained log, and the wrong
input: negative, past the end, before what retention left, a typo, both options, a path
that holds no log (exit status 2, one line)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli_logs import cli


def lsns(*argv: str) -> list[int]:
    run = cli(*argv, "--json")
    assert run.status == 0, run.err
    return [json.loads(line)["lsn"] for line in run.out.splitlines()]


def test_from_lsn_starts_at_that_record_in_any_retained_log(logdir: str) -> None:
    everything = lsns("dump", logdir)
    # Inside log 1, which a tail without a start never reads (it starts at the newest
    # complete log): every record from N on, as dump prints them.
    n = everything[len(everything) // 5]
    assert lsns("tail", logdir, "--from-lsn", str(n)) == [lsn for lsn in everything if lsn >= n]
    assert lsns("tail", logdir, "--from-lsn", str(everything[-1])) == [everything[-1]]
    assert lsns("tail", logdir, "--from-lsn", "0") == everything  # as for dump: from the oldest
    # The LSN the next record takes: nothing yet, not an error.
    assert lsns("tail", logdir, "--from-lsn", str(everything[-1] + 1)) == []


def test_from_time_starts_at_the_first_batch_committed_then(logdir: str) -> None:
    dumped = [json.loads(line) for line in cli("dump", logdir, "--json").out.splitlines()]
    times = sorted({r["commit_time"] for r in dumped})
    t = times[len(times) // 2]
    assert lsns("tail", logdir, "--from-time", t) == lsns("dump", logdir, "--from-time", t)
    # Without a zone a time is UTC, as for dump.
    naive = t.replace("Z", "")
    assert lsns("tail", logdir, "--from-time", naive) == lsns("dump", logdir, "--from-time", t)


@pytest.mark.parametrize("argv, message", [
    (["--from-lsn", "-1"], "--from-lsn must be >= 0"),
    (["--from-lsn", "12x"], "invalid int value: '12x'"),
    (["--from-time", "yesterday"], "not an ISO 8601 time"),
    (["--from-lsn", "5", "--from-time", "2026-01-01T00:00:00Z"], "give --from-lsn or --from-time, not both"),
    (["--from-lsn", "5", "--cursor", "1:0:0:1"], "give --cursor or --from-lsn/--from-time, not both"),
])
def test_wrong_starts_are_usage_errors(logdir: str, argv: list[str], message: str) -> None:
    run = cli("tail", logdir, *argv)
    assert run.status == 2 and message in run.err and run.out == ""


def test_a_start_the_log_does_not_hold_names_what_it_holds(logdir: str) -> None:
    everything = lsns("dump", logdir)
    run = cli("tail", logdir, "--from-lsn", str(everything[-1] + 2))
    assert run.status == 2 and run.out == ""
    assert "is past the end" in run.err and f"holds LSNs {everything[0]}..{everything[-1]}" in run.err
    # Retention deleted log 1: its LSNs are no longer there.
    for name in os.listdir(logdir):
        if name.startswith("00000000000000000001-"):
            os.remove(os.path.join(logdir, name))
    left = lsns("dump", logdir)
    run = cli("tail", logdir, "--from-lsn", "3")
    assert run.status == 2 and "before the oldest record retention left" in run.err
    assert f"holds LSNs {left[0]}..{left[-1]}" in run.err and "corrupt" not in run.err
    run = cli("tail", logdir, "--from-time", "2000-01-01T00:00:00Z", "--json")
    assert run.status == 2 and json.loads(run.out)["error"].startswith("2000-01-01")


def test_a_path_that_is_not_a_log(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    for target, why in ((tmp_path, "no log segment"), (tmp_path / "notes.txt", "a file, not a directory"),
                        (tmp_path / "missing", "does not exist")):
        run = cli("tail", str(target), "--from-lsn", "3")
        assert run.status == 2 and run.out == "" and f"no persistlog log at {target}" in run.err and why in run.err
    run = cli("tail", str(tmp_path / "later"), "-f", "--wait", "--from-lsn", "3")
    assert run.status == 2 and "leave them out to wait" in run.err

"""Crash at every failpoint of the writer, rotation, retention and pointer moves.

For each configuration (local fsync, local buffered with explicit syncs, local with a
compressed secondary, an object store, local with an object-store secondary), the workload is recorded once; then it is crashed
at each recorded failpoint (CI: every create, replace, delete, PUT and lock point and an
even sample of the append/flush/sync points; ``PERSISTLOG_CRASH_FULL=1``: all of them, each
under every power-loss mode), restored, checked against docs/DESIGN.md invariant 1 (the secondary too: a prefix, never an
error), reopened with the same secondary and checked again (after that clean close the
secondary holds exactly the primary's state). ``python tests/reliability/report.py`` runs the full matrix and records the
figures in docs/RELIABILITY.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from crash_matrix import CONFIGS, run_matrix

FULL = os.environ.get("PERSISTLOG_CRASH_FULL") == "1"
# Crash runs per configuration in CI (each costs 10-80 ms).
BUDGETS = {"local-fsync": 160, "local-buffered": 120, "local-gzip-secondary": 80, "memory-fsync": None,
           "local-memory-secondary": 60}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.usefixtures("clean_memory_fs")
def test_crash_at_every_failpoint(name: str, tmp_path: Path) -> None:
    figures = run_matrix(CONFIGS[name], budget=None if FULL else BUDGETS[name], all_modes=FULL,
                         workdir=str(tmp_path))
    assert figures.points > 100, "the workload must pass through many failpoints"
    kinds = {k.split(" ", 1)[1].split(":", 1)[1] for k in figures.by_point}
    expected = {"create segment", "replace CURRENT", "delete segment"} if not CONFIGS[name].remote \
        else {"put segment", "replace CURRENT", "delete segment"}
    assert expected <= kinds, f"missing failpoint kinds: {expected - kinds}"
    if CONFIGS[name].remote_secondary:
        # The secondary's own paths: segment PUTs, CURRENT, its lease, retention.
        on_secondary = {k.split(":", 1)[1] for k in figures.by_point if k.startswith("secondary ")}
        wanted = {"put segment", "replace CURRENT", "lock LEASE", "delete segment"}
        assert wanted <= on_secondary, f"missing secondary failpoints: {wanted - on_secondary}"
    assert not figures.failures, (
        f"{len(figures.failures)} of {figures.runs} crash runs failed:\n" + "\n".join(figures.failures[:20])
    )
    assert figures.reached == figures.runs

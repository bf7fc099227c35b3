"""Tests that share one process pass in either order: a test that leaves a thread of
persistlog running (a secondary still retrying after close()) must not fail a later test
that waits for its own Log's threads to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LEAVES_A_THREAD = "tests/persistlog/write/test_secondary_backup.py::test_unreachable_secondary_does_not_hold_open_up"
COUNTS_THREADS = [
    "tests/persistlog/write/test_lifecycle.py::test_a_log_collected_unclosed_warns_and_keeps_its_records",
    "tests/persistlog/write/test_lifecycle.py::test_nothing_keeps_an_unreferenced_log_alive",
]


@pytest.mark.slow
@pytest.mark.parametrize("order", ["secondary_first", "lifecycle_first"])
def test_secondary_and_lifecycle_tests_pass_in_either_order(order: str) -> None:
    ids = [LEAVES_A_THREAD, *COUNTS_THREADS]
    if order == "lifecycle_first":
        ids = [*COUNTS_THREADS, LEAVES_A_THREAD]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *ids],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "4 passed" in proc.stdout, proc.stdout[-2000:]

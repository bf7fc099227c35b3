"""A short run of the SIGKILL soak (tests/soak.py): real writer processes killed at random
moments, on local and S3 (moto) lanes; every restore checked; no acknowledged update lost.

``make soak`` runs the long version; this one takes about half a minute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from crash_matrix import ROOT

SECONDS = float(os.environ.get("PERSISTLOG_SOAK_SECONDS", "25"))


@pytest.mark.slow
@pytest.mark.s3
def test_short_soak_loses_nothing(tmp_path: Path) -> None:
    pytest.importorskip("moto.server")
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "soak.py"), "--iterations", "60", "--seconds", str(SECONDS), "--min-acknowledged", "2000",
         "--destinations", "local,s3", "--seed", "20240601", "--json", str(out), "--quiet",
         "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=2 * SECONDS + 240, cwd=ROOT,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    problems = "\n".join(figures["problems"])
    assert figures["updates_lost"] == 0, problems
    assert figures["check_failures"] == 0, problems
    assert figures["child_errors"] == 0, problems
    assert figures["secondary_restore_errors"] == 0, problems
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert figures["iterations"] >= 8 and figures["kills"] >= 8
    assert set(figures["lanes"]) == {"local", "local+s3", "s3+local", "s3"}
    assert figures["updates_acknowledged"] > 1000
    assert figures["restores_checked"] == figures["iterations"]


@pytest.mark.slow
@pytest.mark.s3
def test_writer_killed_again_and_again_on_the_same_secondary(tmp_path: Path) -> None:
    """The lanes with a secondary only: every restarted writer finds its secondary behind
    and (on S3) still leased by the killed one (lease_ttl 1.5 s); every restore of it
    gives a prefix of the updates, never an error."""
    pytest.importorskip("moto.server")
    out = tmp_path / "soak.json"
    seconds = min(SECONDS, 20.0)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "soak.py"), "--iterations", "40", "--seconds", str(seconds),
         "--destinations", "local,s3", "--lanes", "local+s3,s3+local", "--seed", "20261126", "--json", str(out),
         "--quiet", "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=seconds + 240, cwd=ROOT,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    problems = "\n".join(figures["problems"])
    assert set(figures["lanes"]) == {"local+s3", "s3+local"}
    assert figures["kills"] >= 4 and figures["secondary_restores_checked"] == figures["iterations"]
    assert figures["secondary_restore_errors"] == 0 and figures["check_failures"] == 0, problems
    assert figures["updates_lost"] == 0 and figures["child_errors"] == 0, problems
    assert figures["secondary_lag"]["records"]["n"] == figures["iterations"]
    assert proc.returncode == 0, proc.stdout[-3000:]

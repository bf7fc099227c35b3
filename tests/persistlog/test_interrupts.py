"""Ctrl-C reaches the app, and the Log stays usable and loses nothing acknowledged."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import persistlog
from plhelpers import is_sealed_log

PROCS = Path(__file__).parent / "procs"


def _interrupt_repeatedly(tmp_path: Path, durability: str, seconds: float) -> tuple[dict[str, Any], list[Any]]:
    url = str(tmp_path / "log")
    stop, result = tmp_path / "stop", tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROCS), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen(
        [sys.executable, str(PROCS / "interrupted_writer.py"), url, durability, str(stop), str(result)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert child.stdout is not None
    try:
        assert child.stdout.readline() == "READY\n", child.communicate()[1]
        rng = random.Random(durability)
        deadline = time.monotonic() + seconds
        sent = 0
        while time.monotonic() < deadline and child.poll() is None:
            child.send_signal(signal.SIGINT)
            sent += 1
            time.sleep(rng.uniform(0.0005, 0.004))
        time.sleep(0.2)
        stop.touch()
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    report = json.loads(result.read_text())
    assert report["interrupts"] >= min(50, sent // 10), (report, sent)
    records: list[Any] = []
    restored = persistlog.restore(url, records.append)
    assert restored.torn_tail is None and is_sealed_log(url, restored.logs[-1])
    return report, records


@pytest.mark.parametrize("durability", ["fsync", "flush", "buffered"])
def test_sigint_during_updates_propagates_and_loses_nothing(tmp_path: Path, durability: str) -> None:
    """SIGINT over and over during update()/update_many()/sync()/rotate(): every
    KeyboardInterrupt reaches the app as itself, the app goes on with the same Log and
    closes it, and the restore holds every acknowledged record, in order, with no hole
    (an interrupted record may be there once more, as the app tried it again)."""
    report, records = _interrupt_repeatedly(tmp_path, durability, seconds=4.0)
    acked = report["acked"]
    # The restore starts at the newest complete log: updates written between its start and
    # its snapshot record come first, and the snapshot covers them (or they are attempts,
    # interrupted, at the record it says comes next).
    first = next(n for n, r in enumerate(records) if "upto" in r)
    early = [r["i"] for r in records[:first]]
    assert all(i <= records[first]["upto"] for i in early), (early, records[first])
    have = 0  # records 0..have-1 are in the log, in order
    repeats = 0
    for r in records[first:]:
        if "upto" in r:
            assert r["upto"] >= have, (r, have)  # a snapshot never goes back
            have = r["upto"]
        elif r["i"] == have:
            have += 1
        else:
            assert r["i"] < have, f"record {r['i']} follows record {have - 1}: a hole"
            repeats += 1
    assert acked <= have <= acked + 2, (acked, have)
    assert repeats <= report["interrupts"], (repeats, report)

"""``python -m spark_replay URL --out DIR --follow``: a real process, stopped by Ctrl-C
(SIGINT to its process group, as a terminal sends it) and rerun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pyarrow.dataset as ds
import pytest

import persistlog
from spark_replay._job import main


def event_lsns(out: str) -> list[int]:
    """LSNs of the committed Parquet files (files a query never committed start with _ or .)."""
    path = os.path.join(out, "events")
    if not os.path.isdir(path):
        return []
    try:
        table = ds.dataset(path, format="parquet", partitioning="hive").to_table(columns=["lsn"])
    except (OSError, ValueError):  # a file being written
        return []
    return sorted(table.column("lsn").to_pylist())


def write(url: str, n: int) -> int:
    """``n`` more puts on the store at ``url``; the last LSN."""
    store = persistlog.ResourceStore.open(url, rotate_bytes=None)
    for i in range(n):
        store[f"k{i % 7}"] = {"i": i}
    store.log.rotate()
    last = int(store.log.next_lsn) - 1
    store.close()
    return last


def follow_until(url: str, out: str, last_lsn: int) -> subprocess.CompletedProcess[str]:
    """Run the job until every LSN up to ``last_lsn`` is written, then Ctrl-C it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_replay", url, "--out", out, "--follow", "--trigger", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            got = event_lsns(out)
            if got and got[-1] >= last_lsn:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.spark
def test_follow_stops_cleanly_on_ctrl_c_and_resumes_without_duplicates(tmp_path: Any) -> None:
    url, out = str(tmp_path / "log"), str(tmp_path / "out")
    last = write(url, 30)
    run = follow_until(url, out, last)
    assert run.returncode == 0, run.stderr
    assert "stopped following" in run.stdout
    assert "Traceback" not in run.stderr and "\tat " not in run.stderr, run.stderr
    first = event_lsns(out)[0]
    last = write(url, 25)  # restore, then more records and a rotation
    run = follow_until(url, out, last)
    assert run.returncode == 0, run.stderr
    lsns = event_lsns(out)
    assert lsns == list(range(first, last + 1))


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--follow", "--as-of-lsn", "3"], "--follow writes events/ only"),
        (["--follow", "--overwrite"], "resumes from its checkpoint"),
        (["--follow", "--trigger", "0"], "--trigger must be a positive"),
        (["--checkpoint", "x"], "are for --follow"),
    ],
)
def test_follow_arguments_are_checked_before_spark_starts(tmp_path: Any, capsys: Any, extra: list[str], message: str) -> None:
    assert main([str(tmp_path), "--out", str(tmp_path / "out"), *extra], spark=object()) == 2
    assert message in capsys.readouterr().err

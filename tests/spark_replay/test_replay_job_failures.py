"""The replay job's failures: one line on stderr, a non-zero exit, no output left behind."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from spark_replay._job import main
from log_histories import flip_byte, segment_paths, write_store_history


def _leftovers(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if ".partial-" in n)


def _log_and_earlier_output(tmp_path: Path, name: str) -> tuple[str, Path]:
    """A small ResourceStore log, and an --out directory holding one file ``name``."""
    url = str(tmp_path / "log")
    write_store_history(url, rounds=1, keys=5)
    out = tmp_path / "audit"
    out.mkdir()
    (out / name).write_text("earlier")
    return url, out


@pytest.mark.spark
def test_a_corrupt_log_fails_in_one_line_and_leaves_no_output(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    write_store_history(url, rounds=2, keys=10)
    first = segment_paths(url)[0]
    flip_byte(first, os.path.getsize(first) // 2)
    out = tmp_path / "audit"
    proc = subprocess.run(
        [sys.executable, "-m", "spark_replay", url, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    (line,) = lines
    assert line.startswith("error: CorruptLogError: ")
    assert f"destination {url}" in line and os.path.basename(first) in line and "offset" in line
    assert f"persistlog verify {url}" in line and "--recovery skip" in line
    assert proc.stdout == ""
    assert not out.exists() and _leftovers(tmp_path) == []


def test_an_existing_out_is_refused_before_any_work(tmp_path: Path, capsys: Any) -> None:
    url, out = _log_and_earlier_output(tmp_path, "mine.txt")
    # No Spark session at all: the refusal comes before one would be used.
    assert main([url, "--out", str(out)], spark=object()) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists: pass --overwrite" in err
    assert (out / "mine.txt").read_text() == "earlier"
    assert _leftovers(tmp_path) == []


@pytest.mark.spark
def test_overwrite_replaces_the_output_whole(spark: Any, tmp_path: Path) -> None:
    url, out = _log_and_earlier_output(tmp_path, "stale.txt")
    assert main([url, "--out", str(out), "--overwrite", "-q"], spark=spark, stdout=io.StringIO()) == 0
    assert sorted(os.listdir(out)) == ["events", "state"]
    assert ds.dataset(str(out / "state"), format="parquet").count_rows() > 0
    assert _leftovers(tmp_path) == []


@pytest.mark.spark
def test_a_failed_run_removes_its_partial_output(spark: Any, tmp_path: Path, capsys: Any) -> None:
    url, out = _log_and_earlier_output(tmp_path, "previous.txt")
    first = segment_paths(url)[0]
    flip_byte(first, os.path.getsize(first) // 2)
    assert main([url, "--out", str(out), "--overwrite", "-q"], spark=spark, stdout=io.StringIO()) == 1
    assert "CorruptLogError" in capsys.readouterr().err
    # The earlier output is untouched and nothing half-written is left beside it.
    assert sorted(os.listdir(out)) == ["previous.txt"]
    assert _leftovers(tmp_path) == []

"""The Spark reader on a healthy zstd log, without ``zstandard``: MissingDependencyError
naming the extra to install, never CorruptLogError, never a row of the corrupt view.

The partition reader runs here as executors run it, with the package hidden from this
interpreter; the replay job runs as a real Spark application in a child process whose
Python workers cannot import it either.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import persistlog
from spark_replay._options import ReadOptions
from spark_replay._plan import plan
from spark_replay._scan import read_problems, read_records

HINT = "pip install 'persistlog[zstd]'"


def write_zstd_log(url: str) -> None:
    lg = persistlog.open(url, lambda emit: None, compression="zstd", batch_bytes=4096)
    for i in range(300):
        lg.update({"op": "put", "key": i % 40, "value": {"i": i, "pad": "x" * 50}})
    lg.close()


@pytest.mark.slow
@pytest.mark.parametrize("view, recovery", [("records", "strict"), ("records", "skip"), ("corrupt", "skip")])
def test_partitions_raise_missing_dependency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, view: str, recovery: str
) -> None:
    url = str(tmp_path / "log")
    write_zstd_log(url)
    opts = ReadOptions.parse({"path": url, "recovery": recovery, "view": view})
    read = read_problems if view == "corrupt" else read_records
    monkeypatch.setitem(sys.modules, "zstandard", None)
    parts = plan(opts)
    assert parts
    with pytest.raises(persistlog.MissingDependencyError, match=r"pip install 'persistlog\[zstd\]'") as info:
        for part in parts:
            list(read(part))
    assert not isinstance(info.value, persistlog.CorruptLogError)
    monkeypatch.delitem(sys.modules, "zstandard")
    rows = [row for part in parts for row in read(part)]
    assert rows if view == "records" else not rows  # readable, and undamaged, with it


@pytest.mark.spark
def test_the_replay_job_fails_in_one_line_naming_the_extra(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    write_zstd_log(url)
    blocker = tmp_path / "no-zstandard"
    blocker.mkdir()
    (blocker / "zstandard.py").write_text('raise ImportError("zstandard is hidden by this test")\n')
    env: dict[str, Any] = dict(os.environ)
    # Inherited by Spark's JVM and from it by every Python worker it starts.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(blocker), env.get("PYTHONPATH")]))
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    proc = subprocess.run(
        [sys.executable, "-m", "spark_replay", url, "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors and "MissingDependencyError" in errors[-1] and HINT in errors[-1], proc.stderr[-3000:]
    assert "CorruptLogError" not in proc.stderr


@pytest.mark.slow
def test_import_without_pyspark_names_the_extra_to_install() -> None:
    code = "import sys; sys.modules['pyspark'] = None; import spark_replay"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last == (
        "persistlog.MissingDependencyError: spark_replay needs PySpark (and pyarrow): "
        "pip install 'persistlog[spark]'"
    )


def test_dir_shows_the_public_names_only() -> None:
    import spark_replay

    assert dir(spark_replay) == sorted(spark_replay.__all__)

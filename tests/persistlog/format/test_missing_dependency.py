"""A missing optional package is never corruption: a healthy zstd log read by an
interpreter without ``zstandard`` raises MissingDependencyError naming the extra to
install, in strict and skip mode alike, from restore and from followers.

``zstandard`` is hidden from a child interpreter (``sys.modules["zstandard"] = None``), as
if it were not installed; the log itself is written here, with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import persistlog
from childproc import run_json


def write_zstd_log(url: str, n: int = 200) -> list[Any]:
    records = [{"op": "put", "key": i, "value": "v" * 64} for i in range(n)]
    lg = persistlog.open(url, lambda emit: None, compression="zstd", batch_bytes=4096)
    for r in records:
        lg.update(r)
    lg.close()
    return records


READ_WITHOUT_ZSTANDARD = """
    import json, sys
    import persistlog

    url, how = sys.argv[1], sys.argv[2]
    got = []
    try:
        if how == "follow":
            follower = persistlog.follow(url, got.append, poll_interval=0.05)
            for _ in follower:
                pass
        else:
            persistlog.restore(url, got.append, recovery=how)
        out = {"raised": None}
    except Exception as e:
        out = {
            "raised": type(e).__name__,
            "message": str(e),
            "persistlog": isinstance(e, persistlog.PersistLogError),
            "corrupt": isinstance(e, persistlog.CorruptLogError),
            "import_error": isinstance(e, ImportError),
            "extra": getattr(e, "extra", None),
            "name": getattr(e, "name", None),
        }
    out["replayed"] = len(got)
    print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["strict", "skip", "follow"])
def test_a_zstd_log_without_zstandard_is_not_corrupt(tmp_path: Path, how: str) -> None:
    url = str(tmp_path / "log")
    records = write_zstd_log(url)
    out = run_json(READ_WITHOUT_ZSTANDARD, url, how, hide=["zstandard"])
    assert out["raised"] == "MissingDependencyError"
    assert out["persistlog"] and out["import_error"] and not out["corrupt"]
    assert out["extra"] == "zstd" and out["name"] == "zstandard"
    assert "pip install 'persistlog[zstd]'" in out["message"]
    assert url in out["message"] and "log 1" in out["message"]  # where it stopped
    assert out["replayed"] == 0  # skip mode does not pass over what it cannot read

    # The log is healthy: with the package, everything restores.
    got: list[Any] = []
    persistlog.restore(url, got.append)
    assert got == records


OPEN_WITHOUT_ZSTANDARD = """
    import json, sys
    import persistlog

    try:
        persistlog.open(sys.argv[1], lambda emit: None, compression="zstd")
        out = {"raised": None}
    except ImportError as e:
        out = {"raised": type(e).__name__, "message": str(e)}
    print(json.dumps(out))
"""


@pytest.mark.slow
def test_writing_zstd_without_zstandard_says_what_to_install(tmp_path: Path) -> None:
    out = run_json(OPEN_WITHOUT_ZSTANDARD, str(tmp_path / "log"), hide=["zstandard"])
    assert out["raised"] == "ImportError" and "pip install 'persistlog[zstd]'" in out["message"]
    assert not (tmp_path / "log").exists()


@pytest.mark.slow
def test_a_gzip_or_plain_log_needs_no_zstandard(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    lg = persistlog.open(url, lambda emit: None, compression="gzip")
    for i in range(50):
        lg.update({"i": i, "pad": "x" * 100})
    lg.close()
    out = run_json(READ_WITHOUT_ZSTANDARD, url, "strict", hide=["zstandard"])
    assert out["raised"] is None and out["replayed"] == 50

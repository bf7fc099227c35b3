"""What a Python user expects of any library: reprs, logging under one logger, types."""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import persistlog


def test_reprs_say_what_and_where(log_dir: str) -> None:
    store = persistlog.ResourceStore()
    assert repr(store) == "<persistlog.ResourceStore 0 keys, not open>"
    store = persistlog.ResourceStore.open(log_dir)
    store["a"] = 1
    store["b"] = 2
    assert repr(store) == f"<persistlog.ResourceStore {log_dir!r} 2 keys log=1 open>"
    assert repr(store.log).startswith(f"<persistlog.Log {log_dir!r} log=1 next_lsn=")
    store.close()
    assert repr(store).endswith("log=1 closed>")
    follower = persistlog.follow(log_dir, lambda r: None)
    assert repr(follower) == f"<persistlog.Follower {log_dir!r} cursor=None applied=0 lag=0 idle>"
    follower.poll()
    cursor = follower.cursor
    assert cursor is not None
    assert repr(follower) == f"<persistlog.Follower {log_dir!r} cursor={cursor} applied=2 lag=0 idle>"
    assert repr(cursor) == (
        f"Cursor(log={cursor.log}, segment={cursor.segment}, offset={cursor.offset}, next_lsn={cursor.next_lsn})"
    )
    with follower:
        assert follower.wait_caught_up(30)
        assert repr(follower).endswith(" running>")


def test_the_drivers_log_under_the_persistlog_logger(log_dir: str, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG, logger="persistlog")
    with persistlog.open(log_dir, lambda emit: None):
        pass
    names = {r.name for r in caplog.records}
    assert any(n.startswith("persistlog.destinations.") for n in names), names
    assert all(n == "persistlog" or n.startswith("persistlog.") for n in names), names


def test_every_driver_logger_is_under_persistlog() -> None:
    root = pathlib.Path(__file__).parents[2] / "destinations"
    for path in root.glob("*.py"):
        for line in path.read_text().splitlines():
            if "getLogger(" in line:
                assert 'getLogger("persistlog.' in line, f"{path.name}: {line.strip()}"


@pytest.mark.slow
def test_the_installed_package_is_typed_for_users_scripts(tmp_path: pathlib.Path) -> None:
    """mypy, run on a script outside the repository, finds the installed package and its
    types (PEP 561): a wrong type is an error, not an unknown module."""
    pytest.importorskip("mypy")
    script = tmp_path / "app.py"
    script.write_text(
        textwrap.dedent(
            """
            import persistlog

            store = persistlog.ResourceStore.open("/tmp/x")
            lsn: int = store.log.update({"a": 1})
            wrong: str = store.log.update({"a": 1})
            typo = persistlog.ResourceStore.open("/tmp/x", durabilty="fsync")
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert "import-not-found" not in proc.stdout and "import-untyped" not in proc.stdout, proc.stdout
    assert 'app.py:6: error: Incompatible types in assignment (expression has type "int", variable has type "str")' in proc.stdout
    # A misspelt option of ResourceStore.open is a type error, not an Any that passes.
    assert 'app.py:7: error: Unexpected keyword argument "durabilty"' in proc.stdout, proc.stdout
    assert "Found 2 errors" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_the_readme_codec_blocks_pass_mypy_strict(tmp_path: pathlib.Path) -> None:
    """The typed example users copy first type-checks under ``--strict`` as written."""
    pytest.importorskip("mypy")
    import re

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"^```python\n(.*?)^```", readme, re.M | re.S) if "Codec" in b]
    assert len(blocks) >= 2  # the registration and the schema change
    script = tmp_path / "shop.py"
    script.write_text("\n".join(blocks))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--follow-imports=silent", str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0 and "Success" in proc.stdout, proc.stdout


def test_the_named_options_are_exactly_opens_keyword_options() -> None:
    """OpenOptions (open_async's) and StoreOptions (ResourceStore.open's) cannot drift
    from open()'s signature."""
    import inspect

    keywords = {n for n, p in inspect.signature(persistlog.open).parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert set(persistlog.OpenOptions.__annotations__) == keywords
    assert set(persistlog.StoreOptions.__annotations__) == keywords - {"replay", "replay_batch", "concurrent_enumeration"}

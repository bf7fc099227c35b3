"""Fixtures of the CLI tests: a destination written once per session, copied per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_logs import KV, write_logs


@pytest.fixture(scope="session")
def _template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, KV]:
    root = tmp_path_factory.mktemp("template")
    kv = write_logs(str(root / "log"), updates=600, rotate_every=200)
    return root / "log", kv


@pytest.fixture
def logdir(_template: tuple[Path, KV], tmp_path: Path) -> str:
    """A local destination with three sealed logs (1, 2, 3) of several segments each."""
    target = tmp_path / "log"
    shutil.copytree(_template[0], target)
    return str(target)


@pytest.fixture
def expected(_template: tuple[Path, KV]) -> dict:
    """The state the destination restores to."""
    return dict(_template[1].data)

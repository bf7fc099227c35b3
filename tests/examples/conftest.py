"""Fixtures of the example tests: how to run an example as a child process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def run_example():  # type: ignore[no-untyped-def]
    """``run_example("kvstore.py", *args)`` -> CompletedProcess (text), with a timeout."""

    def run(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, timeout=timeout
        )

    return run

"""Fixtures of the example tests: how to run an example as a child process."""

from __future__ import annotations

import pytest
from example_scripts import run_example as _run_example


@pytest.fixture
def run_example():  # type: ignore[no-untyped-def]
    """``run_example("kvstore.py", *args)`` -> CompletedProcess (text), with a timeout."""
    return _run_example

"""Fixtures of the Spark replay tests: one local Spark session per run, and log helpers.

Spark starts once (about ten seconds) and is shared by every test that asks for
``spark``; tests that only need the planner or the partition reader run without it.
Helpers that write and damage logs are in ``log_histories.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A ``local[2]`` session with the ``persistlog`` source registered."""
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    from sparksession import shared_session

    session = shared_session()
    yield session
    session.stop()

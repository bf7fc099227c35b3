"""Fixtures of the reliability suite (tests/reliability): see docs/RELIABILITY.md."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import crash_matrix  # noqa: F401 - puts tests/ on sys.path for crashsim and faults


@pytest.fixture(autouse=True)
def _quiet_persistlog_logging() -> Iterator[None]:
    # Injected faults make the library log errors by design; keep them out of the output.
    logger = logging.getLogger("persistlog")
    old = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(old)

"""Fixtures of the core log tests (hypothesis profiles live in ``hypothesis_profiles``)."""

from __future__ import annotations

import pytest


@pytest.fixture
def log_dir(tmp_path):  # type: ignore[no-untyped-def]
    """A not-yet-existing destination directory (open() must create it)."""
    return str(tmp_path / "log")

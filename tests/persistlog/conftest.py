"""Fixtures of the core log tests (hypothesis profiles live in ``hypothesis_profiles``)."""

from __future__ import annotations

import pytest


@pytest.fixture
def log_dir(tmp_path):  # type: ignore[no-untyped-def]
    """A not-yet-existing destination directory (open() must create it)."""
    return str(tmp_path / "log")


@pytest.fixture(params=["c", "python"])
def batch_checks(request, monkeypatch):  # type: ignore[no-untyped-def]
    """Run a test twice: with the batches the reader meets checked in C by the decoder
    (in C), and with every batch checked by the Python checks alone, as without the C
    accelerator (``pytestmark = pytest.mark.usefixtures("batch_checks")``)."""
    from persistlog._format import decoder

    if request.param == "c":
        if decoder._checked_batches is None:
            pytest.skip("the C accelerator is not built")
    else:
        monkeypatch.setattr(decoder, "_checked_batches", None)
    return request.param

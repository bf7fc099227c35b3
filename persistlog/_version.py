"""The installed package's version, as ``persistlog.__version__`` and the CLI's ``--version``
give it."""

from __future__ import annotations

import importlib.metadata


def package_version() -> str:
    """The installed distribution's version ("unknown" when run from a tree never installed)."""
    try:
        return importlib.metadata.version("persistlog")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


__all__ = ["package_version"]

"""The directories directly under a directory URL: what a tree of destinations is walked with.

A destination holds flat files (``Destination.list`` lists only those); a log set lays its
destinations out in a tree of directories, and walks it one level at a time. Locally that
is one ``scandir``; on any fsspec filesystem one ``ls`` of the directory, which on S3 is
``ListObjectsV2`` with ``Delimiter="/"``: one request per 1,000 entries of that level,
however many objects lie deeper. Listings are never served from fsspec's cache.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec  # type: ignore[import-untyped,unused-ignore]

from ._registry import destination_url, split_protocol
from ._retry import RetryPolicy
from .local import path_from_url


def subdirectories(url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """Names of the directories directly under ``url``, sorted; ``[]`` when it is missing
    (or, on S3, holds nothing). ``storage_options`` go to fsspec untouched. A storage
    failure is an ``OSError``, after the retries of transient ones."""
    url = destination_url(url)
    protocol, rest = split_protocol(url)
    if protocol in ("file", "local"):
        return _local(path_from_url(url))
    fs = fsspec.filesystem(protocol, **(storage_options or {}))
    root = fs._strip_protocol(f"{protocol}://{rest}").rstrip("/")

    def ls() -> list[dict[str, Any]]:
        fs.invalidate_cache(root)
        try:
            return list(fs.ls(root, detail=True))
        except (FileNotFoundError, NotADirectoryError):
            return []

    try:
        entries = RetryPolicy().call(ls, f"listing the directories of {url}")
    except OSError:
        raise
    except Exception as e:
        # Client-library errors leave this package as built-ins, as the drivers' do.
        raise OSError(f"listing the directories of {url}: {type(e).__name__}: {e}") from e
    return sorted(
        e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory"
    )


def _local(path: str) -> list[str]:
    try:
        with os.scandir(path) as it:
            return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []

"""The directories directly under a directory URL: what a tree of destinations is walked with.

A destination holds flat files (``Destination.list`` lists only those); a log set lays its
destinations out in a tree of directories, and walks it one level at a time. Locally that
is one ``scandir``; on any fsspec filesystem one ``ls`` of the directory, which on S3 is
``ListObjectsV2`` with ``Delimiter="/"``: one request per 1,000 entries of that level,
however many objects lie deeper. Listings are never served from fsspec's cache.

The directory is opened as a destination (``open_destination``), so its storage options
mean what they mean to the driver (its own ``persistlog`` option, the S3 client settings)
and its retry policy applies.
"""

from __future__ import annotations

import os
from typing import Any

def subdirectories(url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """Names of the directories directly under ``url``, sorted; ``[]`` when it is missing
    (or, on S3, holds nothing). A storage failure is an ``OSError``, after the retries of
    transient ones."""
    # Imported here: the package imports its drivers lazily (fsspec only when needed).
    from . import open_destination
    from .local import LocalDestination

    dest = open_destination(url, **(storage_options or {}))
    try:
        if isinstance(dest, LocalDestination):
            return _local(dest.path)
        from .objectstore import ObjectStoreDestination

        if not isinstance(dest, ObjectStoreDestination):
            raise ValueError(f"{dest.url}: cannot list the directories of a {type(dest).__name__}")
        fs, root = dest.fs, dest.root

        def ls() -> list[dict[str, Any]]:
            fs.invalidate_cache(root)
            try:
                return list(fs.ls(root, detail=True))
            except (FileNotFoundError, NotADirectoryError):
                return []

        try:
            entries = dest.retry_policy.call(ls, f"listing the directories of {dest.url}")
        except OSError:
            raise
        except Exception as e:
            # Client-library errors leave this package as built-ins, as the drivers' do.
            raise OSError(f"listing the directories of {dest.url}: {type(e).__name__}: {e}") from e
        return sorted(
            e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory"
        )
    finally:
        dest.close()


def _local(path: str) -> list[str]:
    try:
        with os.scandir(path) as it:
            return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []

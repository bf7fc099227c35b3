"""Destination drivers for persistlog: where log files live.

One entry point builds every destination::

    dest = open_destination("s3://bucket/app/log", key=..., secret=...)

The driver is chosen from the URL's protocol through a lazy registry: plain paths and
``file://`` get :class:`~destinations.local.LocalDestination` (true append, fsync, lock
file); ``memory://``, ``s3://``/``s3a://`` and every other protocol fsspec knows get
:class:`~destinations.objectstore.ObjectStoreDestination` (whole, create-only objects and a
lease). ``storage_options`` go untouched to ``fsspec.filesystem(protocol, **options)``.

A destination is fully described by ``(dest.url, dest.storage_options)``: another process
(a Spark executor, a follower) rebuilds an equivalent one with
``open_destination(url, **storage_options)``.

This package imports neither ``persistlog`` nor ``spark_replay`` and raises built-in
exceptions only (plus :class:`LockHeld`, a ``BlockingIOError``).
"""

from __future__ import annotations

import os as _os
from typing import Any

from ._base import AppendFile, Destination, LockHeld, WriterLock
from ._dirs import subdirectories
from ._owner import HOLDER_NAMES, HolderRecord
from ._registry import available, destination_url, driver_for, register, split_protocol, with_hint

__all__ = [
    "AppendFile",
    "Destination",
    "HOLDER_NAMES",
    "HolderRecord",
    "LockHeld",
    "WriterLock",
    "available",
    "destination_url",
    "open_destination",
    "register",
    "subdirectories",
]


def open_destination(url: str | _os.PathLike[str], **storage_options: Any) -> Destination:
    """Build the destination for ``url``, choosing the driver from its protocol.

    ``url`` is a string or any ``os.PathLike`` (a ``pathlib.Path``); another type is a
    ``TypeError``, an empty string a ``ValueError``. Raises ``ValueError`` for an unknown
    protocol (naming the nearest known one) and
    ``ImportError`` with an install hint when the driver's dependencies are missing
    (``s3://`` needs ``pip install 'persistlog[s3]'``). Nothing is created: call
    :meth:`Destination.ensure` to make the directory.
    """
    url = destination_url(url)
    protocol, _ = split_protocol(url)
    cls, hint = driver_for(protocol)
    try:
        return cls(url, storage_options)
    except ImportError as e:
        raise ImportError(with_hint(str(e), hint, protocol)) from e


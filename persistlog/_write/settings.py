"""What ``open()`` is given for writing, checked: the write options of one Log
(:class:`LogSettings`) and a destination from its URL and storage options
(:func:`destination_at`, for the primary, each secondary and a queue's reader)."""

from __future__ import annotations

import os
from typing import Any

from destinations import Destination, open_destination

from .._format import constants as F
from .._format.crypt import Keyring

DURABILITY_MODES = ("buffered", "flush", "fsync")
COMPRESSIONS = {None: F.COMPRESSION_NONE, "gzip": F.COMPRESSION_GZIP, "zstd": F.COMPRESSION_ZSTD}


def destination_at(url: str | os.PathLike[str], storage_options: dict[str, Any] | None) -> Destination:
    """The destination at ``url``, with ``storage_options`` checked to be a dict."""
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options must be a dict, not {type(storage_options).__name__}")
    return open_destination(url, **(storage_options or {}))


class LogSettings:
    """Validated write options of one Log."""

    __slots__ = ("durability", "batch_bytes", "segment_bytes", "flush_interval", "compression", "compression_name", "keys",
                 "share_values")

    def __init__(
        self,
        *,
        durability: str,
        batch_bytes: int,
        segment_bytes: int,
        flush_interval: float | None,
        compression: str | None,
        keys: Keyring | None = None,
        share_values: bool = True,
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, not {durability!r}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be None, 'gzip' or 'zstd', not {compression!r}")
        if compression == "zstd":
            try:
                import zstandard  # noqa: F401
            except ImportError:
                raise ImportError("compression='zstd' needs the zstd extra: pip install 'persistlog[zstd]'") from None
        for name, value, low in (
            ("batch_bytes", batch_bytes, 1),
            ("segment_bytes", segment_bytes, 4096),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, not {value!r}")
        if batch_bytes > F.MAX_BATCH_BYTES // 2:
            raise ValueError(f"batch_bytes must be at most {F.MAX_BATCH_BYTES // 2}")
        if not isinstance(share_values, bool):
            raise TypeError(f"share_values must be True or False, not {share_values!r}")
        if flush_interval is not None and (not isinstance(flush_interval, (int, float)) or flush_interval <= 0):
            raise ValueError(f"flush_interval must be a positive number of seconds or None, not {flush_interval!r}")
        self.durability = durability
        self.batch_bytes = batch_bytes
        self.segment_bytes = segment_bytes
        self.flush_interval = flush_interval
        self.compression = COMPRESSIONS[compression]
        self.compression_name = compression
        #: The keys record batches are sealed with (None: not encrypted).
        self.keys = keys
        #: Whether a chained log stores a large value its snapshot records repeat once.
        self.share_values = share_values


__all__ = ["COMPRESSIONS", "DURABILITY_MODES", "LogSettings", "destination_at"]

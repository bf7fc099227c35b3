"""``persistlog.restore``: the read side's entry point."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from destinations import open_destination

from ._codec import Codec
from ._errors import DestinationError, PersistLogError
from ._restore import RestoreResult, restore_from


def restore(
    url: str | os.PathLike[str],
    replay: Callable[[Any], Any] | None = None,
    *,
    replay_batch: Callable[[list[Any]], Any] | None = None,
    recovery: str = "strict",
    missing_ok: bool = True,
    codec: Codec | None = None,
    storage_options: dict[str, Any] | None = None,
) -> RestoreResult:
    """Replay the newest complete log at ``url`` and every newer one, in LSN order.

    ``replay(record)`` is called once per record (or ``replay_batch(records)`` once per
    batch). A torn tail left by a crash is dropped and reported in the result; any other
    damage raises :class:`CorruptLogError` naming destination, log, segment and offset
    (``recovery="skip"`` passes over damage and lists it in ``result.skipped``). A missing
    or empty destination returns ``found=False`` (or raises :class:`LogNotFoundError` with
    ``missing_ok=False``). Memory stays bounded by the largest batch.
    """
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options must be a dict, not {type(storage_options).__name__}")
    dest = open_destination(url, **(storage_options or {}))
    try:
        result, _states = restore_from(
            dest, replay, replay_batch=replay_batch, recovery=recovery, missing_ok=missing_ok, codec=codec
        )
    except FileNotFoundError as e:
        if isinstance(e, PersistLogError):
            raise
        raise DestinationError(
            f"a file vanished while restoring from {url} (retention by a running writer?): {e}"
        ) from e
    finally:
        dest.close()
    return result

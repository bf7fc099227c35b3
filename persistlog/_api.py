"""``persistlog.restore``: the read side's entry point."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import os

from destinations import Destination, open_destination
from destinations.local import LocalDestination

from ._codec import Codec
from ._errors import DestinationError, PersistLogError
from ._restore import RestoreResult, restore_from


# Where restore() left each destination in this process: key -> (newest log seq, next LSN).
# open() accepts a destination holding records only if it is still exactly there, i.e. this
# process replayed everything it holds and nothing was written since. Two integers per
# destination ever restored, private to the process; nothing else is kept.
_restored_at: dict[str, tuple[int, int]] = {}


def destination_key(dest: Destination) -> str:
    """One name per place: a local directory by its real path, others by their URL."""
    if isinstance(dest, LocalDestination):
        return "local:" + os.path.realpath(dest.path)
    return dest.url.rstrip("/")


def restored_here(dest: Destination, position: tuple[int, int]) -> bool:
    """Whether this process's last restore of ``dest`` ended at ``position`` (newest log
    seq, next LSN): then open() may start a new log over what is there."""
    return _restored_at.get(destination_key(dest)) == position


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

    ``replay(record)`` is called once per record (or ``replay_batch(records)`` with lists
    of records in LSN order: a stored batch comes as one list or several, slices that fit
    in the CPU cache). The cyclic GC is paused while the logs are replayed: the records
    decode acyclic, and only cycles the app makes meanwhile wait for it. A torn tail left by a crash is dropped and reported in the result; any other
    damage raises :class:`CorruptLogError` naming destination, log, segment and offset
    (``recovery="skip"`` passes over damage and lists it in ``result.skipped``). A missing
    or empty destination returns ``found=False`` (or raises :class:`LogNotFoundError` with
    ``missing_ok=False``). Memory stays bounded by the largest batch.

    The process remembers where the restore ended, so that a later ``open(url, ...)`` in
    the same process, with nothing written in between, may start a new log there.
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
    if result.logs:
        _restored_at[destination_key(dest)] = (result.logs[-1], result.next_lsn)
    return result

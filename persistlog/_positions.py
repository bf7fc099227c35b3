"""Consumer positions stored beside a log: one small ``CONSUMER-<name>`` file per named
consumer (docs/FORMAT.md), replaced whole and atomically at each commit.

The files are what makes a consumer *registered*: :class:`persistlog.ConsumerGroup` reads
them to resume, and retention with ``keep_for_consumers=True`` reads them to keep every
log a registered consumer has not read. Nothing else at a destination depends on them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from destinations import Destination

from . import _encoder
from . import _format as F
from ._decoder import parse_consumer_position
from ._errors import CorruptLogError, DestinationError
from ._follower import Cursor

log = logging.getLogger("persistlog")


@dataclass(frozen=True)
class StoredPosition:
    """What a ``CONSUMER-<name>`` file holds: where the consumer resumes, and when that
    position was committed (seconds since the Unix epoch)."""

    cursor: Cursor
    committed_at: float


def check_consumer_name(name: object) -> str:
    """``name`` if it can name a consumer (a letter or digit, then up to 63 letters,
    digits, ``_``, ``.`` or ``-``); ``TypeError``/``ValueError`` otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"a consumer's name is a str, not {type(name).__name__}")
    if F.CONSUMER_NAME.match(name) is None:
        raise ValueError(
            f"bad consumer name {name!r}: a letter or digit, then up to 63 letters, digits, '_', '.' or '-'"
        )
    return name


def position_file(name: str) -> str:
    """The file that holds consumer ``name``'s position."""
    return F.CONSUMER_PREFIX + name


def write_position(dest: Destination, name: str, cursor: Cursor) -> None:
    """Commit ``cursor`` as consumer ``name``'s position: durable when this returns (temp
    file + fsync + rename + directory fsync locally, one PUT remotely)."""
    data = _encoder.consumer_position(
        cursor.log, cursor.segment, cursor.offset, cursor.next_lsn, int(time.time() * 1e6)
    )
    try:
        dest.replace(position_file(name), data)
    except OSError as e:
        raise DestinationError(f"cannot store the position of consumer {name!r} at {dest.url}: {e}") from e


def read_position(dest: Destination, name: str) -> StoredPosition | None:
    """Consumer ``name``'s committed position; None if it has none stored. A damaged file
    raises :class:`CorruptLogError` naming it: a consumer never silently starts over."""
    file = position_file(name)
    try:
        data = dest.read(file, 0, F.CONSUMER_SIZE + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise DestinationError(f"cannot read {dest.url}/{file}: {e}") from e
    parsed = parse_consumer_position(data)
    if parsed is None:
        raise CorruptLogError(
            f"the position of consumer {name!r} is damaged ({len(data)} bytes); delete the file to start "
            "that consumer over, or hand it a position",
            destination=dest.url, segment=file, offset=0,
        )
    seq, segment, offset, next_lsn, committed_us = parsed
    return StoredPosition(Cursor(seq, segment, offset, next_lsn), committed_us / 1e6)


def delete_position(dest: Destination, name: str) -> None:
    """Forget consumer ``name``: retention no longer keeps anything for it."""
    try:
        dest.delete(position_file(name))
    except OSError as e:
        raise DestinationError(f"cannot delete {dest.url}/{position_file(name)}: {e}") from e


def consumer_names(dest: Destination) -> list[str]:
    """The names of the consumers with a position stored at ``dest``, in order (one
    listing)."""
    try:
        names = dest.list(start_after=F.CONSUMER_PREFIX)
    except OSError as e:
        raise DestinationError(f"cannot list {dest.url}: {e}") from e
    found = []
    for file in names:
        if not file.startswith(F.CONSUMER_PREFIX):
            break  # lexical order: every CONSUMER- name comes before the first that is not one
        name = file[len(F.CONSUMER_PREFIX):]
        if F.CONSUMER_NAME.match(name) is not None:
            found.append(name)
    return found


def stored_positions(dest: Destination) -> dict[str, StoredPosition | None]:
    """Every stored consumer position at ``dest``, by name; None for one that is damaged
    (logged: retention then keeps every log for it, as far as its cap allows)."""
    positions: dict[str, StoredPosition | None] = {}
    for name in consumer_names(dest):
        try:
            positions[name] = read_position(dest, name)
        except CorruptLogError as e:
            log.warning("%s", e)
            positions[name] = None
        # A file deleted between the listing and the read is a consumer just forgotten.
        if name in positions and positions[name] is None and not _still_there(dest, name):
            del positions[name]
    return positions


def _still_there(dest: Destination, name: str) -> bool:
    try:
        dest.size(position_file(name))
        return True
    except OSError:
        return False


__all__ = [
    "StoredPosition",
    "check_consumer_name",
    "consumer_names",
    "delete_position",
    "position_file",
    "read_position",
    "stored_positions",
    "write_position",
]

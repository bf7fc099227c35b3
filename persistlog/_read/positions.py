"""Consumer positions stored beside a log: one small file per named consumer in the
destination's ``consumers/`` directory (docs/FORMAT.md, "consumers/<name>"), replaced whole
and atomically at each commit.

The files are what makes a consumer *registered*: :class:`persistlog.ConsumerGroup` reads
them to resume, and retention with ``keep_for_consumers=True`` reads them to keep every
log a registered consumer has not read. They live in a directory of their own so that the
listing every reader of the log polls stays as short with a thousand consumers as with
none (a local scan lists one directory entry; an S3 listing with ``/`` as delimiter, none).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from destinations import Destination, open_destination

from .._errors import CorruptLogError, DestinationError
from .._format import encoder
from .._format import constants as F
from .._format.decoder import parse_consumer_position
from .cursor import Cursor

logger = logging.getLogger("persistlog")


@dataclass(frozen=True)
class StoredPosition:
    """What a consumer's position file holds: where the consumer resumes, and when that
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


class PositionStore:
    """The consumers' positions of the log at ``dest``: its ``consumers/`` directory."""

    def __init__(self, dest: Destination) -> None:
        self.dest = open_destination(f"{dest.url.rstrip('/')}/{F.CONSUMERS_DIR}", **dest.storage_options)
        self._ensured = False

    def write(self, name: str, cursor: Cursor) -> None:
        """Commit ``cursor`` as consumer ``name``'s position: durable when this returns
        (temp file + fsync + rename + directory fsync locally, one PUT remotely)."""
        data = encoder.consumer_position(
            cursor.log, cursor.segment, cursor.offset, cursor.next_lsn, int(time.time() * 1e6)
        )
        try:
            if not self._ensured:
                self.dest.ensure()
                self._ensured = True
            self.dest.replace(name, data)
        except OSError as e:
            raise DestinationError(f"cannot store the position of consumer {name!r} at {self.dest.url}: {e}") from e

    def read(self, name: str) -> StoredPosition | None:
        """Consumer ``name``'s committed position; None if it has none stored. A damaged
        file raises :class:`CorruptLogError` naming it: a consumer never silently starts
        over."""
        try:
            data = self.dest.read(name, 0, F.CONSUMER_SIZE + 1)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise DestinationError(f"cannot read the position of consumer {name!r} at {self.dest.url}: {e}") from e
        parsed = parse_consumer_position(data)
        if parsed is None:
            raise CorruptLogError(
                f"the position of consumer {name!r} is damaged ({len(data)} bytes); delete the file to start "
                "that consumer over, or hand it a position",
                destination=self.dest.url, segment=name, offset=0,
            )
        seq, segment, offset, next_lsn, committed_us = parsed
        return StoredPosition(Cursor(seq, segment, offset, next_lsn), committed_us / 1e6)

    def delete(self, name: str) -> None:
        """Forget consumer ``name``: retention no longer keeps anything for it."""
        try:
            self.dest.delete(name)
        except OSError as e:
            raise DestinationError(f"cannot delete the position of consumer {name!r} at {self.dest.url}: {e}") from e

    def names(self) -> list[str]:
        """The consumers with a position stored, in order (one listing)."""
        try:
            files = self.dest.list()
        except OSError as e:
            raise DestinationError(f"cannot list {self.dest.url}: {e}") from e
        return [name for name in files if F.CONSUMER_NAME.match(name) is not None]

    def all(self) -> dict[str, StoredPosition | None]:
        """Every stored position, by consumer name; None for one that is damaged (logged:
        retention then keeps every log for it, as far as its cap allows)."""
        positions: dict[str, StoredPosition | None] = {}
        for name in self.names():
            try:
                stored = self.read(name)
            except CorruptLogError as e:
                logger.warning("%s", e)
                positions[name] = None
                continue
            if stored is not None:  # else deleted since the listing: a consumer just forgotten
                positions[name] = stored
        return positions


__all__ = ["PositionStore", "StoredPosition", "check_consumer_name"]

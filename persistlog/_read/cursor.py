"""Cursors: positions in the logs of a destination, as followers and readers keep them.

A cursor names the next byte to read (log seq, segment, byte offset) and the LSN the next
record carries; it is a small string or dict an app keeps beside its own state. Besides
the cursors followers hand out, :meth:`Cursor.earliest`, :meth:`Cursor.at_lsn` and
:meth:`Cursor.at_time` find one from a position (``_read/seek.py``), for :func:`persistlog.follow`
and :func:`persistlog.read`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from destinations import open_destination

from .seek import Place, seek


@dataclass(frozen=True)
class Cursor:
    """Where a follower stands: the next byte to read and the LSN it will carry.

    ``str(cursor)`` / :meth:`Cursor.parse` and :meth:`to_dict` / :meth:`from_dict` give a
    small serialisable form the app can persist next to its replica state.
    """

    log: int
    segment: int
    offset: int
    next_lsn: int

    def __str__(self) -> str:
        return f"{self.log}:{self.segment}:{self.offset}:{self.next_lsn}"

    @classmethod
    def parse(cls, value: str) -> Cursor:
        try:
            parts = [int(p) for p in value.split(":")]
            if len(parts) != 4 or min(parts) < 0:
                raise ValueError
        except (ValueError, AttributeError):
            raise ValueError(f"not a persistlog cursor: {value!r} (expected 'log:segment:offset:next_lsn')") from None
        return cls(*parts)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Cursor:
        try:
            return cls(int(value["log"]), int(value["segment"]), int(value["offset"]), int(value["next_lsn"]))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"not a persistlog cursor: {value!r}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_place(cls, place: Place) -> Cursor:
        """The cursor at a place :mod:`persistlog._read.seek` found."""
        return cls(place.log, place.segment, place.offset, place.lsn)

    @classmethod
    def earliest(cls, url: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None) -> Cursor:
        """The cursor before the oldest record retained at ``url`` (the start of its
        oldest log). Raises :class:`LogNotFoundError` where there is no log."""
        return cls._at(url, None, storage_options)

    @classmethod
    def at_lsn(cls, url: str | os.PathLike[str], lsn: int, *, storage_options: dict[str, Any] | None = None) -> Cursor:
        """The cursor before the record with LSN ``lsn`` at ``url``: a follower or a read
        from it starts with that record. ``lsn`` may be the LSN the next record will take
        (the end: a follower then waits for it). Anything else the logs do not hold
        (before the oldest record retention left, past the end) raises
        :class:`PositionError`, which names what is there. Reads one listing and a few
        headers, never the records before it."""
        return cls._at(url, lsn, storage_options)

    @classmethod
    def at_time(cls, url: str | os.PathLike[str], when: datetime, *,
                storage_options: dict[str, Any] | None = None) -> Cursor:
        """The cursor before the first batch committed at or after ``when`` (an aware
        datetime; commit times are per batch, the writer's wall clock). Later than every
        batch: the end. Before the oldest record retained, when retention deleted older
        ones: :class:`PositionError`."""
        if not isinstance(when, datetime):
            raise TypeError(f"when must be a datetime, not {type(when).__name__}")
        return cls._at(url, when, storage_options)

    @classmethod
    def _at(cls, url: str | os.PathLike[str], position: int | datetime | None,
            storage_options: dict[str, Any] | None) -> Cursor:
        dest = open_destination(url, **(storage_options or {}))
        try:
            return cls.from_place(seek(dest, position)[1])
        finally:
            dest.close()


__all__ = ["Cursor"]

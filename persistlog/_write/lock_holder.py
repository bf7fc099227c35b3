"""Who holds (or last held) a destination's writer lock or lease, read without taking it:
what ``persistlog info`` and ``verify`` say about the writer.

The owner record is parsed by :class:`destinations.HolderRecord`, the one reader of what
the drivers write; this module adds only whether that holder is probably still there.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from destinations import HOLDER_NAMES, Destination, HolderRecord

logger = logging.getLogger("persistlog")


@dataclass
class Holder:
    """Who holds (or last held) the writer lock or lease, as it recorded itself.

    Read without taking the lock. ``alive`` is True/False when the holder is a process on
    this host, None otherwise; ``expires`` is a lease's expiry (Unix seconds).
    """

    name: str
    description: str
    owner: str | None = None
    host: str | None = None
    pid: int | None = None
    since: float | None = None
    expires: float | None = None
    alive: bool | None = None

    @property
    def active(self) -> bool | None:
        """Whether a writer probably holds it right now (None: cannot tell)."""
        if self.expires is not None:
            return self.expires > time.time()
        return self.alive

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "owner": self.owner,
            "host": self.host,
            "pid": self.pid,
            "since": self.since,
            "expires": self.expires,
            "alive": self.alive,
            "active": self.active,
        }


def read_holder(dest: Destination) -> Holder | None:
    """The writer lock's or lease's recorded holder, read without taking it.

    A local ``LOCK`` is removed by a clean release, so one there names a live writer or one
    that was killed; whether its process still runs (same pid, start time and boot) is
    checked when it is on this host.
    """
    for name in HOLDER_NAMES:
        try:
            raw = dest.read(name, 0, HolderRecord.MAX_BYTES)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            logger.debug("cannot read %s/%s: %s", dest.url, name, e)
            continue
        if not raw.strip():
            continue
        return _holder(name, raw)
    return None


def _holder(name: str, raw: bytes) -> Holder:
    record = HolderRecord.parse(raw)
    if record is None:
        return Holder(name, raw.decode("utf-8", "replace").strip()[:200])
    pid, host = record.pid, record.host
    return Holder(
        name,
        f"{record.owner} (pid {pid if pid is not None else '?'} on {host or '?'})",
        owner=record.owner,
        host=host,
        pid=pid,
        since=record.since,
        expires=record.expires,
        alive=record.running(),
    )


__all__ = ["Holder", "read_holder"]

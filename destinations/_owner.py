"""Who holds a writer lock or lease: the record a writer leaves, and its one-line form."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from ._process import process_running

#: The local lock file and the object-store lease object; each holds an owner record.
LOCK_NAME = "LOCK"
LEASE_NAME = "LEASE"
HOLDER_NAMES = (LOCK_NAME, LEASE_NAME)


def owner_record(owner: str, **extra: Any) -> dict[str, Any]:
    """The holder's self-description written into a lock file or lease object."""
    return {
        "owner": owner,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.time(),
        **extra,
    }


def parse_record(raw: bytes) -> dict[str, Any] | None:
    """The record in ``raw``, or None if it is not one (empty, truncated, foreign)."""
    try:
        info = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def describe_holder(raw: bytes) -> str:
    """``"owner (pid N on host)"`` from a recorded holder; raw text if unparseable."""
    info = parse_record(raw)
    if info is None:
        return raw.decode("utf-8", "replace").strip()[:200]
    return f"{info.get('owner', '?')} (pid {info.get('pid', '?')} on {info.get('host', '?')})"


@dataclass(frozen=True)
class HolderRecord:
    """An owner record read back, each field None when missing or of the wrong type
    (the record may be foreign or hand-edited); ``owner`` is ``"?"`` when missing.

    ``boot_id`` and ``start`` (a local lock's holder: its boot and process start time, see
    ``destinations._process``) tell a running holder from a dead one whose pid was reused.
    """

    #: Bytes worth reading: a record is a few hundred bytes at most.
    MAX_BYTES: ClassVar[int] = 4096

    owner: str
    host: str | None
    pid: int | None
    since: float | None
    expires: float | None
    boot_id: str | None = None
    start: int | None = None

    @classmethod
    def parse(cls, raw: bytes) -> HolderRecord | None:
        """The record in ``raw``, or None if it is not one (see :func:`parse_record`)."""
        info = parse_record(raw)
        if info is None:
            return None
        pid, host = info.get("pid"), info.get("host")
        since, expires = info.get("since"), info.get("expires")
        boot, start = info.get("boot_id"), info.get("start")
        return cls(
            owner=str(info.get("owner", "?")),
            host=host if isinstance(host, str) else None,
            pid=pid if isinstance(pid, int) else None,
            since=since if isinstance(since, (int, float)) else None,
            expires=expires if isinstance(expires, (int, float)) else None,
            boot_id=boot if isinstance(boot, str) else None,
            start=start if isinstance(start, int) and not isinstance(start, bool) else None,
        )

    def running(self) -> bool | None:
        """Whether this holder's process still runs (None: cannot tell from this host)."""
        return process_running(self.host, self.pid, self.start, self.boot_id)

"""Who holds a writer lock or lease: the record a writer leaves, and its one-line form."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any


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

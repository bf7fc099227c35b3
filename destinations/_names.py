"""File names inside a destination: validation and the reserved temporary-name pattern.

Drivers map plain names under their directory, so a name must never be able to escape it.
Names starting with ``.`` and ending with ``.tmp`` are reserved for in-flight writes and are
never listed.
"""

from __future__ import annotations

import os
import secrets

TEMP_PREFIX = "."
TEMP_SUFFIX = ".tmp"


def check_name(name: str) -> str:
    """Return ``name`` if it is a plain file name, else raise ``ValueError``."""
    if not isinstance(name, str):
        raise TypeError(f"file name must be str, not {type(name).__name__}")
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"not a plain file name: {name!r}")
    if is_temp_name(name):
        raise ValueError(f"names starting with '.' and ending with '.tmp' are reserved: {name!r}")
    return name


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is a temporary file of an in-flight write."""
    return name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX)


def temp_name(name: str) -> str:
    """A fresh temporary name for writing ``name``; unique across processes and threads."""
    # pid + random token: two processes (or a crashed one's leftovers) never collide.
    return f"{TEMP_PREFIX}{name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"

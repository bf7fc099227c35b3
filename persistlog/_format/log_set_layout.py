"""Where a log set puts a key's log (docs/FORMAT.md, "Log sets"): the key's directory name,
percent-encoded, and its shard directories, the first bytes of the SHA-256 of the key.

The set itself (``_apps/log_set.py``) opens, walks and closes logs laid out so; a reader
told of a missing location uses the same names to say where a key's log is
(``_read/reader.why_no_log``).
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import unquote_to_bytes

#: Shard levels a set may have: 256 shards per level.
MIN_DEPTH, MAX_DEPTH, DEFAULT_DEPTH = 1, 4, 1
#: A key's directory name (the key percent-encoded) is at most this many bytes: what
#: ext4, XFS and most file systems allow in one name. Any key of up to 85 UTF-8 bytes fits.
MAX_NAME_BYTES = 255

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_ENCODED = [chr(b) if b in _SAFE else f"%{b:02X}" for b in range(256)]
_PLAIN = re.compile(r"[A-Za-z0-9._-]+")


def key_name(key: str) -> str:
    """The directory name of ``key``: percent-encoded, one-to-one (:func:`name_key` is its
    inverse). ``TypeError`` for a non-str, ``ValueError`` for an empty key or one whose
    name would pass ``MAX_NAME_BYTES``."""
    if not isinstance(key, str):
        raise TypeError(f"a LogSet key must be a str, not {type(key).__name__}")
    if not key:
        raise ValueError("a LogSet key must not be empty")
    raw = key.encode("utf-8", "surrogatepass")
    name = "".join([_ENCODED[b] for b in raw])
    if name[0] == ".":
        name = "%2E" + name[1:]
    if len(name) > MAX_NAME_BYTES:
        raise ValueError(
            f"LogSet key {key[:40]!r}... is too long: its directory name would be {len(name)} bytes, "
            f"at most {MAX_NAME_BYTES} (any key of up to 85 UTF-8 bytes fits)"
        )
    return name


def name_key(name: str) -> str | None:
    """The key whose directory name is ``name``; None for a name no key has."""
    if _PLAIN.fullmatch(name) and name[0] != "." and len(name) <= MAX_NAME_BYTES:
        return name  # nothing encoded: the name is its own key (as key_name says)
    # Decoded leniently (a stray "%", lower-case hex), then encoded again: a name is a
    # key's only if it is exactly what key_name makes of that key.
    try:
        key = unquote_to_bytes(name).decode("utf-8", "surrogatepass")
        return key if key_name(key) == name else None
    except (UnicodeDecodeError, ValueError):
        return None


def shards(key: str, depth: int) -> list[str]:
    """The shard directories of ``key`` in a set of ``depth`` levels, outermost first."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return [digest[2 * i : 2 * i + 2] for i in range(depth)]

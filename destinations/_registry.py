"""Protocol -> driver table, imported lazily on first use.

Each entry names its driver as ``"module:Class"`` plus an install hint shown when the import
(or the driver's own dependencies) are missing, as fsspec's ``registry.py`` does. The table
is the only module-level mutable state of the package; it is exposed read-only through
:func:`available`.
"""

from __future__ import annotations

import difflib
import os
import importlib
import threading
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping, NamedTuple

if TYPE_CHECKING:
    from ._base import Destination

LOCAL = "destinations.local:LocalDestination"
OBJECT_STORE = "destinations.objectstore:ObjectStoreDestination"
_S3_HINT = "{protocol}:// needs the s3 extra: pip install 'persistlog[s3]'"


class _Entry(NamedTuple):
    target: str
    hint: str


# Keep alphabetical (checked below): a sorted table is easy to review and to diff.
_BUILTIN: dict[str, _Entry] = {
    "file": _Entry(LOCAL, ""),
    "local": _Entry(LOCAL, ""),
    "memory": _Entry(OBJECT_STORE, ""),
    "s3": _Entry(OBJECT_STORE, _S3_HINT),
    "s3a": _Entry(OBJECT_STORE, _S3_HINT),
}
assert list(_BUILTIN) == sorted(_BUILTIN), "keep the driver table alphabetical"

_registry: dict[str, _Entry] = dict(_BUILTIN)
_targets: dict[str, str] = {p: e.target for p, e in _registry.items()}
_classes: dict[str, type[Destination]] = {}
_lock = threading.Lock()


def available() -> Mapping[str, str]:
    """Read-only view of the registered protocols and their ``"module:Class"`` drivers.

    Protocols not listed here but known to fsspec (``fsspec.available_protocols()``) are
    served by the generic object-store driver.
    """
    return MappingProxyType(_targets)


def register(protocol: str, target: str, hint: str = "", *, clobber: bool = False) -> None:
    """Register the driver ``target`` (``"module:Class"``) for URLs ``protocol://…``.

    ``hint`` is appended to the ``ImportError`` raised when the driver cannot be imported.
    Re-registering a protocol with a different target needs ``clobber=True``.
    """
    protocol = _normalise(protocol)
    module, sep, cls = target.partition(":")
    if not (module and sep and cls) or ":" in cls:
        raise ValueError(f"driver must be given as 'module:Class', not {target!r}")
    with _lock:
        old = _registry.get(protocol)
        if old is not None and old.target != target and not clobber:
            raise ValueError(
                f"protocol {protocol!r} is already served by {old.target}; pass clobber=True"
            )
        _registry[protocol] = _Entry(target, hint)
        _targets[protocol] = target
        _classes.pop(protocol, None)


def split_protocol(url: str) -> tuple[str, str]:
    """``(protocol, rest)``; a plain path is protocol ``"file"``."""
    if "::" in url:
        raise ValueError(
            f"chained fsspec URLs are not supported as destinations: {url!r}; "
            "pass the inner filesystem's options as storage_options instead"
        )
    protocol, sep, rest = url.partition("://")
    if not sep:
        return "file", url
    return _normalise(protocol), rest


def driver_for(protocol: str) -> tuple[type[Destination], str]:
    """The driver class serving ``protocol`` and its install hint.

    Raises ``ValueError`` for a protocol nobody knows (suggesting the nearest known one) and
    ``ImportError`` (with the hint) when the driver module cannot be imported.
    """
    entry = _registry.get(protocol)
    if entry is None:
        entry = _fsspec_entry(protocol)
    with _lock:
        cls = _classes.get(protocol)
    if cls is not None:
        return cls, entry.hint
    module_name, _, cls_name = entry.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        message = f"cannot import {module_name} for {protocol}://: {e}"
        raise ImportError(with_hint(message, entry.hint, protocol)) from e
    cls = getattr(module, cls_name)
    with _lock:
        _classes[protocol] = cls
    return cls, entry.hint


def with_hint(message: str, hint: str, protocol: str) -> str:
    """``message`` preceded by the install hint, if there is one."""
    if not hint:
        return message
    return f"{hint.format(protocol=protocol)} ({message})"


def _fsspec_entry(protocol: str) -> _Entry:
    import fsspec  # type: ignore[import-untyped,unused-ignore]
    from fsspec.registry import known_implementations  # type: ignore[import-untyped,unused-ignore]

    # fsspec knows many stores (gcs, az, sftp, …) and plug-ins registered at runtime;
    # none of them appends, so the object-store driver serves them all.
    if protocol in fsspec.available_protocols() or protocol in fsspec.registry:
        known = known_implementations.get(protocol, {})
        return _Entry(OBJECT_STORE, str(known.get("err", "")).replace("{", "{{").replace("}", "}}"))
    known_names = sorted(set(_registry) | set(fsspec.available_protocols()))
    close = difflib.get_close_matches(protocol, known_names, n=1, cutoff=0.5)
    suggestion = f"; did you mean {close[0]}://?" if close else ""
    raise ValueError(
        f"unknown destination protocol {protocol!r}{suggestion} "
        f"(registered: {', '.join(sorted(_registry))}; or any fsspec protocol)"
    )


def _normalise(protocol: str) -> str:
    protocol = protocol.strip().lower()
    if not protocol or not protocol.replace("+", "").replace("-", "").replace(".", "").isalnum():
        raise ValueError(f"not a URL protocol: {protocol!r}")
    return protocol


def destination_url(url: str | os.PathLike[str]) -> str:
    """``url`` as the string every driver takes: a ``str`` as it is, an ``os.PathLike``
    (``pathlib.Path``...) through ``os.fspath``.

    ``TypeError`` for any other type (bytes paths included), ``ValueError`` for an empty
    URL.
    """
    if not isinstance(url, str):
        fspath = getattr(type(url), "__fspath__", None)
        text = fspath(url) if fspath is not None else None
        if not isinstance(text, str):
            raise TypeError(
                f"a destination URL must be a str or an os.PathLike such as pathlib.Path, not {type(url).__name__}"
            )
        url = text
    if not url:
        raise ValueError("a destination URL must not be empty")
    return url

"""``LogSet``: many logs named by key under one root, laid out in shard directories.

::

    root/LOGSET                  the marker: this is a log set, and how deep its shards are
    root/ab/user%3A1/...         depth 1: the log of key "user:1" (256 shards)
    root/ab/c3/user%3A1/...      depth 2 (65,536 shards)

A key's shards are the first ``depth`` bytes of the SHA-256 of its UTF-8 bytes, in
lowercase hex, one directory per byte; its directory is the key percent-encoded (every
byte outside ``[A-Za-z0-9._-]``, and a leading ``.``, as ``%XX``). So no directory holds
more than 256 shards or, at depth 1, about 1/256 of the keys, and walking the set lists
directories level by level, never the files of every log (on S3, one delimiter listing
per shard).

Each log is an ordinary destination: ``persistlog.open``/``restore``/``follow``, the CLI and
the Spark source work on ``LogSet.url(key)`` as on any other log. The set adds naming,
the layout, defaults applied to every log and one ``close()`` for all it opened; it never
reaches into how a ``Log`` works.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Unpack

from destinations import Destination, destination_url, open_destination, subdirectories

from .._api import StoreOptions
from .._api import open_log
from .._api import restore as restore_log
from .._errors import DestinationError, LogClosedError, LogNotFoundError, LogSetError, WriterConflict
from .._format import encoder
from .._format import constants as F
from .._format.codec import Codec
from .._format.crypt import Keyring
from .._format.decoder import Damage, parse_log_set_marker
from .._format.log_set_layout import DEFAULT_DEPTH, MAX_DEPTH, MIN_DEPTH, key_name, name_key, shards
from .._read.restore import RestoreResult
from .._write.log import Log
from .._write.rotation import EnumerateAll

logger = logging.getLogger("persistlog")

_SHARD = re.compile(r"[0-9a-f]{2}")
# Shard directories listed at once on a remote store (latency-bound).
LIST_THREADS = 16
CLOSE_THREADS = 16


class LogSetOptions(StoreOptions, total=False):
    """The :func:`persistlog.open` options a :class:`LogSet` applies to every log it opens
    (and :meth:`LogSet.open` to one), named for type checkers."""

    concurrent_enumeration: bool


_OPTION_NAMES = frozenset(LogSetOptions.__optional_keys__)
# Options that name one place or one process-wide thing, so cannot be every log's.
_NOT_SHARED = {
    "secondaries": "a secondary holds one log: pass secondaries= to LogSet.open() for that key",
    "rotate_on_signal": "a signal handler is the process's, not each log's: rotate logs from the app",
}


def _join(root: str, *parts: str) -> str:
    """``root/part/part...``: what lies under a root URL or path (``/`` included)."""
    return "/".join([root.rstrip("/"), *parts])


def _check_depth(depth: object) -> int:
    if not isinstance(depth, int) or isinstance(depth, bool) or not MIN_DEPTH <= depth <= MAX_DEPTH:
        raise ValueError(f"depth must be an integer from {MIN_DEPTH} to {MAX_DEPTH} (256 shards per level), not {depth!r}")
    return depth


def read_marker(root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> int | None:
    """The depth the ``LOGSET`` marker at ``root`` states; None when there is none (a
    missing root, a log, anything else). :class:`LogSetError` for a marker this version
    does not read."""
    dest = open_destination(root, **(storage_options or {}))
    try:
        return _marker_depth(dest)
    finally:
        dest.close()


def _marker_depth(dest: Destination) -> int | None:
    try:
        raw = dest.read(F.LOG_SET_NAME, 0, F.LOG_SET_SIZE + 1)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as e:
        raise DestinationError(f"cannot read {dest.url}/{F.LOG_SET_NAME}: {e}") from e
    try:
        return parse_log_set_marker(raw)
    except Damage as d:
        raise LogSetError(f"{dest.url} has a {F.LOG_SET_NAME} file that this persistlog cannot read as a log set marker: {d.reason}") from None


def _what_is_there(dest: Destination, files: list[str], dirs: list[str]) -> str:
    """What a root that is no log set holds, in a few words."""
    segments = sorted({s[0] for s in map(F.parse_segment_name, files) if s is not None})
    if segments or F.CURRENT_NAME in files:
        if not segments:
            logs = "a CURRENT pointer"
        else:
            logs = f"log {segments[0]}" if len(segments) == 1 else f"logs {segments[0]}..{segments[-1]}"
        return f"it holds a persistlog log ({logs}), not a set of them; open it with persistlog.open()"
    shown = [f"{d}/" for d in dirs[:3]] + files[:3]
    more = len(files) + len(dirs) - len(shown)
    return (
        f"it holds {len(files)} file(s) and {len(dirs)} directory(ies) ({', '.join(shown)}"
        f"{f', ... {more} more' if more > 0 else ''}) and no {F.LOG_SET_NAME} marker"
    )


class LogSet(AbstractContextManager["LogSet"]):
    """Logs named by key under one root (a directory or ``s3://bucket/prefix``), each in
    its shard directory, with :func:`persistlog.open` options shared by every log.

    ``depth`` is the number of shard levels (1 to 4, 256 shards each): None takes the
    marker's, or 1 for a new set; another depth than the marker's is a
    :class:`LogSetError`, as is a root that holds anything but a log set. A missing or
    empty root becomes a set (its ``LOGSET`` marker is written) only with ``create=True``;
    otherwise it is a :class:`LogNotFoundError`. ``defaults`` are options of
    :func:`persistlog.open` for every log (``durability``, triggers, ``codec``...);
    ``storage_options`` reach the root and every log. ``secondaries`` and
    ``rotate_on_signal`` belong to one log, so they are given to :meth:`open` only.

    Keys are any non-empty ``str`` whose directory name (``key_name``) fits in
    ``MAX_NAME_BYTES``: a bad key is a ``TypeError`` or ``ValueError`` before anything is
    written. A log is opened by one process at a time (:class:`WriterConflict`, the log's
    own writer lock). ``close()`` (or leaving a ``with`` block) closes every log this
    LogSet opened and has not seen closed.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        depth: int | None = None,
        create: bool = True,
        **defaults: Unpack[LogSetOptions],
    ) -> None:
        self.root = destination_url(root)
        if depth is not None:
            _check_depth(depth)
        if not isinstance(create, bool):
            raise TypeError(f"create must be True or False, not {create!r}")
        self._defaults: dict[str, Any] = self._check_options(dict(defaults))
        for name, why in _NOT_SHARED.items():
            if self._defaults.get(name) is not None:
                raise TypeError(f"LogSet() takes no {name}: {why}")
        so = self._defaults.get("storage_options")
        if so is not None and not isinstance(so, dict):
            raise TypeError(f"storage_options must be a dict, not {type(so).__name__}")
        self.storage_options: dict[str, Any] = dict(so or {})
        self.depth: int = self._open_root(depth, create)
        self._lock = threading.Lock()
        self._logs: dict[str, Log] = {}
        self._closed = False

    # -- the root and its marker -----------------------------------------------------------

    def _open_root(self, depth: int | None, create: bool) -> int:
        dest = open_destination(self.root, **self.storage_options)
        try:
            found = _marker_depth(dest)
            if found is None:
                found = self._make_root(dest, depth, create)
        finally:
            dest.close()
        if depth is not None and depth != found:
            raise LogSetError(
                f"{self.root} is a log set of depth {found}, not {depth}: open it with "
                f"depth={found} (or depth=None, which takes the marker's)"
            )
        return found

    def _make_root(self, dest: Destination, depth: int | None, create: bool) -> int:
        try:
            exists = dest.exists()
            files = dest.list() if exists else []
            dirs = subdirectories(self.root, self.storage_options) if exists else []
            blocked = None if exists else dest.why_not_creatable()
        except OSError as e:
            raise DestinationError(f"cannot look at {self.root}: {e}") from e
        if files or dirs:
            # Another process may have made the set since our first look for its marker:
            # the marker is listed, or (a set's maker writes it before any shard) a shard
            # was listed after a listing of the files that came before the marker.
            found = _marker_depth(dest)
            if found is not None:
                return found
            raise LogSetError(f"{self.root} is not a log set: {_what_is_there(dest, files, dirs)}")
        if blocked is not None:
            raise LogSetError(f"cannot make a log set at {self.root}: {blocked}")
        if not create:
            where = "it is empty" if exists else dest.describe_missing()
            raise LogNotFoundError(f"no log set at {self.root} ({where}); LogSet(..., create=True) makes one")
        depth = DEFAULT_DEPTH if depth is None else depth
        try:
            dest.ensure()
            dest.create(F.LOG_SET_NAME, encoder.log_set_marker(depth))
        except FileExistsError:
            # Another process made the set at the same moment: its marker rules.
            found = _marker_depth(dest)
            if found is None:
                raise LogSetError(f"{self.root}/{F.LOG_SET_NAME} appeared and vanished while the set was made") from None
            return found
        except OSError as e:
            raise DestinationError(f"cannot make a log set at {self.root}: {e}") from e
        logger.info("made a log set at %s (depth %d)", self.root, depth)
        return depth

    # -- keys and where their logs are -------------------------------------------------------

    def url(self, key: str) -> str:
        """The URL of ``key``'s log (a plain destination: ``persistlog.follow``, the CLI and
        the Spark source read it as any other). ``TypeError``/``ValueError`` for a bad key."""
        name = key_name(key)
        return _join(self.root, *shards(key, self.depth), name)

    def __contains__(self, key: object) -> bool:
        """Whether ``key``'s directory exists (it was opened at least once); False for a
        value that is no valid key."""
        if not isinstance(key, str):
            return False
        try:
            url = self.url(key)
        except ValueError:
            return False
        dest = open_destination(url, **self.storage_options)
        try:
            return dest.exists()
        except OSError as e:
            raise DestinationError(f"cannot look at {url}: {e}") from e
        finally:
            dest.close()

    def keys(self) -> Iterator[str]:
        """Every key whose directory exists, in shard order (not sorted), listing one
        directory per shard (on S3 one delimiter listing per 1,000 entries of a shard),
        never the files of the logs. Directories that are no key's of this set (a name no
        key encodes to, or in another key's shard) are skipped with a warning."""
        return (key for key, _url in self.logs())

    def logs(self) -> Iterator[tuple[str, str]]:
        """``(key, URL of its log)`` of every key :meth:`keys` lists, in the same order and
        from the same listings: a reader of every log of the set needs no :meth:`url` per key."""
        prefixes: list[tuple[str, ...]] = [()]
        for _level in range(self.depth):
            listed = list(self._list_all(prefixes))
            prefixes = [p + (s,) for p, names in zip(prefixes, listed) for s in names if _SHARD.fullmatch(s)]
        for prefix, names in zip(prefixes, self._list_all(prefixes)):
            for name in names:
                key = name_key(name)
                if key is None or tuple(shards(key, self.depth)) != prefix:
                    logger.warning("%s: %s is no key's directory in this log set; skipped", self.root, "/".join((*prefix, name)))
                    continue
                yield key, _join(self.root, *prefix, name)

    def _listing(self, prefix: tuple[str, ...]) -> list[str]:
        url = _join(self.root, *prefix)
        try:
            return subdirectories(url, self.storage_options)
        except OSError as e:
            raise DestinationError(f"cannot list {url}: {e}") from e

    def _list_all(self, prefixes: list[tuple[str, ...]]) -> Iterable[list[str]]:
        """The directories under each of ``prefixes``: one at a time locally (lazily), many
        at once on a remote store, where each listing waits for the network."""
        if len(prefixes) < 2 or self._is_local():
            return map(self._listing, prefixes)
        with ThreadPoolExecutor(min(LIST_THREADS, len(prefixes)), thread_name_prefix="persistlog-logset") as pool:
            return list(pool.map(self._listing, prefixes))

    def _is_local(self) -> bool:
        return "://" not in self.root or self.root.startswith(("file://", "local://"))

    # -- opening, restoring, closing --------------------------------------------------------

    def _check_options(self, options: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(options) - _OPTION_NAMES)
        if unknown:
            raise TypeError(f"unknown persistlog.open option(s) {unknown}; known: {sorted(_OPTION_NAMES)}")
        return options

    def open(
        self,
        key: str,
        enumerate_all: EnumerateAll,
        *,
        replay: Callable[[Any], Any] | None = None,
        replay_batch: Callable[[list[Any]], Any] | None = None,
        **options: Unpack[LogSetOptions],
    ) -> Log:
        """Open ``key``'s log for writing, as :func:`persistlog.open` opens ``url(key)``
        with the set's defaults and ``options`` over them: with ``replay=`` (or
        ``replay_batch=``) it restores first, holding the writer lock, and the
        :class:`RestoreResult` is ``log.restored``. A new key's directory is created.

        :class:`WriterConflict` when another process (or this LogSet) has the log open;
        nothing is written then. The LogSet keeps the Log until it is closed, by the app or
        by :meth:`close`.
        """
        url = self.url(key)
        opts = self._check_options(dict(options))
        if "storage_options" in opts:
            raise TypeError("LogSet.open() takes no storage_options: the set's reach every log")
        with self._lock:
            if self._closed:
                raise LogClosedError(f"this LogSet at {self.root} is closed")
            held = self._logs.get(key)
            if held is not None and not held.closed:
                raise WriterConflict(f"{url}: this LogSet has the log of key {key!r} open already")
        lg = open_log(url, enumerate_all, replay=replay, replay_batch=replay_batch, **{**self._defaults, **opts})
        with self._lock:
            if not self._closed:
                self._logs[key] = lg
                return lg
        lg.close()
        raise LogClosedError(f"this LogSet at {self.root} was closed while the log of key {key!r} opened")

    def restore(
        self,
        key: str,
        replay: Callable[[Any], Any] | None = None,
        *,
        replay_batch: Callable[[list[Any]], Any] | None = None,
        recovery: str | None = None,
        missing_ok: bool = True,
        codec: Codec | None = None,
        key_provider: Callable[[str], Any] | Keyring | None = None,
    ) -> RestoreResult:
        """:func:`persistlog.restore` of ``key``'s log, with the set's ``storage_options``
        (and its ``codec``, ``recovery`` and ``key_provider`` defaults unless given). A key
        never opened replays nothing (``found=False``) and creates nothing."""
        url = self.url(key)
        return restore_log(
            url,
            replay,
            replay_batch=replay_batch,
            recovery=recovery if recovery is not None else self._defaults.get("recovery", "strict"),
            missing_ok=missing_ok,
            codec=codec if codec is not None else self._defaults.get("codec"),
            storage_options=self.storage_options,
            key_provider=key_provider if key_provider is not None else self._defaults.get("key_provider"),
        )

    @property
    def defaults(self) -> dict[str, Any]:
        """The :func:`persistlog.open` options this set applies to every log (a copy)."""
        return dict(self._defaults)

    @property
    def open_logs(self) -> dict[str, Log]:
        """The Logs this LogSet opened that are still open, by key (a copy)."""
        with self._lock:
            for key in [k for k, lg in self._logs.items() if lg.closed]:
                del self._logs[key]
            return dict(self._logs)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the LogSet then opens no more logs)."""
        return self._closed

    def close(self) -> None:
        """Close every Log this LogSet opened and that is still open (several at a time),
        then refuse further :meth:`open` calls. Every log is closed even when one fails;
        the first failure is then raised (the others are logged). Calling it again does
        nothing."""
        with self._lock:
            self._closed = True
            logs = [(k, lg) for k, lg in self._logs.items() if not lg.closed]
            self._logs.clear()
        if not logs:
            return

        def close_one(item: tuple[str, Log]) -> BaseException | None:
            key, lg = item
            try:
                lg.close()
            except Exception as e:
                logger.error("%s: closing the log of key %r failed: %s", self.root, key, e)
                return e
            return None

        if len(logs) == 1:
            errors = [close_one(logs[0])]
        else:
            with ThreadPoolExecutor(min(CLOSE_THREADS, len(logs)), thread_name_prefix="persistlog-logset") as pool:
                errors = list(pool.map(close_one, logs))
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.open_logs)} open"
        return f"<persistlog.LogSet {self.root!r} depth={self.depth} {state}>"


__all__ = ["LogSet", "LogSetOptions"]

"""ResourceStore: a thread-safe dict that restores, enumerates and logs by itself.

Its records follow one documented convention, which the Spark replay understands::

    {"op": "put", "key": k, "value": v}
    {"op": "del", "key": k}

Keys are any hashable loggable value. CBOR has no tuple, so a tuple key is stored as an
array (in Spark's ``key`` column: a JSON array, ``["user",1]``) and a frozenset as a set
(``{"$set":[...]}``); replay turns them back into a tuple and a frozenset, nested ones too.
No list or set key can ever be stored (they are unhashable), so an array or set in a key
position is always a tuple or frozenset.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from types import TracebackType
from typing import Any, Unpack

from .._api import StoreOptions, open_log
from .._read.restore import RestoreResult
from .._write.log import Log
from .._write.rotation import Emit
from .._write.secondaries import SecondaryLag

logger = logging.getLogger("persistlog")

# Keys an enumeration emits per hold of the store's lock: one emit.many() call each, about
# half a millisecond of encoding, which is the longest an update waits for it.
_ENUMERATION_CHUNK = 512


def _key_from_record(key: Any) -> Any:
    """A key as the store held it: arrays were tuples and sets were frozensets."""
    if type(key) is list:
        return tuple(_key_from_record(k) for k in key)
    if type(key) is set:
        return frozenset(key)  # elements decode hashable already (cbor2's immutable mode)
    return key


def _check_key(key: Any) -> None:
    """Refuse, before anything is logged, a key that could not be a dict key on replay."""
    try:
        hash(key)
    except TypeError:
        raise TypeError(
            f"unhashable ResourceStore key {key!r} of type {type(key).__name__}: keys must be "
            "hashable (str, int, a tuple of such...); nothing was logged"
        ) from None


class ResourceStore(MutableMapping[Any, Any]):
    """A dict whose every change is logged before it is applied.

    >>> store = ResourceStore.open("/var/lib/app/state")   # restores, then opens the log
    >>> store["user:1"] = {"name": "Ada"}
    >>> store.close()

    Keys and values must be loggable (CBOR values or classes registered with a Codec), and
    keys hashable: tuple and frozenset keys (nested too) come back as such after a restore;
    an unhashable key raises ``TypeError`` before anything is logged.
    Each change is logged while the store's lock is held, so the log's order is the
    store's order and an enumeration never writes a value older than a logged update.
    Compound operations (``pop``, ``popitem``, ``setdefault``, ``update``, ``clear``) hold
    the lock throughout; ``keys()``, ``values()`` and ``items()`` return lists, copies
    taken under the lock, so iterating them while other threads write is safe.
    """

    def __init__(self) -> None:
        self._data: dict[Any, Any] = {}
        self._lock = threading.RLock()
        self._log: Log | None = None
        self.restored: RestoreResult | None = None

    @classmethod
    def open(cls, url: str | os.PathLike[str], **options: Unpack[StoreOptions]) -> ResourceStore:
        """Restore the store from ``url`` (a string or an ``os.PathLike``) and open its log
        for writing.

        ``options`` are those of :func:`persistlog.open` (``durability``, triggers,
        ``storage_options``, ``codec``...; :class:`StoreOptions` names them for type
        checkers); ``recovery`` is passed to the restore. A location that holds no log yet
        is created, and the log says so (``logging``, INFO).
        """
        store = cls()
        for own in ("concurrent_enumeration", "replay", "replay_batch"):
            if own in options:
                raise TypeError(
                    f"ResourceStore.open() takes no {own}: the store restores itself, and holds its "
                    "lock across each update and each emit, so its enumerations run beside updates"
                )
        # The concurrency contract, kept by the store's lock: enumerations run beside updates.
        store._log = open_log(
            url, store._enumerate, replay_batch=store._apply_batch, concurrent_enumeration=True, **options
        )
        if store._log.restored is not None and not store._log.restored.found:
            logger.info("ResourceStore: no log at %s yet; a new one was created there", store._log.url)
        store.restored = store._log.restored
        return store

    # -- replay and enumeration ---------------------------------------------------------

    def _apply_batch(self, records: list[Any]) -> None:
        data = self._data
        for r in records:
            if not isinstance(r, dict):
                continue  # not a ResourceStore record; tolerate foreign writers
            op = r.get("op")
            key = r.get("key")
            if type(key) is list or type(key) is set:
                key = _key_from_record(key)
            if op == "put":
                data[key] = r.get("value")
            elif op == "del":
                data.pop(key, None)

    def _enumerate(self, emit: Emit) -> None:
        with self._lock:
            keys = list(self._data)
        data = self._data
        for i in range(0, len(keys), _ENUMERATION_CHUNK):
            # A chunk of keys at a time, under the same lock as updates: a value emitted here
            # is never older than an update to the same key already in the log, and updates
            # wait for one chunk at most.
            with self._lock:
                emit.many([{"op": "put", "key": k, "value": data[k]} for k in keys[i : i + _ENUMERATION_CHUNK] if k in data])

    # -- the mapping --------------------------------------------------------------------

    @property
    def log(self) -> Log:
        if self._log is None:
            raise RuntimeError("ResourceStore is not open; use ResourceStore.open(url)")
        return self._log

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    # A change is applied once its record is appended, even if update() was interrupted
    # after that (KeyboardInterrupt): the log would replay it, so memory must hold it too.
    # Applied right as the update returns, by one step CPython runs no signal handler
    # before (a store, or one C call); only a call that raised asks the log whether it
    # appended (asking in a `finally` was itself a Python call a Ctrl-C could cut short).

    def __setitem__(self, key: Any, value: Any) -> None:
        _check_key(key)
        with self._lock:
            lg = self.log
            before = lg.next_lsn
            try:
                lg.update({"op": "put", "key": key, "value": value})
                self._data[key] = value
            except BaseException:
                if lg.next_lsn > before:
                    self._data[key] = value
                raise

    def __delitem__(self, key: Any) -> None:
        with self._lock:
            if key not in self._data:
                raise KeyError(key)
            lg = self.log
            before = lg.next_lsn
            try:
                lg.update({"op": "del", "key": key})
                self._data.pop(key, None)
            except BaseException:
                if lg.next_lsn > before:
                    self._data.pop(key, None)
                raise

    def __iter__(self) -> Iterator[Any]:
        with self._lock:
            return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: Any, default: Any = None) -> Any:
        return self._data.get(key, default)

    # Compound operations hold the lock throughout: MutableMapping's versions are two
    # steps, and another thread could change the key in between.

    def pop(self, key: Any, *default: Any) -> Any:
        """Remove ``key`` (logged) and return its value, or ``default`` if absent."""
        if len(default) > 1:
            raise TypeError(f"pop expected at most 2 arguments, got {1 + len(default)}")
        with self._lock:
            if key not in self._data:
                if default:
                    return default[0]
                raise KeyError(key)
            value = self._data[key]
            del self[key]
            return value

    def popitem(self) -> tuple[Any, Any]:
        """Remove (logged) and return the most recently set item."""
        with self._lock:
            if not self._data:
                raise KeyError("popitem(): ResourceStore is empty")
            key = next(reversed(self._data))
            value = self._data[key]
            del self[key]
            return key, value

    def setdefault(self, key: Any, default: Any = None) -> Any:
        """``store[key]``, after setting it (logged) to ``default`` if absent."""
        with self._lock:
            if key in self._data:
                return self._data[key]
            self[key] = default
            return default

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        """Set several keys (as ``dict.update`` takes them) in one logged batch: a crash
        keeps all of them or none, and if any key or value cannot be logged
        (``TypeError``) none is set. Like :meth:`Log.update_many`, one call holds at most
        one batch (about 56 MiB; ``ValueError`` beyond)."""
        if isinstance(other, Mapping):
            pairs = list(other.items())
        elif hasattr(other, "keys"):
            pairs = [(k, other[k]) for k in other.keys()]
        else:
            pairs = list(other)
        pairs += kwargs.items()
        with self._lock:
            lg = self.log
            before = lg.next_lsn
            records = [{"op": "put", "key": k, "value": v} for k, v in pairs]
            # Applied whole once appended, as a single change is (see above): one call,
            # which no KeyboardInterrupt cuts in two.
            try:
                lg.update_many(records)
                self._data.update(pairs)
            except BaseException:
                if lg.next_lsn > before:
                    self._data.update(pairs)
                raise

    def clear(self) -> None:
        """Delete every key (one logged change each)."""
        with self._lock:
            for key in list(self._data):
                del self[key]

    def keys(self) -> Any:
        with self._lock:
            return list(self._data)

    def values(self) -> Any:
        with self._lock:
            return list(self._data.values())

    def items(self) -> Any:
        with self._lock:
            return list(self._data.items())

    def to_dict(self) -> dict[Any, Any]:
        """A copy of the current contents."""
        with self._lock:
            return dict(self._data)

    def sync(self) -> None:
        """Make every change so far durable."""
        self.log.sync()

    def close(self, rotate: bool = False) -> list[SecondaryLag]:
        """Close the log; ``rotate=True`` first writes a fresh snapshot, so that the next
        :meth:`open` replays just the live keys and writes no snapshot of its own. Returns
        the secondaries left behind the primary (see :meth:`persistlog.Log.close`)."""
        if self._log is not None:
            return self._log.close(rotate=rotate)
        return []

    def __repr__(self) -> str:
        lg = self._log
        if lg is None:
            return f"<persistlog.ResourceStore {len(self._data)} keys, not open>"
        state = "failed" if lg.failed else "closed" if lg.closed else "open"
        return f"<persistlog.ResourceStore {lg.url!r} {len(self._data)} keys log={lg.seq} {state}>"

    def __enter__(self) -> ResourceStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

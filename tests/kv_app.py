"""The app the tests log: a dict of resources kept in memory, each change logged through a
persistlog Log, in the ResourceStore convention ``{"op": "put"|"del", "key", "value"}``.

``App`` is the app; ``apply`` replays one record into a dict and ``restore_state`` restores
a destination into a fresh one; ``replay_ops`` and ``prefix_states`` are the model the
restored states are checked against. Child processes import it too (``tests/`` on their
path, after the repository root).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import persistlog


class App:
    """A dict of resources kept in memory, logged through a persistlog Log.

    Records follow the ResourceStore convention: ``{"op": "put"|"del", "key", "value"}``.
    Each change is logged and applied under the resource's lock (one lock per key stripe),
    and the enumeration takes the same lock per key, as the seed's concurrency contract asks.
    """

    STRIPES = 16

    def __init__(self, state: dict[Any, Any] | None = None, *, slow: float = 0.0) -> None:
        self.data: dict[Any, Any] = dict(state or {})
        self.locks = [threading.Lock() for _ in range(self.STRIPES)]
        self.log: persistlog.Log | None = None
        self.slow = slow  # seconds to sleep per emitted record (a slow enumeration)
        self.fail_enumerate: BaseException | None = None
        self.enumerations = 0
        self.changes = 0  # records logged through put, put_many and delete

    def _lock(self, key: Any) -> threading.Lock:
        return self.locks[hash(key) % self.STRIPES]

    def enumerate_all(self, emit: Callable[[Any], None]) -> None:
        self.enumerations += 1
        # List the resources while no change is in flight: a resource being created right
        # now was logged into the old log, so it must be in this list (the seed's contract).
        for lock in self.locks:
            lock.acquire()
        try:
            keys = list(self.data)
        finally:
            for lock in self.locks:
                lock.release()
        for key in keys:
            with self._lock(key):
                if key in self.data:
                    emit({"op": "put", "key": key, "value": self.data[key]})
            if self.fail_enumerate is not None:
                raise self.fail_enumerate  # after emitting one record
            if self.slow:
                time.sleep(self.slow)
        if self.fail_enumerate is not None:
            raise self.fail_enumerate

    def open(self, url: str, **options: Any) -> persistlog.Log:
        """Restore, then open: a destination holding records replaces the app's state
        (an empty one keeps the state the App was built with, which the enumeration writes)."""
        restored: dict[Any, Any] = {}
        result = persistlog.restore(
            url, lambda r: apply(restored, r),
            **{k: options[k] for k in ("storage_options", "codec", "key_provider") if k in options},
        )
        if result.found:
            self.data = restored
        # Its locks keep the concurrency contract: enumerations run beside the updates.
        options.setdefault("concurrent_enumeration", True)
        self.log = persistlog.open(url, self.enumerate_all, **options)
        return self.log

    def put(self, key: Any, value: Any, sync: bool = False) -> int:
        assert self.log is not None
        with self._lock(key):
            lsn = self.log.update({"op": "put", "key": key, "value": value}, sync=sync)
            self.data[key] = value
        self.changes += 1
        return lsn

    def put_many(self, changes: list[tuple[Any, Any]], sync: bool = False) -> int:
        """Log several puts with one ``update_many``, holding every key's lock."""
        assert self.log is not None
        # In stripe order, as the enumeration takes them: no deadlock.
        locks = [self.locks[i] for i in sorted({hash(k) % self.STRIPES for k, _ in changes})]
        for lock in locks:
            lock.acquire()
        try:
            lsn = self.log.update_many(
                [{"op": "put", "key": k, "value": v} for k, v in changes], sync=sync
            )
            for k, v in changes:
                self.data[k] = v
        finally:
            for lock in reversed(locks):
                lock.release()
        self.changes += len(changes)
        return lsn

    def delete(self, key: Any, sync: bool = False) -> int:
        assert self.log is not None
        with self._lock(key):
            lsn = self.log.update({"op": "del", "key": key}, sync=sync)
            self.data.pop(key, None)
        self.changes += 1
        return lsn


def apply(state: dict[Any, Any], record: Any) -> None:
    """Replay one ResourceStore-convention record into ``state``; any other record is a
    test bug."""
    if not isinstance(record, dict) or record.get("op") not in ("put", "del"):
        raise AssertionError(f"unexpected record {record!r}")
    if record["op"] == "put":
        state[record["key"]] = record["value"]
    else:
        state.pop(record["key"], None)


def restore_state(url: str, **options: Any) -> tuple[dict[Any, Any], persistlog.RestoreResult]:
    """Restore ``url`` into a fresh dict."""
    state: dict[Any, Any] = {}
    result = persistlog.restore(url, lambda r: apply(state, r), **options)
    return state, result


def replay_ops(base: dict[Any, Any], ops: Iterable[tuple[Any, ...]]) -> dict[Any, Any]:
    """``base`` after the model operations ``("put", k, v)`` / ``("del", k)``."""
    state = dict(base)
    for op in ops:
        _replay_op(state, op)
    return state


def prefix_states(base: dict[Any, Any], ops: list[tuple[Any, ...]]) -> list[dict[Any, Any]]:
    """The model's state after each prefix of ``ops``: element k is after ``ops[:k]``."""
    states = [dict(base)]
    state = dict(base)
    for op in ops:
        _replay_op(state, op)
        states.append(dict(state))
    return states


def _replay_op(state: dict[Any, Any], op: tuple[Any, ...]) -> None:
    if op[0] == "put":
        state[op[1]] = op[2]
    else:
        state.pop(op[1], None)

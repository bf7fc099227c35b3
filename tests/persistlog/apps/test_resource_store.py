"""``ResourceStore``: the dict that restores, enumerates and logs itself, across restarts,
concurrent writers with rotations, and compound operations."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from kv_app import restore_state
from threads import run_threads

import persistlog


# -- ResourceStore ----------------------------------------------------------------------


def test_resource_store_three_lines_and_restart(log_dir: str) -> None:
    store = persistlog.ResourceStore.open(log_dir)
    store["user:1"] = {"name": "Ada"}
    store.close()

    with persistlog.ResourceStore.open(log_dir, durability="fsync") as store:
        assert store.to_dict() == {"user:1": {"name": "Ada"}}
        assert store.restored is not None and store.restored.found
        store["user:2"] = {"name": "Grace"}
        store["n"] = 1
        del store["user:1"]
        with pytest.raises(KeyError):
            del store["missing"]
        assert sorted(store) == ["n", "user:2"] and len(store) == 2 and "n" in store
        assert store.get("nope", 5) == 5
        store.log.rotate()
        store["n"] = 2
    state, _ = restore_state(log_dir)
    assert state == {"user:2": {"name": "Grace"}, "n": 2}
    with persistlog.ResourceStore.open(log_dir) as store:
        assert store.to_dict() == state
        assert store.log.seq == 4


def test_resource_store_concurrent_writers_and_rotations(log_dir: str) -> None:
    store = persistlog.ResourceStore.open(log_dir, rotate_records=40, durability="flush")

    def work(t: int) -> None:
        for i in range(150):
            store[f"{t}:{i % 11}"] = i
            if i % 5 == 0:
                store.pop(f"{t}:{(i + 3) % 11}", None)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for _ in range(5):
        store.log.rotate()
    for t in threads:
        t.join()
    expected = store.to_dict()
    store.close()
    assert restore_state(log_dir)[0] == expected
    with persistlog.ResourceStore.open(log_dir) as again:
        assert again.to_dict() == expected


def test_resource_store_compound_operations_are_atomic(log_dir: str) -> None:
    """pop, setdefault, popitem and update hold the store's lock throughout: with fsyncs
    releasing the GIL mid-operation, two threads never both pop one key, setdefault
    never sets a key twice, and the log replays to exactly the store."""
    store = persistlog.ResourceStore.open(log_dir, durability="fsync")
    store.update({k: k for k in range(60)})
    popped: list[list[int]] = [[] for _ in range(6)]
    defaults: list[dict[int, int]] = [{} for _ in range(6)]

    def work(t: int) -> None:
        for k in range(60):
            if store.pop(k, None) is not None:
                popped[t].append(k)
            defaults[t][k + 100] = store.setdefault(k + 100, t)

    assert run_threads(work, 6) == []
    assert sorted(k for ks in popped for k in ks) == list(range(60))  # each key popped once
    for k in range(100, 160):
        assert len({d[k] for d in defaults}) == 1  # every thread saw the one value set
    key, value = store.popitem()
    assert (key, value) == (159, defaults[0][159])  # the last key set
    expected = store.to_dict()
    assert sorted(expected) == list(range(100, 159))
    assert store.values() == [expected[k] for k in store.keys()]
    updates = store.log.stats()["updates"]
    store.close()
    assert updates == 60 + 60 + 60 + 1  # puts, pops, one setdefault per key, popitem
    assert restore_state(log_dir)[0] == expected
    store = persistlog.ResourceStore.open(log_dir)
    store.clear()
    assert len(store) == 0
    store.close()
    assert restore_state(log_dir)[0] == {}


def test_opening_a_new_location_says_it_creates_one(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A mistyped path must not pass silently for an empty store: the log says it is new."""
    caplog.set_level(logging.INFO, logger="persistlog")
    store = persistlog.ResourceStore.open(str(tmp_path / "typo"))
    store.close()
    assert any("no log at" in r.getMessage() and "a new one was created" in r.getMessage() for r in caplog.records)
    caplog.clear()
    store = persistlog.ResourceStore.open(str(tmp_path / "typo"))
    store.close()
    assert not any("a new one was created" in r.getMessage() for r in caplog.records)

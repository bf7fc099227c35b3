"""Ctrl-C at any point of a ResourceStore's changes and rotations: the store's memory and
its log never disagree, and a batch is all there or not at all."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from interrupt_points import PointInterrupter, Retrier, every_point

import persistlog


def _store_path_files() -> tuple[str, ...]:
    """Where a store's calls run on the app's thread: the store, the writer, the runtime
    and the destinations."""
    import destinations

    package = Path(persistlog.__file__).parent
    return (str(package / "_apps" / "store.py"), str(package / "_write") + os.sep, str(package / "_runtime.py"),
            str(Path(destinations.__file__).parent) + os.sep)


def _interrupted_at_point(root: Path, durability: str, nth: int | None) -> tuple[int, int, str]:
    """Set, delete and set in batches (``update``) a few keys of a store (a count trigger
    of 4: rotations, each enumerating the store beside the changes), then close, with a
    KeyboardInterrupt at the ``nth`` point where CPython can run a signal handler on the
    app's thread in the store's path (None: none). Single changes are retried as an app
    would; an interrupted batch is not, and must be in the store whole or not at all.
    Then the store as it stands, and as it restores, is the model of what was done."""
    url = str(root / f"store-{nth}")
    store = persistlog.ResourceStore.open(url, durability=durability, rotate_records=4, retain=1,
                                          segment_bytes=4096, flush_interval=3600)
    model: dict[str, Any] = {}
    retried = Retrier()
    batches_interrupted = 0
    with PointInterrupter(_store_path_files(), nth) as at:
        for i in range(10):
            key = f"k{i % 4}"
            retried(lambda: store.__setitem__(key, {"i": i, "pad": "x" * 100}))
            model[key] = {"i": i, "pad": "x" * 100}
            if i % 3 == 2:
                batch = {f"b{i}": i, f"c{i}": [i, i]}
                try:
                    store.update(batch)
                    model.update(batch)
                except KeyboardInterrupt:
                    batches_interrupted += 1
                    there = [k in store for k in batch]
                    assert all(there) or not any(there), (at.where, there)
                    if all(there):
                        model.update(batch)
            if i % 4 == 3:
                retried(lambda: store.pop(key, None))
                model.pop(key, None)
        retried(store.close)
    point = at.where
    assert retried.slowest < 5, (point, retried.slowest)
    assert store.to_dict() == model, point
    again = persistlog.ResourceStore.open(url)
    restored = again.to_dict()
    again.close()
    assert restored == model, point
    return at.points, retried.interrupts + batches_interrupted, point


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["flush", "buffered"])
def test_an_interruption_at_any_point_of_a_store_keeps_its_memory_and_its_log_alike(
        tmp_path: Path, durability: str) -> None:
    """A KeyboardInterrupt at each point where CPython could run Ctrl-C's handler on the
    app's thread in a ResourceStore's path (the store, the writer, the runtime, the
    destinations: as each Python function starts, and after each C call returns), through
    single changes, batches and the rotations a count trigger starts (each enumerating
    the store while it changes), and ``close()``: the retried calls go through without
    waiting for a timeout; an interrupted batch is in the store whole or not at all; and
    the store, before and after a restore, is what the app did."""
    every_point(lambda nth: _interrupted_at_point(tmp_path, durability, nth))

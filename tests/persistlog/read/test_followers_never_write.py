"""Followers only read: a destination they follow is byte for byte what its writer left."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import persistlog
from kv_app import apply
from follower_harness import Where, Writer, shared_where


# -- followers never write ------------------------------------------------------------------


def _snapshot_local(path: Path) -> dict[str, tuple[int, int]]:
    return {e.name: (e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(path)}


@pytest.mark.slow
def test_followers_never_write(shared_where: Where, tmp_path: Path) -> None:
    where = shared_where
    w = Writer(where.url, where.so, retain=1, **where.open_options)
    for i in range(50):
        w.put(f"k{i % 11}", i)
    w.log.rotate()
    w.put("z", 1)
    w.close()
    local = Path(where.url) if where.kind == "local" else None
    before = _snapshot_local(local) if local else None
    names = where.names()
    state: dict[str, Any] = {}
    f = where.follow(lambda r: apply(state, r), on_reset=state.clear)
    f.poll()
    # A resume from a stale cursor (a reset), then idle polls.
    stale = persistlog.Cursor(1, 0, 40, 1)
    f2 = where.follow(lambda r: apply(state, r), cursor=stale, on_reset=state.clear)
    f2.poll()
    for _ in range(5):
        f.poll()
        f2.poll()
    assert f2.resets == 1
    assert state == w.data
    if local:
        assert _snapshot_local(local) == before
    else:
        for fl in (f, f2):
            stats = fl.dest.stats()
            assert stats["PUT"] == 0 and stats["DELETE"] == 0, stats
    assert where.names() == names
    # Following a destination that does not exist creates nothing.
    if local:
        missing = tmp_path / "missing" / "log"
        with pytest.raises(persistlog.LogNotFoundError):
            persistlog.follow(str(missing), lambda r: None).poll()
        g = persistlog.follow(str(missing), lambda r: None, wait_for_log=True)
        assert g.poll() == 0
        assert not missing.exists() and not missing.parent.exists()

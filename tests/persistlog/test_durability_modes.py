"""The durability modes: where a record is when ``update()`` returns under ``buffered``,
``flush`` and ``fsync``, and fsync callers sharing syncs (group commit)."""

from __future__ import annotations

import threading
from typing import Any

from kv_app import App, restore_state
from threads import wait_until

import persistlog


# -- durability modes -------------------------------------------------------------------


def _on_disk(url: str) -> dict[Any, Any]:
    """What another reader (other file descriptors) finds right now."""
    return restore_state(url)[0]


def test_durability_buffered_holds_records_until_flush(log_dir: str) -> None:
    app = App({})
    lg = app.open(log_dir, durability="buffered", flush_interval=3600.0)
    app.put("a", 1)
    assert _on_disk(log_dir) == {}  # still in the process: buffered mode promised nothing
    lg.sync()
    assert _on_disk(log_dir) == {"a": 1}
    assert lg.durable_lsn == lg.next_lsn - 1
    app.put("b", 2, sync=True)  # per-call sync in buffered mode
    assert _on_disk(log_dir) == {"a": 1, "b": 2}
    assert lg.durable_lsn == lg.next_lsn - 1
    lg.close()


def test_durability_buffered_reaches_the_os_on_the_timer(log_dir: str) -> None:
    app = App({})
    lg = app.open(log_dir, durability="buffered", flush_interval=0.05)
    app.put("a", 1)
    wait_until(lambda: _on_disk(log_dir) == {"a": 1}, describe="the flush timer")
    lg.close()


def test_durability_flush_reaches_the_os_before_update_returns(log_dir: str) -> None:
    app = App({})
    lg = app.open(log_dir, durability="flush", flush_interval=3600.0)
    syncs = lg.stats()["syncs"]
    for i in range(20):
        app.put(i, i)
        assert _on_disk(log_dir) == app.data  # read through other descriptors
    assert lg.stats()["syncs"] == syncs  # written, not synced
    assert lg.durable_lsn < lg.next_lsn - 1
    lg.sync()
    assert lg.durable_lsn == lg.next_lsn - 1
    lg.close()


def test_durability_fsync_is_durable_before_update_returns(log_dir: str) -> None:
    app = App({})
    lg = app.open(log_dir, durability="fsync", flush_interval=3600.0)
    for i in range(10):
        syncs = lg.stats()["syncs"]
        lsn = app.put(i, i)
        assert lg.durable_lsn >= lsn
        assert lg.stats()["syncs"] == syncs + 1
        assert _on_disk(log_dir) == app.data
    lg.close()


def test_fsync_group_commit_shares_syncs(log_dir: str) -> None:
    lg = persistlog.open(log_dir, lambda emit: None, durability="fsync")
    before = lg.stats()
    barrier = threading.Barrier(8)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(100):
            lsn = lg.update({"op": "put", "key": f"{t}-{i}", "value": i})
            assert lg.durable_lsn >= lsn

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = lg.stats()
    assert after["updates"] - before["updates"] == 800
    assert after["syncs"] - before["syncs"] <= 800
    lg.close()
    assert len(restore_state(log_dir)[0]) == 800

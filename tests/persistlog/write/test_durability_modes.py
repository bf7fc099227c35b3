"""The durability modes: where a record is when ``update()`` returns under ``buffered``,
``flush`` and ``fsync``, and fsync callers sharing syncs (group commit); on an object
store, ``flush`` survives a process crash as it does locally."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from child_scripts import AckingWriter
from kv_app import App, restore_state
from threads import run_threads, wait_until

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


def _durable_from_threads(lg: persistlog.Log, threads: int, each: int) -> int:
    """``threads`` threads updating ``each`` times at once, every update durable when it
    returns; the syncs (fsyncs or PUTs) that took."""
    before = lg.stats()

    def work(t: int) -> None:
        for i in range(each):
            lsn = lg.update({"op": "put", "key": f"{t}-{i}", "value": i})
            assert lg.durable_lsn >= lsn

    assert run_threads(work, threads) == []
    after = lg.stats()
    assert after["updates"] - before["updates"] == threads * each
    return int(after["syncs"] - before["syncs"])


def test_fsync_group_commit_shares_syncs(log_dir: str) -> None:
    lg = persistlog.open(log_dir, lambda emit: None, durability="fsync")
    assert _durable_from_threads(lg, 8, 100) <= 800
    lg.close()
    assert len(restore_state(log_dir)[0]) == 800


# -- flush on an object store -----------------------------------------------------------


def test_flush_on_an_object_store_returns_after_the_put(clean_memory_fs: None) -> None:
    """On an object store ``flush`` returns once the PUT of the segment object holding the
    record succeeded, and concurrent callers share PUTs as fsync callers share fsyncs."""
    url = "memory://flush-mode/log"
    lg = persistlog.open(url, lambda emit: None, durability="flush", flush_interval=3600.0)
    for i in range(5):
        lsn = lg.update({"op": "put", "key": f"k{i}", "value": i})
        assert lg.durable_lsn >= lsn
        assert restore_state(url)[0] == {f"k{n}": n for n in range(i + 1)}
    assert 1 <= _durable_from_threads(lg, 8, 25) <= 200
    lg.close()
    assert len(restore_state(url)[0]) == 205


@pytest.mark.slow
@pytest.mark.s3
def test_flush_on_s3_keeps_every_acknowledged_update_through_sigkill(
    s3_bucket: str, s3_storage_options: dict[str, Any], tmp_path: Path
) -> None:
    """A process writing in ``flush`` mode to S3 from 4 threads, killed with SIGKILL: a
    restore holds every update it acknowledged, and each thread's updates form a prefix
    of what it attempted (docs/DESIGN.md invariant 1)."""
    url = f"s3://{s3_bucket}/flush/log"
    so = s3_storage_options
    for rnd, wanted in enumerate((30, 120)):
        name = f"r{rnd}"
        writer = AckingWriter(
            {"url": url, "storage_options": so, "name": name, "threads": 4, "open_retry": 20,
             "open": {"durability": "flush", "lease_ttl": 1.5}},
            tmp_path, f"writer{rnd}",
        )
        try:
            writer.wait_for("acknowledgements", lambda: writer.count("A ") >= wanted, 60)
            writer.signal(signal.SIGKILL)
            assert writer.wait(30) == -signal.SIGKILL
        finally:
            writer.close()
        state, result = restore_state(url, storage_options=so)
        acked = writer.acked_keys(name)
        assert len(acked) >= wanted
        missing = sorted(acked - set(state))
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged updates lost: {missing[:10]}"
        for t in range(4):
            restored = sorted(int(k.split(".")[2]) for k in state if k.startswith(f"{name}.{t}."))
            assert restored == list(range(len(restored))), f"thread {t}: not a prefix"

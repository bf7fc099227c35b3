"""What the follower tests share: ``Writer``, the test app with its Log open;
``Where``, the destinations they run on (local, ``memory://``, S3 on moto) as the ``where``
and ``shared_where`` fixtures; and draining a follower and checking its LSN chain."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import persistlog
from kv_app import App, restore_state
from destinations import open_destination


class Writer(App):
    """The test app with its Log open from the start (restoring first with ``restore``)."""

    def __init__(
        self, url: str, storage_options: dict[str, Any] | None = None, *, restore: bool = False, **options: Any
    ) -> None:
        super().__init__()
        self.url = url
        self.so = storage_options
        if restore:  # restore, then open: the app's state is what the log holds
            self.data = restore_state(url, storage_options=storage_options)[0]
        options.setdefault("concurrent_enumeration", True)  # App's locks keep the contract
        self.log: persistlog.Log = persistlog.open(url, self.enumerate_all, storage_options=storage_options, **options)

    def random_ops(self, rng: random.Random, count: int, keys: int = 25) -> None:
        for _ in range(count):
            key = f"k{rng.randrange(keys)}"
            if rng.random() < 0.25:
                self.delete(key)
            else:
                self.put(key, [self.changes, "v" * rng.randrange(40)])

    @property
    def last_lsn(self) -> int:
        return self.log.next_lsn - 1

    def close(self) -> None:
        self.log.close()


@dataclass
class Where:
    """One kind of destination a test runs against."""

    kind: str
    url: str
    so: dict[str, Any] | None = None
    # Options of persistlog.open suited to the kind (flush intervals, leases).
    open_options: dict[str, Any] = field(default_factory=dict)

    def dest(self) -> Any:
        return open_destination(self.url, **(self.so or {}))

    def names(self) -> list[str]:
        return self.dest().list()

    def log_seqs(self) -> list[int]:
        return sorted({int(n[:20]) for n in self.names() if n.endswith(".plog")})

    def restore(self) -> tuple[dict[str, Any], persistlog.RestoreResult]:
        return restore_state(self.url, storage_options=self.so)

    def follow(self, replay: Callable[[Any], Any] | None = None, **kwargs: Any) -> persistlog.Follower:
        kwargs.setdefault("poll_interval", 0.02)
        return persistlog.follow(self.url, replay, storage_options=self.so, **kwargs)


def make_where(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    if kind == "local":
        return Where(kind, str(tmp_path / "log"))
    if kind == "memory":
        request.getfixturevalue("clean_memory_fs")
        return Where(kind, f"memory://f{uuid.uuid4().hex[:10]}/log", open_options={"flush_interval": 0.02})
    if kind == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        so = request.getfixturevalue("s3_storage_options")
        return Where(kind, f"s3://{bucket}/app/log", so, open_options={"flush_interval": 0.05, "lease_ttl": 3})
    raise AssertionError(kind)


@pytest.fixture(params=["local", "memory", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    return make_where(request.param, request, tmp_path)


@pytest.fixture(params=["local", "s3"])
def shared_where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    """Destinations another process can reach (memory:// is per process)."""
    return make_where(request.param, request, tmp_path)




def drain(follower: persistlog.Follower, target_lsn: int, timeout: float = 20.0) -> list[persistlog.FollowedBatch]:
    """Iterate ``follower`` until it applied ``target_lsn``; the batches it yielded."""
    out: list[persistlog.FollowedBatch] = []
    if follower.cursor is not None and follower.cursor.next_lsn - 1 == target_lsn:
        return out  # already there (a cursor ahead of the log is not: it must reset)
    guard = threading.Timer(timeout, follower.stop)
    guard.start()
    try:
        for fb in follower:
            out.append(fb)
            if fb.last_lsn >= target_lsn:
                break
    finally:
        guard.cancel()
    assert out and out[-1].last_lsn == target_lsn, (
        f"follower stopped at {out[-1].last_lsn if out else None}, expected LSN {target_lsn}; error={follower.error!r}"
    )
    return out


def check_chain(batches: list[persistlog.FollowedBatch], after: int | None) -> int | None:
    """Assert the batches carry gapless, non-repeating LSNs after ``after``; returns the last."""
    for fb in batches:
        assert fb.last_lsn - fb.first_lsn + 1 == len(fb.records), fb
        if after is not None:
            assert fb.first_lsn == after + 1, f"LSN {after + 1} expected, batch starts at {fb.first_lsn}"
        after = fb.last_lsn
        assert fb.cursor.next_lsn == fb.last_lsn + 1
    return after

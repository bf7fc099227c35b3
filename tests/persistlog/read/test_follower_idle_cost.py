"""An idle follower costs little: no busy loop on a local directory, no LIST and at most two
requests per poll on S3."""

from __future__ import annotations

import json
from collections import Counter
import subprocess
import sys
from pathlib import Path

import pytest

import persistlog

from follower_harness import Writer, make_where
from s3_requests import S3Requests
from child_scripts import PROCS, child_env


# -- idle cost ---------------------------------------------------------------------------


@pytest.mark.slow
def test_idle_local_follower_does_not_busy_loop(tmp_path: Path) -> None:
    w = Writer(str(tmp_path / "log"), segment_bytes=4096)
    for i in range(300):
        w.put(f"k{i % 13}", ["v" * 20, i])
    w.log.rotate()
    w.log.sync()
    try:
        out = subprocess.run(
            [sys.executable, str(PROCS / "idle_follower.py"), w.url, "1.0"],
            capture_output=True, text=True, timeout=60, env=child_env(),
        )
        assert out.returncode == 0, out.stderr
        r = json.loads(out.stdout)
    finally:
        w.close()
    assert r["error"] is None
    assert r["applied"] > 0
    assert r["polls"] >= 5  # it does poll while idle...
    assert r["cpu"] / r["wall"] < 0.2, r  # ...without spinning


@pytest.mark.slow
def test_idle_s3_follower_lists_nothing_and_sends_at_most_two_requests_per_poll(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Counted as sent, at botocore: an idle poll asks for the two names that may come next
    (or for one and CURRENT), never LISTs; new segments and logs are found the same way."""
    where = make_where("s3", request, tmp_path)
    w = Writer(where.url, where.so, segment_bytes=4096, **where.open_options)
    try:
        for r in range(3):
            for i in range(40):
                w.put(f"k{i}", [r, i])
            w.log.sync()
            w.log.rotate()
        w.log.sync()
        # An s3fs instance of its own: only the follower's requests are counted.
        f = persistlog.follow(where.url, lambda r: None, poll_interval=0.05,
                              storage_options={**(where.so or {}), "skip_instance_cache": True})
        while f.poll():
            pass
        sent = S3Requests(f.dest)
        per_poll = []
        for _ in range(30):
            before = sent.snapshot()
            assert f.poll() == 0
            per_poll.append(sent.since(before))
        assert all(sum(c.values()) <= 2 for c in per_poll), per_poll
        total = sum(per_poll, Counter())
        assert total["ListObjectsV2"] == 0 and set(total) <= {"HeadObject", "GetObject"}, total
        assert total["HeadObject"] >= 50  # it does look, every poll
        # New segments, then a new log: found by name, still without a LIST.
        before = sent.snapshot()
        for i in range(60):
            w.put(f"n{i}", i)
            if i % 20 == 19:
                w.log.sync()
        w.log.rotate()
        w.put("last", 1)
        w.log.sync()
        applied = 0
        while (got := f.poll()) or applied < 62:
            applied += got
            assert f.polls < 10_000
        assert sent.since(before)["ListObjectsV2"] == 0
        assert f.cursor is not None and f.cursor.next_lsn == w.last_lsn + 1
        f.stop()
    finally:
        w.close()

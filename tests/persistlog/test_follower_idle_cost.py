"""An idle follower costs little: no busy loop on a local directory, one request per poll on
S3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from follower_harness import Writer, make_where
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
def test_idle_s3_follower_makes_one_request_per_poll(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    where = make_where("s3", request, tmp_path)
    w = Writer(where.url, where.so, segment_bytes=4096, **where.open_options)
    try:
        for r in range(3):
            for i in range(40):
                w.put(f"k{i}", [r, i])
            w.log.sync()
            w.log.rotate()
        w.log.sync()
        f = where.follow(lambda r: None, poll_interval=0.05)
        while f.poll():
            pass
        f.poll()
        dest = f.dest
        before, polls = dest.stats(), f.polls
        for _ in range(20):
            assert f.poll() == 0
        after = dest.stats()
        delta = {k: after[k] - before[k] for k in after}
        assert f.polls - polls == 20
        assert delta == {"PUT": 0, "GET": 0, "LIST": 20, "DELETE": 0, "HEAD": 0}, delta
        f.stop()
    finally:
        w.close()

"""A follower process tailing a writer process on a local directory and on S3 (moto),
through rotations, retention, a SIGKILL of the writer and its restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from threads import wait_until
from follower_harness import Where, shared_where
from child_scripts import Proc, read_json


# -- writer and follower processes -----------------------------------------------------


@pytest.mark.slow
def test_follower_process_tracks_writer_process_through_kill_and_restart(shared_where: Where, tmp_path: Path) -> None:
    """A follower process keeps up with a writer process through updates, deletes, several
    rotations with retention, a SIGKILL of the writer and its restart (restore, then open):
    once caught up, the follower holds exactly the writer's state, having applied every LSN
    once in order (between resets, if it ever lagged past retention)."""
    w = shared_where
    run = tmp_path / "run"
    run.mkdir()
    opts: dict[str, Any] = {"segment_bytes": 4096, "retain": 2, "flush_interval": 0.01}
    if w.kind == "s3":
        opts.update(flush_interval=0.05, lease_ttl=2)
    follower_cfg = {
        "url": w.url, "storage_options": w.so, "poll": 0.01 if w.kind == "local" else 0.05,
        "progress": str(run / "f.progress"), "stop": str(run / "f.stop"), "out": str(run / "f.out"),
    }
    writer_cfg = {
        "url": w.url, "storage_options": w.so, "seed": 1, "ops": 100_000, "keys": 40,
        "rotate_every": 60, "sync_every": 7, "pace": 0.004, "open": opts,
        "progress": str(run / "w1.progress"), "result": str(run / "w1.result"),
    }
    procs: list[Proc] = []
    try:
        # The follower starts first, on a destination that has no log yet.
        follower = Proc("follower.py", follower_cfg, run, "follower")
        procs.append(follower)
        writer1 = Proc("writer.py", writer_cfg, run, "writer1")
        procs.append(writer1)

        def w1_ops() -> int:
            p = read_json(run / "w1.progress")
            assert writer1.p.poll() is None, f"writer 1 exited early:\n{writer1.stderr()}"
            return p["ops"] if p else 0

        # Several rotations (every 60 operations) and retention happen before the kill.
        wait_until(lambda: w1_ops() >= 330, 60, lambda: f"writer 1 progress {read_json(run / 'w1.progress')}")
        writer1.kill()
        acked = read_json(run / "w1.progress")["acked_lsn"]

        writer2_cfg = dict(writer_cfg, seed=2, ops=150, pace=0.002, rotate_every=50, open_retry=30,
                           progress=str(run / "w2.progress"), result=str(run / "w2.result"))
        writer2 = Proc("writer.py", writer2_cfg, run, "writer2")
        procs.append(writer2)
        assert writer2.wait(90) == 0, writer2.stderr()
        result = read_json(run / "w2.result")
        # Restore-then-open found everything writer 1 acknowledged as durable.
        assert result["restored_from"] >= acked
        last = result["next_lsn"] - 1

        def caught_up() -> bool:
            assert follower.p.poll() is None, f"follower exited:\n{follower.stderr()}"
            p = read_json(run / "f.progress")
            return bool(p and p["last_lsn"] == last)

        wait_until(caught_up, 60, lambda: f"follower at {read_json(run / 'f.progress')}, writer ended at LSN {last}")
        (run / "f.stop").touch()
        assert follower.wait(30) == 0, follower.stderr()
        out = read_json(run / "f.out")
    finally:
        for p in procs:
            p.close()
    assert out["lsn_errors"] == [], out["lsn_errors"]
    assert out["state"] == result["state"]
    restored, _ = w.restore()
    assert restored == result["state"]
    # Retention deleted the old logs while the follower was following.
    assert min(w.log_seqs()) > 3
    if w.kind == "s3":
        assert out["stats"]["PUT"] == 0 and out["stats"]["DELETE"] == 0, out["stats"]

"""The local writer lock: a LOCK file naming a process, no descriptor held, taken over
exactly when its holder is gone (killed, reaped or not, its pid reused, an earlier boot)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import persistlog
from destinations import HolderRecord, LockHeld, open_destination
from destinations._process import boot_id, identity
from destinations.local import LOCK_NAME


def _record(pid: int, **fields: object) -> bytes:
    base: dict[str, object] = {"owner": "someone", "host": socket.gethostname(), "pid": pid, "since": 1.0}
    base.update(identity() if pid == os.getpid() else {})
    base.update(fields)
    return json.dumps(base).encode() + b"\n"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _takes_over(tmp_path: Path, held: bytes) -> None:
    dest = open_destination(str(tmp_path / "log"))
    dest.ensure()
    (tmp_path / "log" / LOCK_NAME).write_bytes(held)
    lock = dest.lock("new-writer")
    try:
        record = HolderRecord.parse((tmp_path / "log" / LOCK_NAME).read_bytes())
        assert record is not None and record.owner == "new-writer" and record.pid == os.getpid()
        assert record.running() is True
    finally:
        lock.release()
    assert not (tmp_path / "log" / LOCK_NAME).exists()  # a clean release removes it


def test_the_lock_of_an_exited_process_is_taken_over(tmp_path: Path) -> None:
    _takes_over(tmp_path, _record(_dead_pid()))


def test_a_reused_pid_is_not_its_old_holder(tmp_path: Path) -> None:
    """This very process's pid, with another start time: the holder was an earlier process
    the pid belonged to."""
    start = identity()["start"]
    assert isinstance(start, int)
    _takes_over(tmp_path, _record(os.getpid(), start=start - 1))


def test_a_holder_of_an_earlier_boot_is_gone(tmp_path: Path) -> None:
    assert boot_id() is not None
    _takes_over(tmp_path, _record(os.getpid(), boot_id="00000000-0000-0000-0000-000000000000"))


@pytest.mark.parametrize("raw", [b"", b"\n", b'{"owner": "torn', b"\x00" * 40])
def test_an_empty_or_torn_lock_file_is_free(tmp_path: Path, raw: bytes) -> None:
    _takes_over(tmp_path, raw)


def test_a_killed_holder_not_yet_reaped_is_gone(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom destinations import open_destination\n"
         "open_destination(sys.argv[1]).lock('child')\nprint('locked', flush=True)\ntime.sleep(60)\n", url],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        with pytest.raises(LockHeld):
            open_destination(url).lock("parent")
        os.kill(child.pid, signal.SIGKILL)
        for _ in range(500):  # a zombie until reaped: /proc shows it in state Z
            with open(f"/proc/{child.pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break
            time.sleep(0.01)
        lock = open_destination(url).lock("parent")  # no wait for the reaping
        lock.release()
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_a_holder_on_another_host_counts_as_running_and_the_error_says_what_to_do(tmp_path: Path) -> None:
    dest = open_destination(str(tmp_path / "log"))
    dest.ensure()
    held = _record(_dead_pid(), host="elsewhere.example", owner="remote-writer")
    (tmp_path / "log" / LOCK_NAME).write_bytes(held)
    with pytest.raises(LockHeld) as info:
        dest.lock("me")
    assert "remote-writer" in info.value.holder and "another host" in str(info.value)
    assert (tmp_path / "log" / LOCK_NAME).read_bytes() == held  # untouched


def test_a_held_lock_keeps_no_descriptor_open(tmp_path: Path) -> None:
    def open_paths() -> set[str]:
        out = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                out.add(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        return out

    before = open_paths()
    locks = [open_destination(str(tmp_path / f"log-{i}")).lock("w") for i in range(20)]
    assert not {p for p in open_paths() - before if str(tmp_path) in p}
    for lk in locks:
        lk.release()


def test_a_release_leaves_a_lock_that_is_no_longer_its_own(tmp_path: Path) -> None:
    dest = open_destination(str(tmp_path / "log"))
    lock = dest.lock("first")
    theirs = _record(os.getpid(), owner="taken-by-hand")
    (tmp_path / "log" / LOCK_NAME).write_bytes(theirs)
    lock.release()
    assert (tmp_path / "log" / LOCK_NAME).read_bytes() == theirs


_RACER = textwrap.dedent("""
    import os, sys, time, persistlog
    url, go, me, via_set = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4] == "set"
    time.sleep(max(0.0, go - time.time()))
    try:
        if via_set:  # url is the set's root: every racer makes or opens the set, then its key
            lg = persistlog.LogSet(url).open("shared", lambda emit: emit({"snapshot-by": me}), durability="fsync")
        else:
            lg = persistlog.open(url, lambda emit: emit({"snapshot-by": me}), durability="fsync")
    except persistlog.WriterConflict as e:
        print("conflict", e, flush=True)
        sys.exit(0)
    lg.update({"by": me}, sync=True)
    print("won", os.getpid(), flush=True)
    sys.stdin.readline()  # hold it until every other racer has answered
    lg.close()
""")


@pytest.mark.parametrize("case", ["fresh", "stale", "set"])
def test_processes_racing_to_open_one_log_exactly_one_wins(tmp_path: Path, case: str) -> None:
    """Six processes open the same log at the same instant: on a new directory, on an
    existing log whose LOCK a killed writer left, and as one key of a LogSet none of them
    has made yet. One wins, every other gets WriterConflict naming it, and the log holds
    the winner's records only."""
    url = str(tmp_path / "log")
    if case == "stale":
        persistlog.open(url, lambda emit: None).close()
        (tmp_path / "log" / LOCK_NAME).write_bytes(_record(_dead_pid(), owner="killed-writer"))
    go = time.time() + 1.5
    procs = [
        subprocess.Popen([sys.executable, "-c", _RACER, url, str(go), f"p{i}", case], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(6)
    ]
    firsts = []
    for p in procs:
        assert p.stdout is not None
        firsts.append(p.stdout.readline())  # "won ..." or "conflict ...", or "" if it failed
    outs = [(first + out, err) for first, (out, err) in zip(firsts, (p.communicate("\n", timeout=120) for p in procs))]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    winners = [o[0].split() for o in outs if o[0].startswith("won")]
    assert len(winners) == 1, outs
    winner_pid = winners[0][1]
    conflicts = [o[0] for o in outs if o[0].startswith("conflict")]
    assert len(conflicts) == 5 and all(f"pid {winner_pid} " in c for c in conflicts), conflicts
    winner = next(f"p{i}" for i, o in enumerate(outs) if o[0].startswith("won"))
    got: list[object] = []
    if case == "set":
        logset = persistlog.LogSet(url)
        assert list(logset.keys()) == ["shared"]
        url = logset.url("shared")
    persistlog.restore(url, got.append)
    assert got == [{"snapshot-by": winner}, {"by": winner}]


@pytest.mark.parametrize(
    "held",
    [
        _record(_dead_pid(), owner="a writer whose record is longer than the new one's" * 4),
        _record(_dead_pid(), owner="w"),  # shorter: the new record is longer
        b"\x00" * (HolderRecord.MAX_BYTES + 100),  # longer than a record is ever read
    ],
    ids=["longer", "shorter", "oversized"],
)
def test_a_gone_holders_lock_is_overwritten_in_place_with_a_record_that_parses_whole(tmp_path: Path, held: bytes) -> None:
    # No rename over the old LOCK (a writeback and a trim on ext4): the same file, its
    # bytes exactly the new record, padded with spaces, and nothing of the old after it.
    dest = open_destination(str(tmp_path / "log"))
    dest.ensure()
    path = tmp_path / "log" / LOCK_NAME
    path.write_bytes(held)
    inode = path.stat().st_ino
    lock = dest.lock("new-writer")
    raw = path.read_bytes()
    assert path.stat().st_ino == inode
    record = HolderRecord.parse(raw)
    assert record is not None and record.owner == "new-writer" and record.running() is True
    own = raw.rstrip(b" ")
    assert own.endswith(b"}\n") and len(raw) == max(len(own), min(len(held), HolderRecord.MAX_BYTES))
    with pytest.raises(LockHeld):  # held: a second taker finds it running
        open_destination(str(tmp_path / "log")).lock("second")
    lock.release()
    assert not path.exists()  # the release knows its padded record

"""The local driver: conformance suite, durability details and a cross-process lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest
from conformance import DestinationConformance, MakeDest

from destinations import LockHeld, open_destination
from destinations.local import LOCK_NAME, LocalDestination, fsync_dir


class TestLocal(DestinationConformance):
    @pytest.fixture
    def make_dest(self, tmp_path: Path) -> Iterator[MakeDest]:
        def make(subdir: str = "log") -> LocalDestination:
            dest = open_destination(str(tmp_path / subdir))
            assert isinstance(dest, LocalDestination)
            return dest

        yield make


def test_plain_path_and_file_url_are_the_same_directory(tmp_path: Path) -> None:
    a = open_destination(str(tmp_path / "log"))
    b = open_destination(f"file://{tmp_path}/log/")
    assert isinstance(a, LocalDestination) and isinstance(b, LocalDestination)
    assert a.path == b.path == str(tmp_path / "log")
    a.ensure()
    a.create("x", b"1")
    assert b.list() == ["x"]


def test_ensure_makes_parents(tmp_path: Path) -> None:
    dest = open_destination(str(tmp_path / "a" / "b c" / "d.e"))
    assert not dest.exists()
    dest.ensure()
    assert (tmp_path / "a" / "b c" / "d.e").is_dir()


def test_ensure_where_a_file_is_says_not_a_directory(tmp_path: Path) -> None:
    """A file where the directory (or a parent) would be: ensure() says so as every other
    call there does, so that a writer reports it alike whichever call met it first."""
    (tmp_path / "f").write_text("x")
    for path in (tmp_path / "f", tmp_path / "f" / "log"):
        dest = open_destination(str(path))
        with pytest.raises(NotADirectoryError, match="Not a directory"):
            dest.ensure()
        with pytest.raises(NotADirectoryError):
            dest.replace("CURRENT", b"1")
    assert (tmp_path / "f").read_text() == "x"


def test_create_and_replace_leave_no_temp_files(tmp_path: Path) -> None:
    dest = open_destination(str(tmp_path))
    dest.ensure()
    dest.create("seg", b"1")
    dest.replace("CURRENT", b"2")
    with pytest.raises(FileExistsError):
        dest.create("seg", b"3")
    assert sorted(os.listdir(tmp_path)) == ["CURRENT", "seg"]


def test_list_skips_temp_files_and_directories(tmp_path: Path) -> None:
    dest = open_destination(str(tmp_path))
    (tmp_path / ".seg.123.abcd.tmp").write_bytes(b"partial")
    (tmp_path / "subdir").mkdir()
    (tmp_path / "seg").write_bytes(b"x")
    (tmp_path / ".hidden").write_bytes(b"listed: not a temp name")
    assert dest.list() == [".hidden", "seg"]


def test_lock_file_is_listed_and_records_the_holder(tmp_path: Path) -> None:
    dest = open_destination(str(tmp_path))
    lock = dest.lock("me")
    try:
        assert LOCK_NAME in dest.list()
        recorded = (tmp_path / LOCK_NAME).read_text()
        assert '"owner": "me"' in recorded and f'"pid": {os.getpid()}' in recorded
    finally:
        lock.release()


def test_fsync_dir(tmp_path: Path) -> None:
    fsync_dir(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        fsync_dir(str(tmp_path / "missing"))


def test_append_file_refuses_use_after_close(tmp_path: Path) -> None:
    dest = open_destination(str(tmp_path))
    dest.create("seg", b"")
    f = dest.open_append("seg")
    f.close()
    with pytest.raises(ValueError):
        f.write(b"x")


_HOLDER = textwrap.dedent("""
    import sys, time
    from destinations import open_destination
    lock = open_destination(sys.argv[1]).lock("child-writer")
    print("locked", flush=True)
    time.sleep(60)
    """)


def test_lock_held_by_another_process_until_it_is_killed(tmp_path: Path) -> None:
    dest = open_destination(str(tmp_path / "log"))
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, dest.url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(LockHeld) as info:
            dest.lock("parent-writer")
        assert "child-writer" in info.value.holder
        assert f"pid {child.pid}" in info.value.holder
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        # The OS dropped the dead process's flock: no stale lock to clean up.
        deadline = time.monotonic() + 5
        while True:
            try:
                lock = dest.lock("parent-writer")
                break
            except LockHeld:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        lock.release()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()

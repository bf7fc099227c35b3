"""The process-wide cache of append descriptors: a bound on open files that loses nothing."""

from __future__ import annotations

import errno
import json
import os
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from destinations._open_files import LIMIT_VARIABLE, AppendDescriptor, OpenFiles, _libc_syncfs
from tests.childproc import run_python
from tests.persistlog.interrupt_points import PointInterrupter


def _write(d: AppendDescriptor, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[d.write(view):]


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(1, 3),
    ops=st.lists(
        st.tuples(st.integers(0, 4), st.sampled_from(["write", "sync", "size", "truncate"]), st.binary(max_size=40)),
        max_size=60,
    ),
)
def test_files_read_back_exactly_whatever_the_cache_closes(tmp_path_factory: pytest.TempPathFactory, limit: int, ops: list[tuple[int, str, bytes]]) -> None:
    """Five files through a cache of 1 to 3 descriptors: every file holds exactly the bytes
    written to it, in order, and the cache never holds more than its limit."""
    root = tmp_path_factory.mktemp("files")
    files = OpenFiles(limit)
    paths = [root / f"f{i}" for i in range(5)]
    for p in paths:
        p.write_bytes(b"")
    ds = [AppendDescriptor(str(p), files) for p in paths]
    model = [b""] * 5
    for i, op, data in ops:
        if op == "write":
            _write(ds[i], data)
            model[i] += data
        elif op == "sync":
            ds[i].sync()
        elif op == "size":
            assert ds[i].file_size() == len(model[i])
        else:
            cut = len(model[i]) // 2
            ds[i].truncate(cut)
            model[i] = model[i][:cut]
        assert files.count <= limit
    for d in ds:
        d.close()
    assert files.count == 0
    assert [p.read_bytes() for p in paths] == model


def test_threads_appending_to_more_files_than_descriptors_lose_and_reorder_nothing(tmp_path: Path) -> None:
    files = OpenFiles(2)
    n_files, per_thread = 6, 300
    paths = [tmp_path / f"f{i}" for i in range(n_files)]
    for p in paths:
        p.write_bytes(b"")
    ds = [AppendDescriptor(str(p), files) for p in paths]
    locks = [threading.Lock() for _ in ds]  # one writer at a time per file, as a Log does

    def writer(t: int) -> None:
        for k in range(per_thread):
            i = (t + k) % n_files
            with locks[i]:
                _write(ds[i], f"{t}:{k};".encode())
                if k % 50 == 0:
                    ds[i].sync()

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for d in ds:
        d.close()
    seen: dict[int, list[int]] = {}
    total = 0
    for p in paths:
        for item in p.read_bytes().decode().split(";")[:-1]:
            t, k = map(int, item.split(":"))
            seen.setdefault(t, []).append(k)
            total += 1
    assert total == 4 * per_thread
    for t, ks in seen.items():
        # Per file, each thread's writes appear in the order it made them.
        by_file: dict[int, list[int]] = {}
        for k in ks:
            by_file.setdefault((t + k) % n_files, []).append(k)
        assert all(v == sorted(v) for v in by_file.values())


def test_a_clean_evicted_file_syncs_without_reopening(tmp_path: Path) -> None:
    files = OpenFiles(1)
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"")
    b.write_bytes(b"")
    da = AppendDescriptor(str(a), files)
    _write(da, b"x")
    da.sync()
    db = AppendDescriptor(str(b), files)  # evicts a
    assert not da.is_open and db.is_open
    da.sync()  # nothing written since its sync: nothing to do, and b stays open
    assert not da.is_open and db.is_open
    _write(da, b"y")  # reopened, evicting b
    assert da.is_open and not db.is_open and files.count == 1
    da.close()
    db.close()
    assert a.read_bytes() == b"xy"


def test_a_failed_sync_at_eviction_fails_the_next_call(tmp_path: Path) -> None:
    """Where syncs are not deferred, a descriptor written since its last sync is synced
    before the cache closes it; when that sync fails (here a FIFO, where fdatasync is
    EINVAL), the next call raises instead of a later sync reporting success over what the
    kernel may have dropped."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        files = OpenFiles(1, syncfs=None)
        d = AppendDescriptor(str(fifo), files)
        _write(d, b"unsynced")
        other = tmp_path / "other"
        other.write_bytes(b"")
        AppendDescriptor(str(other), files).close()  # evicts the FIFO's descriptor
        with pytest.raises(OSError) as info:
            d.sync()
        assert info.value.errno == errno.EIO
        assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.EINVAL
        with pytest.raises(OSError):
            _write(d, b"more")
        d.close()
        assert os.read(reader, 100) == b"unsynced"
    finally:
        os.close(reader)


def test_a_missing_file_or_bad_limit_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        AppendDescriptor(str(tmp_path / "missing"), OpenFiles(2))
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="positive integer"):
            OpenFiles(bad)  # type: ignore[arg-type]
    proc = run_python(
        "import persistlog, sys\npersistlog.open(sys.argv[1], lambda emit: None)\n",
        str(tmp_path / "log"),
        env_extra={LIMIT_VARIABLE: "many"},
    )
    assert proc.returncode != 0 and f"{LIMIT_VARIABLE}='many': expected a positive number" in proc.stderr


_MANY = textwrap.dedent("""
    import json, os, sys, persistlog
    root, n = sys.argv[1], int(sys.argv[2])
    before = len(os.listdir("/proc/self/fd"))
    logs = [persistlog.open(os.path.join(root, f"log-{i}"), lambda emit: None, durability="fsync") for i in range(n)]
    for round in range(3):
        for i, lg in enumerate(logs):
            lg.update({"log": i, "round": round}, sync=True)
    during = len(os.listdir("/proc/self/fd"))
    for lg in logs:
        lg.close()
    print(json.dumps({"before": before, "during": during}))
""")


def test_many_logs_hold_at_most_the_limit_of_segment_descriptors_and_restore_exactly(tmp_path: Path) -> None:
    proc = run_python(_MANY, str(tmp_path), "40", env_extra={LIMIT_VARIABLE: "5"})
    assert proc.returncode == 0, proc.stderr
    fds = json.loads(proc.stdout.strip().splitlines()[-1])
    assert fds["during"] <= fds["before"] + 5 + 2  # the cache, and a directory being fsynced
    import persistlog

    for i in range(40):
        got: list[object] = []
        persistlog.restore(str(tmp_path / f"log-{i}"), got.append)
        assert got == [{"log": i, "round": r} for r in range(3)]


class _SyncfsCalls:
    """The real ``syncfs(2)``, counted, failing the calls numbered in ``fail`` with EIO
    (what a failed writeback anywhere on the file system makes it return)."""

    def __init__(self, fail: tuple[int, ...] = ()) -> None:
        real = _libc_syncfs()
        if real is None:
            pytest.skip("syncfs(2) does not report writeback errors here")
        self._real = real
        self._fail = fail
        self.calls = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self._real(fd)
        if self.calls in self._fail:
            raise OSError(errno.EIO, "syncfs: Input/output error")


def _files(tmp_path: Path, n: int) -> list[Path]:
    paths = [tmp_path / f"f{i}" for i in range(n)]
    for p in paths:
        p.write_bytes(b"")
    return paths


def test_round_robin_writes_close_descriptors_without_syncing_and_one_syncfs_serves_them_all(tmp_path: Path) -> None:
    """Writing round robin over more files than the cache holds costs no sync at each
    close; the next sync() of every file that was closed written is served by one
    syncfs started after the close, and the bytes read back exactly."""
    syncfs = _SyncfsCalls()
    files = OpenFiles(2, syncfs)
    assert files.defers_syncs
    paths = _files(tmp_path, 6)
    ds = [AppendDescriptor(str(p), files) for p in paths]
    for round_ in range(3):
        for i, d in enumerate(ds):
            _write(d, f"{round_}.{i};".encode())
    assert syncfs.calls == 0 and files.count <= 2
    for d in ds:
        d.sync()
    assert syncfs.calls == 1  # the first sync's syncfs started after every close
    for d in ds:
        d.sync()  # nothing owed: no syncfs, an fdatasync at most
    assert syncfs.calls == 1
    _write(ds[0], b"late;")
    for d in ds[1:]:
        _write(d, b"x")  # closes ds[0] written, after the syncfs above
    ds[0].sync()
    assert syncfs.calls == 2  # an earlier syncfs does not cover a later close
    for d in ds:
        d.close()
    for i, p in enumerate(paths):
        tail = b"late;" if i == 0 else b"x"
        assert p.read_bytes() == b"".join(f"{r}.{i};".encode() for r in range(3)) + tail


def test_a_failed_writeback_is_reported_by_the_next_sync_of_every_file_closed_unsynced(tmp_path: Path) -> None:
    """A syncfs that fails (a writeback of the file system failed, for a file it cannot
    name) fails that sync() and every live descriptor of the file system: none of them
    reports success afterwards, even the one whose later syncfs would succeed."""
    syncfs = _SyncfsCalls(fail=(1,))
    files = OpenFiles(1, syncfs)
    a, b, c = (AppendDescriptor(str(p), files) for p in _files(tmp_path, 3))
    _write(a, b"a")
    _write(b, b"b")  # closes a without a sync
    with pytest.raises(OSError) as info:
        a.sync()
    assert info.value.errno == errno.EIO and syncfs.calls == 1
    for d in (a, b, c):  # b was open and written, c clean: the error names no file
        with pytest.raises(OSError) as later:
            d.sync()
        assert later.value.errno == errno.EIO
        with pytest.raises(OSError):
            _write(d, b"more")
    assert syncfs.calls == 1
    for d in (a, b, c):
        d.close()


def test_the_synced_rule_still_syncs_each_written_descriptor_before_closing_it(tmp_path: Path) -> None:
    """``syncfs=None`` (systems whose syncfs reports no writeback errors): no file owes a
    sync after its close, so sync() of an evicted file does nothing."""
    files = OpenFiles(1, syncfs=None)
    assert not files.defers_syncs
    a, b = (AppendDescriptor(str(p), files) for p in _files(tmp_path, 2))
    _write(a, b"a")
    _write(b, b"b")  # syncs a, then closes it
    a.sync()
    assert not a.is_open
    a.close()
    b.close()


def test_a_reader_reads_through_the_open_append_descriptor_the_same_bytes(tmp_path: Path) -> None:
    """``LocalDestination.read`` of a file this process appends to reads through the
    cache's open descriptor while it is open, and opens the file itself once it was
    closed: the same bytes either way, the buffered ones not yet among them."""
    from destinations._open_files import open_files, pread_open
    from destinations.local import LocalDestination

    dest = LocalDestination(str(tmp_path / "d"))
    dest.ensure()
    dest.create("seg", b"head:")
    f = dest.open_append("seg")
    f.write(b"0123456789")
    f.flush()
    f.write(b"buffered")  # in the file object's buffer, not written yet
    path = str(tmp_path / "d" / "seg")
    assert open_files().live(path) is not None
    assert pread_open(path, 100, 0) == b"head:0123456789"
    assert dest.read("seg", 3, 6) == b"d:0123"
    assert dest.read("seg", 10, 100) == b"56789"
    f.close()
    assert pread_open(path, 100, 0) is None, "closed: the reader opens the file itself"
    assert dest.read("seg", 3, 6) == b"d:0123"
    assert dest.read("seg") == b"head:0123456789buffered"


def test_a_file_it_may_not_read_is_appended_to_write_only(tmp_path: Path) -> None:
    p = tmp_path / "w"
    p.write_bytes(b"")
    os.chmod(p, 0o200)
    try:
        if os.access(p, os.R_OK):
            pytest.skip("running as a user who reads any file")
        files = OpenFiles(2)
        d = AppendDescriptor(str(p), files)
        _write(d, b"abc")
        assert d.pread(3, 0) is None
        d.sync()
        d.close()
    finally:
        os.chmod(p, 0o600)
    assert p.read_bytes() == b"abc"


def _open_files_under(root: Path) -> set[int]:
    """This process's descriptors open on files in ``root`` (a cache's directory
    descriptor, kept for its file system, is not one)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(str(root) + os.sep):
            found.add(int(name))
    return found


def _evictions_interrupted_at(root: Path, nth: int | None) -> tuple[int, str, list[bytes]]:
    """Three files through a cache of one descriptor (each write evicts another's), with a
    KeyboardInterrupt at the ``nth`` point where CPython could run a signal handler in the
    cache's code on this thread (None: none): the start of one of its Python functions, or
    the return of a C call it makes. Each call is retried as an app would. Returns (points
    passed, the point interrupted, each file's writes as acknowledged, in order)."""
    files = OpenFiles(1, syncfs=None if nth is not None and nth % 2 else _libc_syncfs())
    paths = [root / f"f{i}" for i in range(3)]
    for p in paths:
        p.write_bytes(b"")
    module = AppendDescriptor.write.__code__.co_filename

    def retried(call: Any) -> Any:
        while True:
            try:
                return call()
            except KeyboardInterrupt:
                continue

    ds: list[AppendDescriptor] = []
    acked: list[list[bytes]] = [[], [], []]
    with PointInterrupter((module,), nth) as at:
        for p in paths:
            ds.append(retried(lambda: AppendDescriptor(str(p), files)))
        for k in range(4):
            for i, d in enumerate(ds):
                data = f"{i}.{k};".encode()
                retried(lambda: d.write(data))
                acked[i].append(data)
            retried(ds[k % 3].sync)
        retried(lambda: ds[1].truncate(retried(ds[1].file_size)))  # a no-op, through the cache
    where = at.where

    # Every descriptor is free for another thread: a write and a sync go through.
    def from_another_thread() -> None:
        for i, d in enumerate(ds):
            data = f"{i}.end;".encode()
            _write(d, data)
            d.sync()
            acked[i].append(data)

    other = threading.Thread(target=from_another_thread, daemon=True)
    other.start()
    other.join(10)
    assert not other.is_alive(), f"a descriptor's lock was left held (interrupted at {where})"
    assert files.count <= 1, (files, where)
    for d in ds:
        d.close()
    assert files.count == 0, (files, where)
    return at.points, where, [b"".join(a) for a in acked]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="lists open descriptors in /proc")
def test_an_interruption_at_any_point_of_an_eviction_leaves_every_file_usable_and_whole(tmp_path: Path) -> None:
    """A KeyboardInterrupt (Ctrl-C) at each point of the cache's code while descriptors
    evict each other, in both eviction modes: no descriptor's lock is left held (a leaked
    lock once hung the log whose descriptor it was), the cache still counts every open
    descriptor, each file holds what was written to it, in order (an interrupted write
    once more at most, as its call was retried), and no descriptor is left open but the
    one a ``KeyboardInterrupt`` right after ``os.open`` returned may leak."""
    (tmp_path / "none").mkdir()
    points, _, expected = _evictions_interrupted_at(tmp_path / "none", None)
    assert points >= 100, points
    for nth in range(1, points + 1):
        root = tmp_path / str(nth)
        root.mkdir()
        # On a thread of its own, so that a call hung on a lock left held fails the test.
        outcome: list[Any] = []

        def run_at(root: Path = root, nth: int = nth) -> None:
            try:
                outcome.append(_evictions_interrupted_at(root, nth))
            except BaseException as e:  # noqa: BLE001 - raised again below, on the test's thread
                outcome.append(e)

        run = threading.Thread(target=run_at, daemon=True)
        run.start()
        run.join(30)
        assert outcome, f"point {nth}: a call hung (a descriptor's lock left held?)"
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        _, point, acked = outcome[0]
        assert acked == expected
        for i, want in enumerate(acked):
            got = (root / f"f{i}").read_bytes()
            # Each acknowledged write in order; one interrupted after its write(2) returned
            # was retried, so its bytes may come twice in a row.
            items, seen = got.split(b";")[:-1], []
            for item in items:
                if not seen or seen[-1] != item:
                    seen.append(item)
            assert b"".join(s + b";" for s in seen) == want, (point, got, want)
            assert len(items) - len(seen) <= 1, (point, got)
        leaked = _open_files_under(root)
        if leaked:
            assert len(leaked) == 1 and point.endswith("after open"), (point, leaked)
            os.close(leaked.pop())

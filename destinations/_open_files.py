"""A process-wide bound on the file descriptors that local append files hold open.

A local log appends to its open segment through an :class:`AppendDescriptor`: the file's
path, and a descriptor opened (``O_WRONLY | O_APPEND``) only while the process-wide
:class:`OpenFiles` cache keeps it. The cache holds at most ``limit`` descriptors; opening
one more closes the least recently used first. However many logs a process holds open,
their segments cost at most ``limit`` descriptors (``PERSISTLOG_OPEN_FILES``, default
:data:`DEFAULT_LIMIT`).

Closing a descriptor loses nothing and reorders nothing: every ``write(2)`` through it has
returned (a descriptor in use is never closed: each one has a lock, held across every call
on it, and eviction only takes a lock that is free), and the next write reopens the file
with ``O_APPEND``, so it lands after them.

Durability holds too: no later ``sync()`` of a descriptor reports success over bytes the
kernel dropped. A descriptor closed clean needs no sync: ``sync()`` of it does nothing.
One written since its last ``fdatasync`` is closed in one of two ways:

- **Deferred** (Linux 5.8 and later, where ``syncfs(2)`` reports every writeback error of
  its file system since the descriptor it is called on last looked: the superblock's
  ``errseq_t``): it is closed without a sync and owes one. Its next ``sync()`` waits for a
  ``syncfs`` of its file system that *started after* it was closed, made through a
  directory descriptor the cache opened on that file system before the file's first write
  (one per file system, kept for the process's life). That call writes back every dirty
  page of the file (open or not) and fails if any writeback of the file system failed
  since the last such call, whichever file it was, and however long the inode has been
  out of the inode cache (a reopened descriptor's ``fdatasync`` could miss an error whose
  inode was evicted, or that another process's ``fsync`` saw first). One ``syncfs`` serves
  every descriptor closed before it started, so a thousand owing descriptors cost one.
  When one fails, every live descriptor of that file system fails (its next call raises
  ``EIO``, chained): the error names no file, so none of them may report success.
- **Synced** (elsewhere): ``fdatasync`` before the close, and a failure of that sync is
  kept and raised by the descriptor's next call.

Writing round robin to more files than the cache holds thus costs an ``open``/``close``
per write, not an ``fdatasync``.

Descriptors are opened read-write (``O_RDWR | O_APPEND``: every write still appends), so
that a reader of a file being appended to reads through the descriptor the cache holds
open (:func:`pread_open`), a ``pread`` instead of an ``open``, a ``pread`` and a ``close``.

Lock order: a descriptor's lock, then the cache's lock (held for dictionary updates only).
A descriptor makes room in the cache *before* it takes its own lock, so a thread evicting
others holds no descriptor's lock: it skips a descriptor in use (which then stays open, the
bound briefly exceeded), and may wait for one that a thread took just after it looked, for
that one call, never for a thread waiting on it in turn. Every lock is taken with a ``with``
statement, which a ``KeyboardInterrupt`` cannot cut between the acquisition and the block
that releases it (an ``acquire`` call returning can be).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable

logger = logging.getLogger("persistlog." + __name__)

#: Descriptors the cache keeps open when ``PERSISTLOG_OPEN_FILES`` does not say.
DEFAULT_LIMIT = 256
#: The environment variable that sets the limit (read once, when the cache is made).
LIMIT_VARIABLE = "PERSISTLOG_OPEN_FILES"

_OPEN_FLAGS = os.O_RDWR | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
# For a file this process may write and not read (mode 0200): no reads through it then.
_WRITE_ONLY_FLAGS = os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
_DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
#: The first Linux release whose ``syncfs(2)`` reports writeback errors (commit 735e4ae5ba28).
SYNCFS_REPORTS_ERRORS = (5, 8)


def _linux_release() -> tuple[int, int] | None:
    uname = os.uname()
    if uname.sysname != "Linux":
        return None
    parts = uname.release.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return None


def _libc_syncfs() -> Callable[[int], None] | None:
    """``syncfs(2)`` raising ``OSError``, where it reports writeback errors; else None."""
    release = _linux_release()
    if release is None or release < SYNCFS_REPORTS_ERRORS:
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int]
    call.restype = ctypes.c_int

    def syncfs(fd: int) -> None:
        if call(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs: {os.strerror(err)}")

    return syncfs


_NOT_GIVEN: Callable[[int], None] = lambda fd: None  # noqa: E731


class _FileSystem:
    """One file system's ``syncfs`` gate: the calls made through one directory descriptor,
    numbered as they start, one at a time, and the live descriptors an error fails."""

    __slots__ = ("_fd", "_syncfs", "_members", "_mutex", "_started", "_synced")

    def __init__(
        self, directory: str, syncfs: Callable[[int], None], members: Callable[[], list[AppendDescriptor]]
    ) -> None:
        self._fd = os.open(directory, _DIRECTORY_FLAGS)
        self._syncfs = syncfs
        self._members = members  # the live descriptors of the process (the cache's)
        self._mutex = threading.Lock()
        self._started = 0  # syncfs calls started
        self._synced = 0  # the number of the last one that succeeded

    @property
    def started(self) -> int:
        """Number of the last ``syncfs`` started: a file closed now needs a later one."""
        return self._started

    def synced_after(self, number: int) -> None:
        """Return once a ``syncfs`` numbered above ``number`` succeeded (making one if
        none has); its ``OSError`` fails every live descriptor of the file system."""
        with self._mutex:
            if self._synced > number:
                return
            self._started += 1
            current = self._started
            try:
                self._syncfs(self._fd)
            except OSError as e:
                members = [d for d in self._members() if d.file_system is self]
                logger.warning("syncfs of the file system holding %d open log file(s) failed: %s", len(members), e)
                for member in members:
                    member.writeback_failed(e)
                raise
            self._synced = current


class OpenFiles:
    """The least recently used append descriptors of the process, at most ``limit`` open."""

    def __init__(self, limit: int = DEFAULT_LIMIT, syncfs: Callable[[int], None] | None = _NOT_GIVEN) -> None:
        """``syncfs``: the call that syncs a file system and reports its writeback errors
        (``syncfs(2)`` where it does); None to sync each written descriptor before
        closing it instead (the module docstring)."""
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"the open append file limit must be a positive integer, not {limit!r}")
        self._limit = limit
        self._mutex = threading.Lock()
        # Descriptors with an open fd, least recently used first.
        self._open: OrderedDict[AppendDescriptor, None] = OrderedDict()
        self._syncfs = _libc_syncfs() if syncfs is _NOT_GIVEN else syncfs
        self._file_systems: dict[int, _FileSystem] = {}
        # Live descriptors by path, for readers of the files they append to.
        self._by_path: weakref.WeakValueDictionary[str, AppendDescriptor] = weakref.WeakValueDictionary()

    def __repr__(self) -> str:
        mode = "deferred" if self._syncfs is not None else "synced"
        return f"OpenFiles(limit={self._limit}, open={len(self._open)}, eviction={mode})"

    @property
    def defers_syncs(self) -> bool:
        """Whether a written descriptor is closed without a sync (module docstring)."""
        return self._syncfs is not None

    def file_system(self, fd: int, path: str) -> _FileSystem | None:
        """The ``syncfs`` gate of the file system holding ``path`` (open as ``fd``), made
        at its first file; None when syncs are not deferred."""
        if self._syncfs is None:
            return None
        dev = os.fstat(fd).st_dev
        with self._mutex:
            fs = self._file_systems.get(dev)
            if fs is None:
                fs = self._file_systems[dev] = _FileSystem(
                    os.path.dirname(os.path.abspath(path)), self._syncfs, self._live_descriptors)
            return fs

    @property
    def limit(self) -> int:
        """Descriptors kept open at most (briefly more while all of them are in use)."""
        return self._limit

    @property
    def count(self) -> int:
        """Descriptors open now."""
        return len(self._open)

    def make_room(self) -> None:
        """Close least recently used descriptors until one more fits under the limit
        (skipping those in use). The caller holds no descriptor's lock."""
        skipped = 0
        while True:
            with self._mutex:
                if len(self._open) < self._limit + skipped:
                    return
                victim = next(itertools.islice(self._open, skipped, None))
            # A descriptor stays in the cache until it is closed (evict() takes it out), so
            # an interruption anywhere here leaves every open one counted.
            if not victim.evict():
                skipped += 1  # in use right now: stays open

    def _live_descriptors(self) -> list[AppendDescriptor]:
        with self._mutex:
            return list(self._by_path.values())

    def live(self, path: str) -> AppendDescriptor | None:
        """The live descriptor appending to ``path`` (exactly that string), if any."""
        return self._by_path.get(path)

    def joined(self, d: AppendDescriptor) -> None:
        """``d`` was made: readers of its path may read through it."""
        with self._mutex:
            self._by_path[d.path] = d

    def left(self, d: AppendDescriptor) -> None:
        """``d`` closed for good."""
        with self._mutex:
            if self._by_path.get(d.path) is d:
                del self._by_path[d.path]

    def used(self, d: AppendDescriptor) -> None:
        """``d`` opened its descriptor, or used it: the most recently used. The caller
        holds ``d``'s lock (which eviction takes before it takes ``d`` out)."""
        with self._mutex:
            self._open[d] = None
            self._open.move_to_end(d)

    def forget(self, d: AppendDescriptor) -> None:
        """``d`` closed its descriptor itself."""
        with self._mutex:
            self._open.pop(d, None)


_cache: OpenFiles | None = None
_cache_mutex = threading.Lock()


def open_files() -> OpenFiles:
    """The process's cache, made at first use with ``PERSISTLOG_OPEN_FILES``'s limit."""
    global _cache
    if _cache is None:
        with _cache_mutex:
            if _cache is None:
                _cache = OpenFiles(_limit_from_environment())
    return _cache


def _after_fork_in_child() -> None:
    # A forked child starts a cache of its own: the parent's may have been locked by
    # another thread at the fork, and its descriptors are the parent's logs'.
    global _cache, _cache_mutex
    _cache = None
    _cache_mutex = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _limit_from_environment() -> int:
    raw = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if limit < 1:
        raise ValueError(f"{LIMIT_VARIABLE}={raw!r}: expected a positive number of open files")
    return limit


class AppendDescriptor:
    """One append-only file, its descriptor opened on demand from the process's cache.

    Every call holds the descriptor's lock for its whole duration. An ``OSError`` of an
    eviction's sync is raised (as ``EIO``, chained) by every later call.
    """

    __slots__ = (
        "path", "_files", "_lock", "_fd", "_readable", "_dirty", "_owes", "_fs", "_closed", "_error", "__weakref__",
    )

    def __init__(self, path: str, files: OpenFiles | None = None) -> None:
        self.path = path
        self._files = files or open_files()
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._readable = True  # opened O_RDWR (False once that was refused)
        self._dirty = False  # written through the open descriptor since its last fdatasync
        # Closed written and not synced: the number of the file system's last syncfs
        # started then (a later one covers it).
        self._owes: int | None = None
        self._closed = False
        self._error: OSError | None = None
        self._fs: _FileSystem | None = None
        self._files.make_room()
        with self._lock:
            try:
                fd = self._descriptor()  # the file must exist now: FileNotFoundError otherwise
                self._fs = self._files.file_system(fd, path)
                self._files.joined(self)
            except BaseException:  # an error, or Ctrl-C: nobody will close it
                self._closed = True
                if self._fd is not None:
                    self._closed_fd(self._fd)
                raise

    def __repr__(self) -> str:
        return f"AppendDescriptor({self.path!r}, open={self._fd is not None})"

    @property
    def is_open(self) -> bool:
        """Whether it holds a descriptor right now."""
        return self._fd is not None

    def _room(self) -> None:
        """Make room in the cache for this descriptor if it is closed now; called before
        taking ``_lock`` (see the module docstring's lock order)."""
        if self._fd is None:
            self._files.make_room()

    def _descriptor(self) -> int:
        """The open descriptor, opened now if evicted; the caller holds ``_lock`` (and made
        room first: if another thread evicted it since, the bound is briefly exceeded)."""
        if self._closed:
            raise ValueError(f"{self.path} is closed")
        if self._error is not None:
            raise OSError(errno.EIO, f"{self.path}: syncing before its descriptor was closed failed") from self._error
        fd = self._fd
        if fd is not None:
            self._files.used(self)
            return fd
        try:
            fd = os.open(self.path, _OPEN_FLAGS if self._readable else _WRITE_ONLY_FLAGS)
        except PermissionError:
            if not self._readable:
                raise
            fd = os.open(self.path, _WRITE_ONLY_FLAGS)
            self._readable = False
        self._fd = fd
        self._files.used(self)  # if interrupted before, counted at its next use
        return fd

    def fileno(self) -> int:
        """The descriptor open now (opened if it was evicted); the cache may close it
        later, as any other."""
        self._room()
        with self._lock:
            return self._descriptor()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """One ``write(2)``: how many bytes it took."""
        if self._fd is None:
            self._files.make_room()  # _room(), inline: every write of a log comes here
        with self._lock:
            fd = self._descriptor()
            self._dirty = True
            return os.write(fd, data)

    def sync(self) -> None:
        """Make what was written durable: ``fdatasync`` of the open descriptor, and for
        what was written through descriptors closed without a sync, a ``syncfs`` of the
        file system started after they closed (nothing to do when closed clean)."""
        with self._lock:
            if self._fd is None and self._owes is None and not self._closed and self._error is None:
                return
            if self._fd is not None or self._closed or self._error is not None:
                os.fdatasync(self._descriptor())
                self._dirty = False
            if self._owes is not None:
                assert self._fs is not None
                self._fs.synced_after(self._owes)
                self._owes = None

    @property
    def file_system(self) -> _FileSystem | None:
        """The ``syncfs`` gate of its file system (None when syncs are not deferred)."""
        return self._fs

    def writeback_failed(self, error: OSError) -> None:
        """A ``syncfs`` of this file's file system failed: every later call raises."""
        if self._error is None:
            self._error = error

    def truncate(self, size: int) -> None:
        self._room()
        with self._lock:
            os.ftruncate(self._descriptor(), size)

    def pread(self, length: int, offset: int) -> bytes | None:
        """Up to ``length`` bytes at ``offset`` (fewer at the end of the file) through the
        descriptor open now; None, reading nothing, when it is not open (evicted, closed,
        failed): the caller opens the file itself."""
        with self._lock:
            fd = self._fd
            if fd is None or not self._readable or self._closed or self._error is not None:
                return None
            return pread_all(fd, length, offset)

    def file_size(self) -> int:
        """The file's size on the OS side (``fstat``, or ``stat`` while evicted)."""
        with self._lock:
            if self._closed:
                raise ValueError(f"{self.path} is closed")
            if self._fd is not None:
                return os.fstat(self._fd).st_size
            return os.stat(self.path).st_size

    def evict(self) -> bool:
        """Close the descriptor for the cache (synced first if written since its last sync);
        False, doing nothing, while another thread uses it. The caller holds no
        descriptor's lock."""
        if self._lock.locked():
            return False
        with self._lock:
            fd = self._fd
            if fd is None:
                self._files.forget(self)
                return True
            try:
                if self._dirty and self._fs is not None:
                    self._owes = self._fs.started  # its next sync() needs a later syncfs
                    self._dirty = False
                elif self._dirty:
                    os.fdatasync(fd)
                    self._dirty = False
            except OSError as e:
                logger.warning("syncing %s before closing its descriptor failed: %s", self.path, e)
                self._error = e
            finally:
                self._closed_fd(fd)
            return True

    def _closed_fd(self, fd: int) -> None:
        """Close ``fd`` and take it out of the cache; the caller holds ``_lock``."""
        try:
            self._fd = None
            self._files.forget(self)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close for good (no sync: closing promises nothing more); idempotent."""
        with self._lock:
            self._closed = True
            self._files.left(self)
            fd = self._fd
            if fd is not None:
                self._closed_fd(fd)


def pread_open(path: str, length: int, offset: int) -> bytes | None:
    """``length`` bytes at ``offset`` of ``path`` through the descriptor of this process
    appending to it, when one is open now; None otherwise (nothing read)."""
    cache = _cache
    if cache is None:
        return None
    d = cache.live(path)
    return d.pread(length, offset) if d is not None else None


def pread_all(fd: int, length: int, offset: int) -> bytes:
    """``length`` bytes at ``offset`` of ``fd``, fewer only at the end of the file."""
    data = os.pread(fd, length, offset)
    while 0 < len(data) < length:
        more = os.pread(fd, length - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data

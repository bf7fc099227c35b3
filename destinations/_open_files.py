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
with ``O_APPEND``, so it lands after them. Durability holds too: a descriptor written since
its last ``fdatasync`` is synced before it is closed, and a failure of that sync is kept and
raised by the descriptor's next call, so no later ``sync()`` reports success over bytes the
kernel dropped. A descriptor closed clean needs no sync: ``sync()`` of it does nothing.

Lock order: a descriptor's lock, then the cache's lock (held for dictionary updates only).
Eviction takes other descriptors' locks without waiting (a busy one stays open, the bound
is then briefly exceeded), so two threads opening files never wait on each other.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections import OrderedDict

logger = logging.getLogger("persistlog." + __name__)

#: Descriptors the cache keeps open when ``PERSISTLOG_OPEN_FILES`` does not say.
DEFAULT_LIMIT = 256
#: The environment variable that sets the limit (read once, when the cache is made).
LIMIT_VARIABLE = "PERSISTLOG_OPEN_FILES"

_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)


class OpenFiles:
    """The least recently used append descriptors of the process, at most ``limit`` open."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"the open append file limit must be a positive integer, not {limit!r}")
        self._limit = limit
        self._mutex = threading.Lock()
        # Descriptors with an open fd, least recently used first.
        self._open: OrderedDict[AppendDescriptor, None] = OrderedDict()

    def __repr__(self) -> str:
        return f"OpenFiles(limit={self._limit}, open={len(self._open)})"

    @property
    def limit(self) -> int:
        """Descriptors kept open at most (briefly more while all of them are in use)."""
        return self._limit

    @property
    def count(self) -> int:
        """Descriptors open now."""
        return len(self._open)

    def make_room(self, newcomer: AppendDescriptor) -> None:
        """Close least recently used descriptors until ``newcomer`` fits under the limit."""
        busy: list[AppendDescriptor] = []
        try:
            while True:
                with self._mutex:
                    if len(self._open) + len(busy) < self._limit or not self._open:
                        return
                    victim, _ = self._open.popitem(last=False)
                if victim is newcomer:
                    continue
                if not victim.evict():
                    busy.append(victim)  # in use right now: stays open
        finally:
            if busy:
                with self._mutex:
                    for d in busy:
                        if d.is_open:  # not closed by its owner meanwhile
                            self._open[d] = None

    def opened(self, d: AppendDescriptor) -> None:
        """``d`` opened its descriptor: the most recently used."""
        with self._mutex:
            self._open[d] = None

    def used(self, d: AppendDescriptor) -> None:
        """``d`` was used: the most recently used (unless it is being evicted)."""
        with self._mutex:
            if d in self._open:
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

    __slots__ = ("path", "_files", "_lock", "_fd", "_dirty", "_closed", "_error", "__weakref__")

    def __init__(self, path: str, files: OpenFiles | None = None) -> None:
        self.path = path
        self._files = files or open_files()
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._dirty = False  # written since its last fdatasync
        self._closed = False
        self._error: OSError | None = None
        with self._lock:
            self._descriptor()  # the file must exist now: FileNotFoundError otherwise

    def __repr__(self) -> str:
        return f"AppendDescriptor({self.path!r}, open={self._fd is not None})"

    @property
    def is_open(self) -> bool:
        """Whether it holds a descriptor right now."""
        return self._fd is not None

    def _descriptor(self) -> int:
        """The open descriptor, opened now if evicted; the caller holds ``_lock``."""
        if self._closed:
            raise ValueError(f"{self.path} is closed")
        if self._error is not None:
            raise OSError(errno.EIO, f"{self.path}: syncing before its descriptor was closed failed") from self._error
        fd = self._fd
        if fd is not None:
            self._files.used(self)
            return fd
        self._files.make_room(self)
        fd = self._fd = os.open(self.path, _OPEN_FLAGS)
        self._files.opened(self)
        return fd

    def fileno(self) -> int:
        """The descriptor open now (opened if it was evicted); the cache may close it
        later, as any other."""
        with self._lock:
            return self._descriptor()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """One ``write(2)``: how many bytes it took."""
        with self._lock:
            fd = self._descriptor()
            self._dirty = True
            return os.write(fd, data)

    def sync(self) -> None:
        """``fdatasync`` what was written (nothing to do when evicted: eviction synced)."""
        with self._lock:
            if self._fd is None and not self._closed and self._error is None:
                return
            fd = self._descriptor()
            os.fdatasync(fd)
            self._dirty = False

    def truncate(self, size: int) -> None:
        with self._lock:
            os.ftruncate(self._descriptor(), size)

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
        False, doing nothing, while another thread uses it."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            fd, self._fd = self._fd, None
            if fd is None:
                return True
            try:
                if self._dirty:
                    os.fdatasync(fd)
                    self._dirty = False
            except OSError as e:
                logger.warning("syncing %s before closing its descriptor failed: %s", self.path, e)
                self._error = e
            finally:
                os.close(fd)
            return True
        finally:
            self._lock.release()

    def close(self) -> None:
        """Close for good (no sync: closing promises nothing more); idempotent."""
        with self._lock:
            self._closed = True
            fd, self._fd = self._fd, None
            if fd is not None:
                self._files.forget(self)
                os.close(fd)

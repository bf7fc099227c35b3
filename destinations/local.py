"""The local-filesystem driver: true append, fsync, directory fsync and an OS lock file.

Plain ``os`` calls, no fsspec: every durability step is explicit here.

* :meth:`LocalDestination.create` writes a temporary file in the same directory, fsyncs it,
  hard-links it to the final name (``link`` fails atomically when the name exists, which
  makes the create create-only), removes the temporary name and fsyncs the directory.
* :meth:`LocalDestination.replace` is temp + fsync + ``os.replace`` + directory fsync;
  :meth:`LocalDestination.replace_hint` the same without either fsync.
* :meth:`LocalDestination.open_append` appends with ``O_APPEND``; ``sync`` is ``fdatasync``;
  the descriptor is opened on demand from the process's bounded cache (``_open_files``).
* :meth:`LocalDestination.lock` writes a ``LOCK`` file naming this process (``_lock_file``);
  no descriptor stays open for it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from typing import Any

from ._base import AppendFile, Destination, LockHeld, WriterLock
from ._lock_file import release_lock_file, take_lock_file
from ._names import check_name, is_temp_name, temp_name
from ._open_files import AppendDescriptor, pread_all, pread_open
from ._owner import LOCK_NAME as LOCK_NAME  # the lock file's name, re-exported for tools and tests
from ._owner import owner_record
from ._process import identity
from ._registry import split_protocol

# Under the persistlog hierarchy: one logger ("persistlog") silences or raises all of it.
logger = logging.getLogger("persistlog." + __name__)

# Appends smaller than this are gathered in user space until flush(); bigger ones go
# straight to the OS. The core writes whole batches, so this mainly saves syscalls for
# tiny batches in buffered mode.
_BUFFER_LIMIT = 64 * 1024

_FILE_MODE = 0o644

# Filesystems without hard links (some FUSE/SMB mounts) answer link() with these.
_NO_LINK_ERRNOS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}


def fsync_dir(path: str) -> None:
    """Make the directory entries of ``path`` durable (after create, rename or unlink)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def path_from_url(url: str) -> str:
    """The absolute directory path of a plain path or a ``file://``/``local://`` URL."""
    _, path = split_protocol(url)
    if not path:
        raise ValueError(f"empty local destination path in {url!r}")
    path = os.path.abspath(os.path.expanduser(path))
    # "/" itself stays "/", every other directory loses trailing separators.
    return path.rstrip(os.sep) or os.sep


class LocalDestination(Destination):
    """A directory on a local (or network-mounted, POSIX) filesystem.

    ``storage_options`` are accepted for uniformity with fsspec drivers but unused: this
    driver calls ``os`` directly.
    """

    appendable = True
    default_flush_interval = 0.0

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        if self.storage_options:
            logger.warning("%s ignores storage options %s", self, sorted(self.storage_options))
        self.path = path_from_url(url)

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from (url, options) in another process; never carries open handles.
        return (type(self), (self.url, self.storage_options))

    def _file(self, name: str) -> str:
        return os.path.join(self.path, check_name(name))

    def ensure(self) -> None:
        """Create the directory and missing parents, making each new entry durable; a file
        where it (or a parent) would be is ``NotADirectoryError``."""
        missing: list[str] = []
        path = self.path
        while not os.path.isdir(path):
            missing.append(path)
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
        if not missing:
            return
        try:
            os.makedirs(self.path, exist_ok=True)
        except FileExistsError:
            # A file where the directory would be: said as every other call there says it.
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), self.path) from None
        # A new directory is durable only once its parent's entry is.
        for created in reversed(missing):
            fsync_dir(os.path.dirname(created) or os.sep)

    def exists(self) -> bool:
        return os.path.isdir(self.path)

    def why_not_creatable(self) -> str | None:
        path = self.path
        while not os.path.lexists(path):
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
        if os.path.isdir(path):
            return None
        if path == self.path:
            return "it is a file, not a directory"
        return f"{path} is a file, not a directory"

    def list(self, start_after: str | None = None) -> list[str]:
        try:
            with os.scandir(self.path) as found:
                entries = list(found)
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = sorted(
            e.name for e in entries if not is_temp_name(e.name) and e.is_file(follow_symlinks=True)
        )
        if start_after is not None:
            names = [n for n in names if n > start_after]
        return names

    def read(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        if offset < 0 or (length is not None and length < 0):
            raise ValueError(f"bad range: offset={offset} length={length}")
        if length is None:
            with open(self._file(name), "rb") as f:
                if offset:
                    f.seek(offset)
                return f.read()
        # A ranged read with pread on a bare descriptor: a third of what a buffered file
        # object costs, for readers that read a few KB at a time (a queue's deliveries);
        # through this process's append descriptor of the file when one is open (a
        # queue delivering from the segment it appends to), without an open and a close.
        path = self._file(name)
        data = pread_open(path, length, offset)
        if data is not None:
            return data
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return pread_all(fd, length, offset)
        finally:
            os.close(fd)

    def size(self, name: str) -> int:
        return os.stat(self._file(name)).st_size

    def create(self, name: str, data: bytes) -> None:
        final = self._file(name)
        tmp = self._write_temp(name, data)
        try:
            try:
                os.link(tmp, final)
            except OSError as e:
                if isinstance(e, FileExistsError) or e.errno not in _NO_LINK_ERRNOS:
                    raise
                self._create_without_link(final, data)
        finally:
            _unlink_quietly(tmp)
        fsync_dir(self.path)

    def _create_without_link(self, final: str, data: bytes) -> None:
        # No hard links here: O_EXCL keeps the create create-only, but a reader may see
        # the file before its bytes are complete (the core tolerates a torn tail).
        logger.debug("%s: no hard links, creating %s with O_EXCL", self, final)
        fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def replace(self, name: str, data: bytes) -> None:
        final = self._file(name)
        tmp = self._write_temp(name, data)
        try:
            os.replace(tmp, final)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        fsync_dir(self.path)

    def replace_hint(self, name: str, data: bytes) -> None:
        """Temp file + ``os.replace``, neither fsynced: atomic for readers, not durable."""
        final = self._file(name)
        tmp = self._write_temp(name, data, sync=False)
        try:
            os.replace(tmp, final)
        except BaseException:
            _unlink_quietly(tmp)
            raise

    def _write_temp(self, name: str, data: bytes, sync: bool = True) -> str:
        tmp = os.path.join(self.path, temp_name(name))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        try:
            _write_all(fd, data)
            if sync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        os.close(fd)
        return tmp

    def delete(self, name: str) -> None:
        try:
            os.unlink(self._file(name))
        except FileNotFoundError:
            return
        fsync_dir(self.path)

    def open_append(self, name: str) -> AppendFile:
        """Open the existing file ``name`` for appending; ``FileNotFoundError`` if missing."""
        return LocalAppendFile(self._file(name))

    def lock(self, owner: str, ttl: float = 30.0) -> WriterLock:
        """Take the destination's ``LOCK`` file, naming this process (``_lock_file``).

        A running holder (a stopped one too) keeps it; the lock of a holder that is gone
        (killed, exited without releasing, from an earlier boot) is taken over at once;
        ``ttl`` is unused. The lock belongs to the process: a second ``lock()`` in the same
        process conflicts too, and a forked child does not hold it. No descriptor stays
        open while it is held.
        """
        self.ensure()
        record = json.dumps(owner_record(owner, **identity()), sort_keys=True).encode() + b"\n"
        try:
            held = take_lock_file(self.path, record, self.url)
            logger.debug("%s: lock taken by %s", self, owner)
            return LocalLock(self.path, held)
        except BaseException:
            # Interrupted (Ctrl-C) once LOCK names this process and before the caller has
            # the handle that releases it: released here, or no open could take it again
            # while this process lives. (A LOCK naming another holder stays as it is.)
            release_lock_file(self.path, record)
            raise


class LocalAppendFile(AppendFile):
    """An append-only file with a small user-space buffer; its descriptor comes and goes
    through the process's bounded cache of open files (``_open_files``).

    After a failed write or sync (an ``OSError``) the handle is broken: every later call
    raises, because the bytes on disk no longer match what the caller believes it wrote
    (and a failed ``fdatasync`` may have dropped dirty pages that a retry would not report).

    Any other exception (a ``KeyboardInterrupt`` raised between a ``write(2)`` and the
    bookkeeping after it) leaves the handle usable: ``_unsure`` stays set across the
    write, and the next call settles it from the file's real size, so that no byte is
    written twice or lost.
    """

    def __init__(self, path: str) -> None:
        self._file = AppendDescriptor(path)
        self._path = path
        self._buffer = bytearray()
        self._lock = threading.Lock()
        self._closed = False
        self._error: BaseException | None = None
        self._on_disk = self._file.file_size()  # the file's size, where the buffer starts
        self._unsure = False

    def __repr__(self) -> str:
        return f"LocalAppendFile({self._path!r})"

    def _check(self) -> None:
        if self._closed:
            raise ValueError(f"{self._path} is closed")
        if self._error is not None:
            raise OSError(
                errno.EIO, f"{self._path} failed earlier and accepts no more writes"
            ) from self._error
        if self._unsure:
            self._settle()

    def _settle(self) -> None:
        """After an interrupted write: drop from the buffer what reached the file."""
        size = self._file.file_size()
        if size > self._on_disk:
            del self._buffer[: size - self._on_disk]
        self._on_disk = size
        self._unsure = False

    def write(self, data: bytes) -> None:
        with self._lock:
            self._check()
            if len(self._buffer) + len(data) < _BUFFER_LIMIT:
                self._buffer += data
                return
            self._drain()
            if len(data) < _BUFFER_LIMIT:
                self._buffer += data
            else:
                self._write_through(data)

    def flush(self) -> None:
        with self._lock:
            self._check()
            self._drain()

    def sync(self) -> None:
        with self._lock:
            self._check()
            self._drain()
            try:
                self._file.sync()
            except OSError as e:
                self._error = e
                raise

    def truncate(self, size: int) -> None:
        with self._lock:
            self._check()
            if size >= self._on_disk:
                del self._buffer[size - self._on_disk:]
                return
            del self._buffer[:]
            self._unsure = True
            try:
                self._file.truncate(size)
            except OSError as e:
                self._error = e
                raise
            self._on_disk = size
            self._unsure = False

    @property
    def size(self) -> int:
        with self._lock:
            if self._closed:
                raise ValueError(f"{self._path} is closed")
            if self._unsure:
                self._settle()
            # The file's size, not a position: with O_APPEND the offset says nothing.
            return self._file.file_size() + len(self._buffer)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self._error is None:
                try:
                    if self._unsure:
                        self._settle()
                    self._drain()
                except OSError:
                    self._closed = True
                    self._file.close()
                    raise
            # An interruption above leaves the file open: closing again finishes.
            self._closed = True
            self._file.close()

    def _drain(self) -> None:
        while self._buffer:
            self._unsure = True
            try:
                written = self._file.write(self._buffer)
            except OSError as e:
                self._error = e
                raise
            del self._buffer[:written]
            self._on_disk += written
            self._unsure = False

    def _write_through(self, data: bytes) -> None:
        self._unsure = True
        view = memoryview(data)
        try:
            while view:
                view = view[self._file.write(view):]
        except OSError as e:
            self._error = e
            raise
        self._on_disk += len(data)
        self._unsure = False


class LocalLock(WriterLock):
    """The destination's ``LOCK`` file, naming this process while it holds it."""

    def __init__(self, directory: str, record: bytes) -> None:
        self._directory = directory
        self._record: bytes | None = record
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"LocalLock({self._directory!r}, held={self._record is not None})"

    def renew(self) -> None:
        # Nobody takes the lock of a running process; only a release ends it.
        with self._mutex:
            if self._record is None:
                raise LockHeld(f"{os.path.join(self._directory, LOCK_NAME)} was released", "")

    def release(self) -> None:
        # The record is forgotten only once LOCK is removed (removing it again does
        # nothing): a KeyboardInterrupt in between leaves the next call to remove it.
        with self._mutex:
            record = self._record
            if record is None:
                return
            try:
                release_lock_file(self._directory, record)
            except OSError as e:
                logger.warning("removing %s failed: %s", os.path.join(self._directory, LOCK_NAME), e)
            self._record = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

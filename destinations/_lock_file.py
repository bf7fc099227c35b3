"""The local writer lock: a ``LOCK`` file naming its holder, without a descriptor per lock.

A writer holds a local destination while ``LOCK`` holds its owner record (host, pid,
process start time, boot id: ``_process``) and that process runs. Taking it:

1. ``flock(LOCK_EX)`` the destination's directory itself, for the few system calls below
   only: every taker and releaser of this directory's ``LOCK`` does its read-decide-write
   under it, so no two of them ever both find it free;
2. read ``LOCK``: a record whose process runs (a stopped one too: it may resume) means
   :class:`LockHeld`, naming it; no file, an empty one (a clean release by an older
   version), an unreadable one (a record torn by a power loss) or a record whose process
   is gone (killed, exited without releasing, an earlier boot, its pid now another
   process's) means the lock is free;
3. where there is no ``LOCK`` (or an empty one), write the new record to a temporary file
   and ``rename`` it to ``LOCK``: readers without the directory lock (``persistlog
   info``) see a whole record or none. A ``LOCK`` left by a holder that is gone (a
   restart after a crash finds one in every log) is overwritten in place instead, padded
   with spaces (JSON ignores them) to the old record's length and cut to that length: a
   ``rename`` over an existing file makes ext4 start writing the new file back and free
   the old one's blocks (``auto_da_alloc``; with ``discard``, a trim), 0.5-4 ms measured
   against some 20 us. A reader without the directory lock may catch that write half
   done and see a torn record, which it reports as unreadable, as it would after a power
   cut; a taker, holding the directory lock, never does. A taker killed half way leaves
   a torn record, which the next taker finds free, as it is.

Releasing removes ``LOCK`` under the directory lock if it still holds this writer's record.
Nothing is fsynced: after a power loss every recorded holder is from an earlier boot.

The directory lock is held for microseconds; a taker that finds it held (by a process
stopped in exactly that window) retries for :data:`DIRECTORY_LOCK_WAIT` seconds, then
gives up with ``LockHeld``. ``flock`` on a directory works on local POSIX filesystems.

A record of another host cannot be checked from here and counts as running: the writer
there (sharing the directory through a network filesystem) is assumed alive, and the
``LockHeld`` message says to remove ``LOCK`` once it is known to be gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from ._base import LockHeld
from ._names import temp_name
from ._owner import LOCK_NAME, HolderRecord, describe_holder

#: Seconds a taker waits for another process's brief hold of the directory lock.
DIRECTORY_LOCK_WAIT = 10.0

_FILE_MODE = 0o644


@contextlib.contextmanager
def _directory_locked(directory: str) -> Iterator[None]:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        deadline = time.monotonic() + DIRECTORY_LOCK_WAIT
        pause = 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LockHeld(
                        f"{directory}: another process has been taking or releasing its writer lock"
                        f" for {DIRECTORY_LOCK_WAIT:g} s (stopped?)"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
        yield
    finally:
        os.close(fd)  # releases the flock


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(HolderRecord.MAX_BYTES)
    except FileNotFoundError:
        return None


def holder_running(raw: bytes) -> bool:
    """Whether the recorded holder in ``raw`` (``LOCK``'s bytes) may still write."""
    if not raw.strip():
        return False
    record = HolderRecord.parse(raw)
    if record is None:
        return False  # torn by a power loss, or not a record at all: nobody to wait for
    running = record.running()
    return running is None or running


def take_lock_file(directory: str, record: bytes, url: str) -> bytes:
    """Make ``directory/LOCK`` hold ``record``, or raise ``LockHeld`` naming its holder.
    Returns the bytes ``LOCK`` holds: ``record``, padded with spaces where it overwrote a
    longer record of a holder that is gone (see the module docstring)."""
    path = os.path.join(directory, LOCK_NAME)
    with _directory_locked(directory):
        held = _read(path)
        if held is not None and holder_running(held):
            holder = describe_holder(held)
            parsed = HolderRecord.parse(held)
            remote = parsed is not None and parsed.running() is None
            hint = f" (a writer on another host: remove {path} once it is gone)" if remote else ""
            raise LockHeld(f"{url} is locked by another writer: {holder}{hint}", holder)
        if held:
            written = record + b" " * (len(held) - len(record))
            if _overwrite(path, written):
                return written
        _replace(directory, path, record)
        return record


def _overwrite(path: str, data: bytes) -> bool:
    """Write ``data`` over the start of the existing file ``path`` and cut it to that
    length; False, having changed nothing, when it cannot be opened for writing (a
    ``LOCK`` of another user's: the caller replaces it instead)."""
    try:
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        return False
    try:
        view = memoryview(data)
        offset = 0
        while offset < len(data):  # a few hundred bytes: one pwrite
            offset += os.pwrite(fd, view[offset:], offset)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    return True


def _replace(directory: str, path: str, record: bytes) -> None:
    """``record`` into a temporary file, renamed to ``path``."""
    tmp = os.path.join(directory, temp_name(LOCK_NAME))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), _FILE_MODE)
    try:
        try:
            os.write(fd, record)  # a few hundred bytes: one write
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def release_lock_file(directory: str, record: bytes) -> None:
    """Remove ``directory/LOCK`` if it still holds ``record`` (padded or not: see
    :func:`take_lock_file`)."""
    path = os.path.join(directory, LOCK_NAME)
    try:
        with _directory_locked(directory):
            held = _read(path)
            if held is not None and held.rstrip(b" ") == record.rstrip(b" "):
                os.unlink(path)
    except FileNotFoundError:
        return  # the directory went away, and its LOCK with it

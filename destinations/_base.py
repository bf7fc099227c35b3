"""The one interface every destination driver implements.

A destination is one directory (an fsspec URL) holding flat, named files. The driver knows
nothing of the log format: names and bytes are opaque to it. It raises built-in exceptions
only (``FileNotFoundError``, ``FileExistsError``, ``OSError`` and the subclasses below), so
that ``persistlog`` can translate them into its own errors at one seam.

Two kinds of driver exist:

* *appendable* drivers (the local filesystem) grow a file in place with :meth:`open_append`
  and make it durable with ``fsync``;
* *object-store* drivers (S3, memory, any fsspec filesystem without append) never modify a
  file once written: every write is a whole, create-only object.
"""

from __future__ import annotations

import abc
from typing import Any


class LockHeld(BlockingIOError):
    """Another live writer holds the destination's writer lock (or lease).

    ``holder`` describes that writer as it recorded itself (host, pid, writer id), or is
    empty when the holder could not be read. ``expires`` is when a lease runs out unless
    renewed (seconds since the Unix epoch, by the holder's clock), None for a lock that
    lasts as long as its holder's process.
    """

    def __init__(self, message: str, holder: str = "", expires: float | None = None) -> None:
        super().__init__(message)
        self.holder = holder
        self.expires = expires


class AppendFile(abc.ABC):
    """An open, append-only file of an appendable destination."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None:
        """Append ``data`` whole (no short writes are left unreported)."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Hand everything written so far to the operating system."""

    @abc.abstractmethod
    def sync(self) -> None:
        """Make everything written so far durable (``fdatasync``); raises on failure.

        A failed sync is never retried as if it succeeded: the caller must treat the file's
        unsynced tail as lost.
        """

    @abc.abstractmethod
    def truncate(self, size: int) -> None:
        """Cut the file back to ``size`` bytes, unflushed ones included.

        A writer undoes with it an append that an interruption (``KeyboardInterrupt``) may
        have left half done; only bytes past everything it synced are ever cut.
        """

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """Bytes in the file, including the unflushed ones written through this handle.

        Exact even after an interrupted ``write``/``flush``: an exception that is not an
        ``OSError`` never leaves a byte counted twice or not at all.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and close; idempotent."""


class WriterLock(abc.ABC):
    """Proof that this process is the destination's only writer."""

    @abc.abstractmethod
    def renew(self) -> None:
        """Extend a lease (no-op for lock files); raises ``LockHeld`` if it was lost."""

    @abc.abstractmethod
    def release(self) -> None:
        """Give the lock up; idempotent."""


class Destination(abc.ABC):
    """One directory of named files, local or remote.

    Contract shared by every driver (checked by ``tests/destinations/conformance.py``):

    * names are plain file names without ``/``; the driver maps them under its directory;
    * :meth:`list` is never served from a cache: a file created by another process or
      another instance is visible to the next call;
    * :meth:`create` is create-only and durable when it returns (temp file + fsync + rename +
      directory fsync locally, a single conditional PUT remotely);
    * :meth:`replace` swaps a small file atomically: readers see the old or the new bytes;
    * files are read back exactly as written.
    """

    #: True when files grow in place through :meth:`open_append`.
    appendable: bool = False
    #: Seconds between flushes a writer should use by default for this kind of storage.
    default_flush_interval: float = 0.0

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    @abc.abstractmethod
    def ensure(self) -> None:
        """Create the directory (and bucket prefix) if missing; idempotent."""

    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether the directory exists at all."""

    def describe_missing(self) -> str:
        """Why :meth:`exists` is False, in a few words for an error message."""
        return self.why_not_creatable() or "the directory does not exist"

    def why_not_creatable(self) -> str | None:
        """Why no writer can make this destination as things stand (a file where its
        directory would be, a bucket that does not exist), in a few words for an error
        message; None when one can. Reads only."""
        return None

    @abc.abstractmethod
    def list(self, start_after: str | None = None) -> list[str]:
        """Names in the directory in lexical order, only those ``> start_after`` if given.

        Temporary files of in-flight writes are never listed. A missing directory lists as
        empty. Remote drivers pass ``start_after`` to the store so that a poll costs one
        request however many files the directory holds.
        """

    def list_sizes(self) -> dict[str, int]:
        """Every name :meth:`list` gives, with its size in bytes, in lexical order.

        Remote drivers take the sizes from the listing itself (one request per 1,000 names,
        none per file); this default asks :meth:`size` of each. A file removed between the
        listing and its size is left out, as a listing a moment later would leave it out.
        """
        sizes: dict[str, int] = {}
        for name in self.list():
            try:
                sizes[name] = self.size(name)
            except FileNotFoundError:
                continue
        return sizes

    @abc.abstractmethod
    def read(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[offset, offset+length)`` (to the end if ``length`` is None).

        Short at end of file. Raises ``FileNotFoundError`` if the file does not exist.
        """

    @abc.abstractmethod
    def size(self, name: str) -> int:
        """Current size in bytes; ``FileNotFoundError`` if missing."""

    @abc.abstractmethod
    def create(self, name: str, data: bytes) -> None:
        """Write a new file whole and durably; ``FileExistsError`` if it already exists.

        Of two writers creating the same name, at most one succeeds (where the storage has
        conditional writes: a local link, S3's ``If-None-Match``): writers rely on it to
        fence one another out of a log, so a driver must never overwrite here.
        """

    @abc.abstractmethod
    def replace(self, name: str, data: bytes) -> None:
        """Atomically create or overwrite a small file, durably."""

    def replace_hint(self, name: str, data: bytes) -> None:
        """Atomically create or overwrite a small file that is only a hint, not durably.

        Readers see the old or the new bytes, never a mix, while the machine runs. After a
        power cut the file may hold its old bytes, or be missing or unreadable if it had
        none: callers write with it only what readers may find stale, missing or damaged
        at no cost (CURRENT with nothing to delete behind it, CLOSED). Drivers whose
        :meth:`replace` costs no sync (one PUT) keep this default, which is :meth:`replace`.
        """
        self.replace(name, data)

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Remove a file; a missing file is not an error."""

    def open_append(self, name: str) -> AppendFile:
        """Open an existing file for appending (appendable drivers only)."""
        raise NotImplementedError(f"{type(self).__name__} does not append; write whole objects")

    @abc.abstractmethod
    def lock(self, owner: str, ttl: float = 30.0) -> WriterLock:
        """Become the destination's only writer, or raise :class:`LockHeld`.

        Locally a lock file naming the holder's process, held while that process runs (a
        stopped one too) and taken over at once when it is gone, without waiting: the lock
        dies with the process, and holds no descriptor meanwhile; remotely a lease object
        created create-only, renewed within ``ttl`` seconds and taken over only once it has
        expired. Of racing takers exactly one succeeds. ``owner`` is recorded for the error
        message others get.
        """

    def close(self) -> None:
        """Release connections and handles; idempotent."""

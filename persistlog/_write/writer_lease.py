"""The writer lease: the destination's writer lock a Log holds, its renewal and its release.

A local destination's lock is held for as long as the Log lives and needs no renewal; an
object store's is a lease (``lease_ttl`` seconds) that the Log's background job renews
every third of it, idle or not: a lapsed lease lets a second writer in while this one
still writes. A renewal that finds the lease taken fails the Log (``WriterConflict``).

Letting go (:meth:`WriterLease.let_go`) releases the lock once closing has sealed the
log; a call told that the log was handed over waits for it (:meth:`WriterLease.wait_let_go`),
since its app may end the process as soon as it is told.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from destinations import LockHeld, WriterLock

from .._errors import WriterConflict

logger = logging.getLogger("persistlog")


def release_writer_lock(handle: WriterLock, url: str) -> None:
    """Let go of a destination's writer lock; a failure is logged, not raised."""
    try:
        handle.release()
    except OSError as e:
        logger.warning("releasing the writer lock on %s failed: %s", url, e)


# Guards a lease's let-go state and the making of its lock (held briefly, never waited in).
_making_held = threading.Lock()


class WriterLease:
    """The writer lock of one Log's primary destination; see the module docstring."""

    __slots__ = ("_handle", "_url", "_on_lost", "_renew_every", "_renew_at", "_held", "_gone")

    def __init__(
        self, handle: WriterLock, url: str, renew_every: float | None, on_lost: Callable[[BaseException], None]
    ) -> None:
        """``handle`` is taken already; renewed every ``renew_every`` seconds (None: never,
        a local lock); ``on_lost(error)`` is called when a renewal finds it taken."""
        self._handle: WriterLock | None = handle
        self._url = url
        self._on_lost = on_lost
        self._renew_every = renew_every
        self._renew_at = time.monotonic() + renew_every if renew_every is not None else 0.0
        # Held until the lock is let go: a plain lock, which an interrupted waiter cannot
        # leave in a state that keeps the others waiting (an Event's Condition can be),
        # made for the first caller that waits (most Logs never have one).
        self._held: threading.Lock | None = None
        self._gone = False  # let go

    def next_renewal(self) -> float | None:
        """When the lease is next renewed (``time.monotonic()``), None for a lock."""
        return self._renew_at if self._renew_every is not None and self._handle is not None else None

    def renew_due(self, now: float) -> None:
        """Renew the lease if it is due at ``now`` (the background job's part)."""
        if self._renew_every is not None and now >= self._renew_at - 1e-3:
            self.renew()
            self._renew_at = time.monotonic() + self._renew_every

    def renew(self) -> None:
        handle = self._handle
        if handle is None:
            return
        try:
            handle.renew()
        except LockHeld as e:
            self._on_lost(WriterConflict(f"lost the writer lease on {self._url}: {e}"))
        except OSError as e:
            logger.warning("renewing the writer lease on %s failed: %s", self._url, e)

    def release(self) -> None:
        """Release the lock (once; later calls do nothing). Forgotten only once released
        (a handle's release may be called twice): an interruption in between leaves the
        next call to release it."""
        handle = self._handle
        if handle is not None:
            release_writer_lock(handle, self._url)
            self._handle = None

    def let_go(self) -> None:
        """Release the lock, and wake whoever waits in :meth:`wait_let_go`."""
        self.release()
        with _making_held:
            if self._gone:
                return  # let go already
            self._gone = True
            held = self._held
        if held is not None:
            held.release()

    def wait_let_go(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds until :meth:`let_go`."""
        with _making_held:
            if self._gone:
                return
            held = self._held
            if held is None:
                held = self._held = threading.Lock()
                held.acquire()
        if held.acquire(timeout=timeout):
            held.release()


__all__ = ["WriterLease", "release_writer_lock"]

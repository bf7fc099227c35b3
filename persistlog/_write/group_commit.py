"""Group commit: many threads waiting for durability share each sync.

A thread that needs its record durable when nobody else is syncing or waiting syncs by
itself, so a lone caller pays one sync and no thread hand-off. Threads that arrive while
a sync runs park, each on a lock of its own, and one sync thread serves them: it syncs
whatever has been appended by then, and releases every thread that sync covered.

Why a sync thread rather than a caller leading the next sync: in CPython a woken thread
must take the GIL before it can do anything, and on a small machine each such hand-off
costs tens of microseconds, a tenth of an fsync. With a caller as leader those hand-offs
sit between one sync and the next. With the sync thread the next sync starts as soon as
the last one ends, while the threads it released append their next records alongside it
(an fsync releases the GIL).

Why released one by one, each by the one before it: a crowd of threads woken together
all fight over the GIL, and that fight costs more than the chain (the bench measured
about 6x with the crowd against 9x with the chain, 32 threads against one).

A caller interrupted while it waits (``KeyboardInterrupt`` in the main thread) leaves the
chain: if its turn had come it passes it on, and whoever it would have woken also looks
up every ``_RECHECK`` seconds whether the sync that covers it is done, so a turn lost
to an interruption at the wrong instruction costs a short delay, never a hang.

The sync thread is the Log's own, not a worker of the shared runtime (``_runtime.py``):
a sync blocks whoever runs it for an fsync or a PUT, and on a fixed pool the syncs of
every Log in the process would share a few threads and wait behind each other's (and
behind other Logs' flushes). Measured with 16 logs in fsync mode, 4 threads each, one
sync round per pool run: about 0.6x the records per second of a thread per Log. It starts
when a first caller has to park and ends once no caller has waited for ``_IDLE_END``
seconds, so an idle Log has none.

Slow syncs (a PUT) are the other way round: the released threads are back long before the
next sync would end, so starting it at once would split the group into two halves taking
turns. Before a sync at least a millisecond long, the sync thread waits (a bounded while)
for the group to come back; and a caller does not sync by itself while the sync thread
serves a group, or the first one back would sync alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .._errors import LogFailedError

logger = logging.getLogger("persistlog")

# Syncs at least this slow (a PUT, a network filesystem, a spinning disk) are worth waiting
# for released threads before (a local SSD's fsync is not: the wait itself costs a thread
# hand-off, and the next sync would start while they are still being woken anyway); and
# the longest such a wait lasts.
_GATHER_FROM = 0.001
_MAX_GATHER = 0.002
# How often a parked thread checks whether its sync ended without it being woken.
_RECHECK = 0.05
# Seconds without a waiter after which the sync thread ends (the next to park starts one).
_IDLE_END = 1.0


class _Waiter:
    """A parked thread: its record's LSN, the lock it sleeps on, and who to wake after it."""

    __slots__ = ("lsn", "lock", "next", "gone", "woken", "served")

    def __init__(self, lsn: int) -> None:
        self.lsn = lsn
        self.lock = threading.Lock()
        self.lock.acquire()
        self.next: _Waiter | None = None
        self.gone = False  # stopped waiting (interrupted): wake the next one instead
        self.woken = False  # its turn came: it must pass it on
        self.served = False  # the sync that covers it is over


class GroupCommit:
    """Waits for durability on behalf of the writer's callers.

    ``sync(lsn)`` makes every record appended so far durable unless the record at
    ``lsn`` already is (checked under the writer's I/O lock), or raises (having put the
    log in its failed state, or finding it closed); ``durable()`` is the first LSN not yet
    durable; ``check()`` raises the log's failed or closed state.
    """

    def __init__(
        self,
        sync: Callable[[int], None],
        durable: Callable[[], int],
        check: Callable[[], None],
        name: str,
    ) -> None:
        self._sync = sync
        self._durable = durable
        self._check = check
        self._name = name
        # Callers take the plain lock: Condition's own __enter__ is Python code, and a
        # KeyboardInterrupt raised in it just after it took the lock would keep it forever.
        self._mutex = threading.Lock()
        self._cv = threading.Condition(self._mutex)
        self._chain = threading.Lock()
        self._waiters: list[_Waiter] = []
        self._busy = False  # a caller or the sync thread is syncing
        self._idle = False  # the sync thread sleeps on _cv
        self._want = 0  # the sync thread waits for this many waiters before syncing
        self._grouped = False  # the sync thread's last sync served more than one thread
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._error: BaseException | None = None

    def wait(self, lsn: int) -> None:
        """Return once the record at ``lsn`` is durable; raise if it cannot become so."""
        if self._durable() > lsn:
            return
        lead = False
        try:
            with self._mutex:
                # Lead only when nobody is syncing or waiting, and the sync thread is not
                # serving a group: callers leading while others wait would keep the sync
                # thread from running, and one coming back first from a group's sync
                # would sync alone, splitting every group in two.
                lead = self._stopped or not (self._busy or self._waiters or self._grouped)
                if lead:
                    self._busy = True
                else:
                    waiter = _Waiter(lsn)
                    self._waiters.append(waiter)
                    if self._thread is None:
                        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                        self._thread.start()
                    elif self._idle or (self._want and len(self._waiters) >= self._want):
                        self._cv.notify()
            if lead:
                self._sync(lsn)
                return
        finally:
            if lead:
                # First thing, without a call before it: an interruption must not leave
                # the group commit busy for good (the sync thread's idle wait times out,
                # so a notify lost below costs a moment only).
                self._busy = False
                with self._mutex:
                    if self._waiters and self._idle:
                        self._cv.notify()
        try:
            while not waiter.lock.acquire(timeout=_RECHECK):
                if waiter.served:
                    break  # the thread before it in the chain was interrupted
        finally:  # woken, or interrupted (KeyboardInterrupt): the chain goes on
            self._leave(waiter)
        if self._durable() > lsn:
            return
        # Not durable: the sync failed, or the log closed first. Say which.
        self._check()
        error = self._error
        raise LogFailedError(f"a sync failed: {error}") from error

    def stop(self) -> None:
        """Let the sync thread end once it has released its waiters."""
        with self._mutex:
            self._stopped = True
            self._cv.notify()

    def _wake(self, waiter: _Waiter | None) -> None:
        """Wake ``waiter``, or the first one after it still waiting (once each)."""
        while waiter is not None:
            with self._chain:
                if waiter.woken:
                    return
                if not waiter.gone:
                    waiter.woken = True
                    waiter.lock.release()
                    return
            waiter = waiter.next

    def _leave(self, waiter: _Waiter) -> None:
        """Stop waiting; if our turn had come, pass it on so the chain goes on."""
        with self._chain:
            waiter.gone = True
            woken = waiter.woken
        if woken:
            self._wake(waiter.next)

    def _run(self) -> None:
        cv = self._cv
        last_sync = 0.0  # seconds the last sync took
        expect = 0  # threads waiting for, or released by, the last sync
        while True:
            with cv:
                idle_since = time.monotonic()
                while self._busy or not self._waiters:
                    if not self._waiters and (self._stopped or time.monotonic() - idle_since >= _IDLE_END):
                        self._thread = None  # under _mutex: the next caller to park starts one
                        self._grouped = False  # no group is served: a lone caller leads again
                        return
                    self._idle = True
                    cv.wait(_RECHECK)
                    self._idle = False
                if expect > len(self._waiters) and last_sync >= _GATHER_FROM and not self._stopped:
                    self._gather(expect, min(last_sync / 2, _MAX_GATHER))
                self._busy = True
                waiters = self._waiters
                self._waiters = []
            started = time.monotonic()
            try:
                self._sync(max(w.lsn for w in waiters))
            except BaseException as e:  # the log is failed or closed: each waiter says which
                self._error = e
                logger.debug("group sync failed: %s", e)
            finally:
                last_sync = time.monotonic() - started
                with cv:
                    self._busy = False
                    expect = len(waiters) + len(self._waiters)
                    self._grouped = expect > 1
                for before, after in zip(waiters, waiters[1:]):
                    before.next = after
                for w in waiters:
                    w.served = True
                self._wake(waiters[0])

    def _gather(self, expect: int, limit: float) -> None:
        """Wait (holding ``_cv``) until ``expect`` threads wait, for ``limit`` at most.

        The threads the last sync released usually come back with their next record well
        within a sync's time when syncs are slow (a PUT to an object store): waiting for
        them makes one sync of two, where the group would otherwise split into halves
        taking turns.
        """
        self._want = expect
        try:
            gather(self._cv, lambda: len(self._waiters) >= expect or self._stopped, limit)
        finally:
            self._want = 0


def gather(cv: threading.Condition, gathered: Callable[[], bool], limit: float) -> None:
    """Wait on ``cv`` (held) until ``gathered()``, for ``limit`` seconds at most: a sync
    thread waiting for the waiters its last sync released to come back."""
    deadline = time.monotonic() + limit
    while not gathered():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        cv.wait(left)

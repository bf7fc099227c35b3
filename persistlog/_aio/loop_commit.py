"""Group commit for an event loop: tasks waiting for their records share each write and sync.

In an event loop a waiter is a future, and waking it is a callback on the loop: no thread
is parked per waiter, so the group a sync serves is as large as the number of tasks
waiting, and releasing it costs one wake-up of the loop whatever its size.

One commit thread per :class:`~persistlog.AsyncLog` does the storage work, started by the
first task that waits for a write (an AsyncLog in ``buffered`` mode whose tasks never wait
has none). A task whose
record must be written (``flush`` mode, a full batch) or made durable (``fsync`` mode,
``sync=True``) registers ``(lsn, durable, future)`` and awaits the future. The thread takes
every registration made so far, writes what is buffered (and syncs it if any of them asked
for durability) through the Log's own write path (the batch writer's ``commit``, under its
I/O lock, so it interleaves safely with background flushes, rotations and threads using the Log
directly), then hands the whole group to the loop with one
``call_soon_threadsafe``. While the loop wakes that group and its tasks append their next
records, the thread is already writing and syncing the ones that arrived during its last
sync: the loop's CPU and the disk's latency overlap. When a sync takes a fifth of a
millisecond or more (a local SSD's, a busy disk, a PUT), the thread first waits a bounded
while for the tasks it just released, as the threads' group commit does for syncs of a
millisecond (``_write.group_commit``), so that the tasks do not split into two halves each
paying a whole sync.

A cancelled task's future is skipped when its group is resolved; its record was appended
before the task waited, so it is written with its group all the same. Nothing a task does
to its future reaches the shared write.
"""

from __future__ import annotations

import functools
import logging
import operator
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._errors import LogClosedError, LogFailedError, PersistLogError
from .._write.group_commit import _MAX_GATHER, gather

if TYPE_CHECKING:
    import asyncio

    from .._write.batch_writer import BatchWriter
    from .._write.log import Log

logger = logging.getLogger("persistlog")

_Waiter = tuple[int, bool, "asyncio.Future[int]"]
# A waiter's LSN and whether it asked for durability (C calls over a group, not a generator).
_LSN = operator.itemgetter(0)
_DURABLE = operator.itemgetter(1)

# Syncs at least this slow are worth waiting for the tasks the last one released before
# (the threads' group commit waits from a millisecond). Lower here: waking a task costs
# the loop a few microseconds, so a local SSD's sync (a fraction of a millisecond) ends
# while the loop is still waking the last group; syncing at once would split the tasks
# into two halves taking turns, each paying a whole sync (its CPU included).
_LOOP_GATHER_FROM = 0.0002

# Tasks woken in one pass of the loop. Every task woken appends its next record in that
# pass (tens of microseconds each on a busy machine): a group of 256 woken at once would
# hold the loop for the whole group's appends, several milliseconds, before a timer or a
# connection due meanwhile gets its turn; a slice of 32 holds it for about one.
_SLICE = 32


class LoopCommit:
    """Writes and syncs on behalf of the tasks of one event loop; see the module docstring.

    :meth:`request` is called on the loop's thread; :meth:`stop` from any other thread.
    """

    def __init__(self, lg: Log, writer: BatchWriter, loop: asyncio.AbstractEventLoop, name: str) -> None:
        """Commits for ``lg``'s batch ``writer``, whose waiters are futures of ``loop``."""
        # Reached weakly, as the Log's background jobs reach the Log: a Log its app dropped
        # unclosed can be collected (and sealed), and then this thread ends.
        self._writer = weakref.ref(writer)
        weakref.finalize(lg, self._wake)
        self._loop = loop
        self._new_future = _future_maker(loop)
        self._cv = threading.Condition(threading.Lock())
        # Registrations, taken by the thread with popleft(): a deque's append and popleft
        # are atomic, so the loop registers a waiter without taking a lock (the usual case:
        # the thread is busy writing); it takes _cv only to wake a thread that sleeps.
        self._waiting: deque[_Waiter] = deque()
        self._idle = False  # the thread sleeps on _cv: a registration must wake it
        self._want = 0  # the thread gathers: wake it once this many tasks wait
        self._stopped = False
        self._name = name
        self._thread: threading.Thread | None = None  # started by the first request

    def request(self, lsn: int, durable: bool) -> asyncio.Future[int] | None:
        """A future resolved once the record at ``lsn`` is written (durable if asked), or
        None if it already is."""
        writer = self._writer()
        assert writer is not None  # the AsyncLog asking holds its Log
        if (writer.durable_lsn if durable else writer.written_lsn) > lsn:
            return None
        return self.register(lsn, durable)

    def register(self, lsn: int, durable: bool) -> asyncio.Future[int]:
        """:meth:`request` for a record just appended, which no write can have covered yet
        but one that started since (then the thread answers at once): the hot path of an
        awaited ``update()``, one test fewer."""
        fut: asyncio.Future[int] = self._new_future()
        waiter = (lsn, durable, fut)
        waiting = self._waiting
        waiting.append(waiter)
        if self._thread is None and not self._stopped:
            # Only the loop's thread registers: no other request can start a second one.
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        if self._stopped:
            # The thread may have ended before it saw this waiter: whoever removes it
            # answers it (the thread, if it took it first).
            try:
                waiting.remove(waiter)
            except ValueError:
                return fut
            # Closed while this task appended: close() wrote and sealed every record it had
            # accepted, so this one is covered, unless the log failed first.
            self._resolve([waiter], None)
            return fut
        if self._idle or (self._want and len(waiting) >= self._want):
            # Read after the append: a thread that went to sleep before it has set _idle
            # first and then looked at the deque, so one of the two sees the other.
            with self._cv:
                self._cv.notify()
                # Told once: until the thread runs again (it needs the interpreter, which
                # this loop holds) the requests that follow need not tell it again. It
                # sets _idle only under _cv, before it waits, so this cannot hide a sleep.
                self._idle = False
                self._want = 0
        return fut

    def stop(self) -> None:
        """Serve what is registered, then end the thread (blocks: never on the loop)."""
        self._wake()
        thread = self._thread
        if thread is not None and threading.current_thread() is not thread:
            thread.join()

    def _wake(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()

    def _run(self) -> None:
        cv = self._cv
        last_sync = 0.0  # seconds the last write (and sync) took
        expect = 0  # tasks waiting for, or released by, the last write
        while True:
            with cv:
                while not self._waiting:
                    if self._stopped:
                        return
                    self._idle = True
                    if not self._waiting:  # a registration that did not see _idle set
                        cv.wait()
                    self._idle = False
                if expect > len(self._waiting) and last_sync >= _LOOP_GATHER_FROM and not self._stopped:
                    self._gather(expect, min(last_sync / 2, _MAX_GATHER))
            group = self._take()
            if not group:
                continue  # taken back by a request() that found the thread stopping
            started = time.monotonic()
            error: BaseException | None = None
            top = max(map(_LSN, group))
            writer = self._writer()
            try:
                if writer is None:
                    raise LogClosedError("the log was closed")
                # Writes every record appended so far, theirs included, and syncs if any
                # of them asked; it also holds them while a fired trigger switches logs.
                writer.commit(top, durable=any(map(_DURABLE, group)))
            except BaseException as e:  # the log is failed or closed: each waiter says which
                error = e
                logger.debug("a write for the event loop failed: %s", e)
            else:
                group += self._covered(writer)
            del writer  # not held while idle
            last_sync = time.monotonic() - started
            expect = len(group) + len(self._waiting)
            try:
                self._loop.call_soon_threadsafe(self._resolve, group, error)
            except RuntimeError:  # the loop was closed: no task is left to tell
                pass

    def _gather(self, expect: int, limit: float) -> None:
        """Wait (holding ``_cv``) until ``expect`` tasks wait, for ``limit`` at most.

        With slow syncs the tasks the last one released are back with their next records
        well within a sync's time: waiting for them makes one sync of what would otherwise
        be two halves of the tasks taking turns, each half paying a whole sync.
        """
        self._want = expect
        try:
            gather(self._cv, lambda: len(self._waiting) >= expect or self._stopped, limit)
        finally:
            self._want = 0

    def _covered(self, writer: BatchWriter) -> list[_Waiter]:
        """Take the waiters registered since the group was taken whose records the write just
        done covered anyway (appended before it took the buffer): this write answers them,
        not the next."""
        durable, written = writer.durable_lsn, writer.written_lsn
        covered: list[_Waiter] = []
        for w in self._take():
            if (durable if w[1] else written) > w[0]:
                covered.append(w)
            else:
                self._waiting.appendleft(w)  # the order of waiters does not matter
        return covered

    def _take(self) -> list[_Waiter]:
        """Every waiter registered so far (others may be registered meanwhile)."""
        waiting = self._waiting
        taken: list[_Waiter] = []
        try:
            while True:
                taken.append(waiting.popleft())
        except IndexError:
            return taken

    def _resolve(self, group: list[_Waiter], error: BaseException | None, start: int = 0) -> None:
        """On the loop: tell every task of a group how its write went, a slice at a time."""
        writer = self._writer()
        end = start + _SLICE
        if end < len(group):
            # The rest after the tasks this slice wakes: a timer or a connection due
            # meanwhile runs between two slices, not after the whole group.
            self._loop.call_soon(self._resolve, group, error, end)
        # Whether each record is covered, not whether this write raised: a close() that
        # sealed the records made them durable even if this sync found the log closed, and
        # their tasks must not be told they failed.
        durable_lsn, written_lsn = (writer.durable_lsn, writer.written_lsn) if writer is not None else (-1, -1)
        part = group[start:end]
        if durable_lsn > max(map(_LSN, part)):
            # The usual case: the whole slice is durable. One test for all of it.
            for lsn, _, fut in part:
                if not fut.done():  # else its task was cancelled; the record was written all the same
                    fut.set_result(lsn)
            return
        for lsn, durable, fut in part:
            if fut.done():  # its task was cancelled; the record was written all the same
                continue
            if (durable_lsn if durable else written_lsn) > lsn:
                fut.set_result(lsn)
            else:
                fut.set_exception(_failure(writer, error))


def _future_maker(loop: asyncio.AbstractEventLoop) -> Callable[[], asyncio.Future[int]]:
    """``loop.create_future``; for asyncio's own loops, their futures made directly (the
    same object, one Python call fewer per awaited record)."""
    import asyncio

    if type(loop).create_future is asyncio.BaseEventLoop.create_future:
        return functools.partial(asyncio.Future, loop=loop)
    return loop.create_future


def _failure(writer: BatchWriter | None, error: BaseException | None) -> PersistLogError:
    """The exception a waiting task raises: the same types as the sync API's, a fresh
    instance per task (one raised in many tasks would collect all their tracebacks)."""
    if writer is None:
        return LogClosedError("the log was closed")
    try:
        writer.check()
    except PersistLogError as e:
        return e
    failed = LogFailedError(f"a write failed: {error}")
    failed.__cause__ = error
    return failed

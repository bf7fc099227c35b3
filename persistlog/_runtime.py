"""The runtime: one timer thread and a small pool of workers per process, shared by every Log.

A Log's background work (flushing what it buffered, renewing an object store's lease,
firing the interval and signal triggers, rotating) runs here instead of on threads of its
own, so that a process holding thousands of open Logs has a handful of threads, and an idle
Log costs no wake-up at all. The runtime is made on first use, and made again in a child
after ``os.fork`` (the parent's threads do not exist there).

- The **timer thread** (``persistlog-timer``) keeps a heap of due times, one entry per
  :class:`Job` waiting for its time. It only schedules: when a job is due it hands it to
  the workers. It sleeps until the earliest due time, so with no job waiting it sleeps for
  good (``_MAX_WAIT`` at most, see below). While a signal trigger is installed it also
  wakes every ``SIGNAL_POLL`` seconds to read the flags the signal handlers set
  (:meth:`Runtime.watch`): a handler may take no lock, so it cannot schedule anything.
- The **workers** (``persistlog-worker-N``; ``PERSISTLOG_WORKERS`` of them, 4 by default,
  2 at least) run the jobs. A job that runs app code for an unbounded time (a rotation,
  whose ``enumerate_all`` may take minutes) is *long*: at most ``workers - 1`` long jobs
  run at once, so that at least one worker is always there for the short jobs (flushes
  and lease renewals, which must keep their times while Logs enumerate).

A :class:`Job` is one unit of serial work: it never runs on two workers at once, so the
code it runs may assume one thread, as it did on a thread of its own. Its function returns
when it wants to run next (a ``time.monotonic()`` time, or None); :meth:`Job.run_at` and
:meth:`Job.run_soon` ask for an earlier run from anywhere (a request made while it runs is
kept for after the run). Jobs hold what they work on weakly (:func:`weak_method`): a Log
nobody holds is collected, and sealed by ``_write.at_exit``, while its jobs wait on the heap.

Locks. One plain lock, ``Runtime._mutex``, guards the heap, the ready queue and every
job's state. It is a leaf: nothing else is taken while it is held, and no job runs under
it. App threads take it (a flush armed by ``update()``, a rotation requested by
``rotate()``) only with ``with``. The timer thread and the workers sleep, with the lock let
go, on a ``queue.SimpleQueue`` of wake-up tokens each, not on a ``Condition``: a token is
put in one C call, which a ``KeyboardInterrupt`` on an app thread cannot cut in two (a
``Condition``'s ``notify`` and ``__enter__`` are Python code it can cut at the wrong
instruction, losing a wake-up or leaving its lock held), and a token put before its
sleeper sleeps wakes it at once. Their sleeps last ``_MAX_WAIT`` seconds at most.
:meth:`Job.wait_idle` waits on a plain lock made for each run, released by the worker when
the run ends; an interrupted waiter can hold on to nothing that a later run needs.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from types import MethodType
from typing import Any, Generic, TypeVar, cast

logger = logging.getLogger("persistlog")

T = TypeVar("T")

#: The environment variable that sets how many workers the runtime starts.
WORKERS_ENV = "PERSISTLOG_WORKERS"
DEFAULT_WORKERS = 4
MIN_WORKERS = 2
# Seconds between two reads of the signal flags, while a signal trigger is installed: how
# late a signalled rotation may be made due.
SIGNAL_POLL = 0.1
# The longest any runtime thread sleeps without looking around.
_MAX_WAIT = 30.0

def workers_from_env() -> int:
    """The worker count ``PERSISTLOG_WORKERS`` asks for (``DEFAULT_WORKERS`` if unset,
    ``MIN_WORKERS`` at least; a value that is not a number is logged and ignored)."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if not raw:
        return DEFAULT_WORKERS
    try:
        n = int(raw)
    except ValueError:
        logger.warning("%s=%r is not a number of threads; using %d", WORKERS_ENV, raw, DEFAULT_WORKERS)
        return DEFAULT_WORKERS
    if n < MIN_WORKERS:
        logger.warning("%s=%d: the runtime needs %d workers at least (one for rotations, one for flushes)",
                    WORKERS_ENV, n, MIN_WORKERS)
    return max(MIN_WORKERS, n)


def weak_method(method: Callable[[], T]) -> Callable[[], T | None]:
    """A callable that calls the bound ``method`` while its object is alive, and returns
    None once it was collected. The object is held only during the call."""
    return _WeakMethod(method)


class _WeakMethod(Generic[T]):
    """:func:`weak_method`'s callable: a plain weak reference and the function, which
    costs a Log's jobs a fraction of ``weakref.WeakMethod``'s bytes (one per job)."""

    __slots__ = ("_ref", "_func")

    def __init__(self, method: Callable[[], T]) -> None:
        bound = cast(MethodType, method)
        self._ref = weakref.ref(bound.__self__)
        self._func: Callable[[Any], T] = bound.__func__

    def __call__(self) -> T | None:
        obj = self._ref()
        if obj is None:
            return None
        try:
            return self._func(obj)
        finally:
            del obj  # a last reference dropped here finalizes the object on this thread


class Job:
    """Serial background work: ``fn`` runs on a runtime worker, never on two at once.

    ``fn()`` returns when it wants to run next (``time.monotonic()`` time), or None to
    wait until asked. Build one with :meth:`Runtime.job`. Every field is guarded by the
    runtime's ``_mutex``.
    """

    __slots__ = ("_runtime", "_fn", "_kind", "_about", "long", "_due", "_queued", "_runner", "_asked", "_cancelled",
                 "_done")

    def __init__(
        self, runtime: Runtime, fn: Callable[[], float | None], kind: str, about: str | None, long: bool
    ) -> None:
        self._runtime = runtime
        self._fn = fn
        # The name, in two parts (a string shared by every job of a kind, and the URL the
        # job works on, held already by its Log): made when logged, not kept per job.
        self._kind = kind
        self._about = about
        #: Runs app code for an unbounded time: at most ``workers - 1`` such jobs run at once.
        self.long = long
        self._due: float | None = None  # on the heap for this time
        self._queued = False  # in the ready queue
        self._runner: threading.Thread | None = None  # the worker running it
        self._asked: float | None = None  # a run asked for while it ran
        self._cancelled = False
        self._done: threading.Lock | None = None  # held while a run is under way

    @property
    def name(self) -> str:
        """``kind``, and what the job works on (a URL) if given: ``persistlog-flush <url>``."""
        return self._kind if self._about is None else f"{self._kind} {self._about}"

    def run_at(self, when: float) -> None:
        """Run at ``when`` (``time.monotonic()``) at the latest."""
        self._runtime.schedule(self, when)

    def run_soon(self) -> None:
        """Run as soon as a worker is free."""
        self._runtime.schedule(self, 0.0)

    def cancel(self) -> None:
        """Never run again (a run under way goes on: :meth:`wait_idle` waits for it)."""
        self._runtime.cancel(self)

    @property
    def running_here(self) -> bool:
        """Whether the calling thread is the worker running this job now."""
        return self._runner is threading.current_thread()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no run is under way (``timeout`` seconds at most); False if one
        still is. Returns at once on the worker running it."""
        done = self._done
        if done is None or self.running_here:
            return True
        if not done.acquire(timeout=-1 if timeout is None else timeout):
            return False
        done.release()
        return True

    def __repr__(self) -> str:
        return f"<persistlog Job {self.name!r}>"


class Runtime:
    """The process's timer thread and worker pool (see the module's docstring)."""

    def __init__(self, workers: int) -> None:
        self.pid = os.getpid()
        self.workers = workers
        self.max_long = workers - 1
        self._mutex = threading.Lock()
        # Wake-ups, one token each: a put is one C call, which no interruption cuts in two.
        self._timer_wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._work_wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._heap: list[tuple[float, int, Job]] = []
        self._order = itertools.count()
        self._ready: deque[Job] = deque()
        self._long_running = 0
        self._watches: dict[int, tuple[Callable[[], bool | None], Job]] = {}
        self._watch_ids = itertools.count()
        self._sleeping_until: float | None = None  # the timer thread's wake-up time; None: none set
        self._dead = False  # the copy a forked child inherited: schedules nothing
        #: How many times the timer thread woke up (for tests: an idle process wakes rarely).
        self.timer_wakeups = 0
        #: How many job runs the workers made (for tests).
        self.runs = 0
        self._threads = [threading.Thread(target=self._timer, name="persistlog-timer", daemon=True)]
        self._threads += [
            threading.Thread(target=self._work, name=f"persistlog-worker-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def job(self, fn: Callable[[], float | None], kind: str, about: str | None = None, long: bool = False) -> Job:
        """A new job running ``fn`` (not scheduled yet), named ``kind`` and ``about`` (the
        URL it works on, if any)."""
        return Job(self, fn, kind, about, long)

    @property
    def threads(self) -> list[threading.Thread]:
        """The timer thread and the workers."""
        return list(self._threads)

    # -- scheduling (any thread) -----------------------------------------------------------

    def schedule(self, job: Job, when: float) -> None:
        """Run ``job`` at ``when`` at the latest (0: now)."""
        with self._mutex:
            if self._dead or job._cancelled or job._queued:
                return
            if job._runner is not None:
                if job._asked is None or when < job._asked:
                    job._asked = when
                return
            self._place(job, when)

    def cancel(self, job: Job) -> None:
        with self._mutex:
            job._cancelled = True
            job._due = None
            job._asked = None
            if job._queued:
                job._queued = False
                self._ready.remove(job)

    def watch(self, flag: Callable[[], bool | None], job: Job) -> int:
        """Read ``flag()`` every ``SIGNAL_POLL`` seconds on the timer thread, and run
        ``job`` soon while it is true; returns the key for :meth:`unwatch`. ``flag`` reads
        a field and nothing more (it runs on the timer thread)."""
        with self._mutex:
            key = next(self._watch_ids)
            self._watches[key] = (flag, job)
            self._timer_wake.put(None)
            return key

    def unwatch(self, key: int) -> None:
        with self._mutex:
            self._watches.pop(key, None)

    def _place(self, job: Job, when: float) -> None:
        """Put ``job`` on the heap at ``when``, or in the ready queue if due. Holds ``_mutex``."""
        if when <= time.monotonic():
            # In this order: an app thread interrupted between the two steps leaves the job
            # in the ready queue, not marked queued (asked for again, it may be there twice:
            # see _take), never marked queued but out of the queue, which no run would end.
            job._due = None
            self._ready.append(job)
            job._queued = True
            self._work_wake.put(None)
            return
        if job._due is not None and job._due <= when:
            return
        job._due = when  # an entry at a later time stays on the heap, stale
        heapq.heappush(self._heap, (when, next(self._order), job))
        if self._sleeping_until is None or when < self._sleeping_until:
            self._timer_wake.put(None)

    # -- the timer thread ------------------------------------------------------------------

    def _timer(self) -> None:
        while True:
            with self._mutex:
                now = time.monotonic()
                heap = self._heap
                while heap and heap[0][0] <= now:
                    when, _, job = heapq.heappop(heap)
                    if job._due == when and not job._cancelled:
                        job._due = None
                        job._queued = True
                        self._ready.append(job)
                        self._work_wake.put(None)
                wait = heap[0][0] - now if heap else _MAX_WAIT
                if self._watches:
                    wait = min(wait, SIGNAL_POLL)
                wait = min(wait, _MAX_WAIT)
                self._sleeping_until = now + wait
            # A token put after the lock was let go wakes this at once: none is lost.
            try:
                self._timer_wake.get(timeout=wait)
            except queue.Empty:
                pass
            with self._mutex:
                self._sleeping_until = None
                self.timer_wakeups += 1
                watches = list(self._watches.values())
            for flag, job in watches:
                try:
                    if flag():
                        job.run_soon()
                except Exception:
                    logger.exception("reading a signal flag failed")

    # -- the workers -----------------------------------------------------------------------

    def _take(self) -> Job | None:
        """The first ready job a worker may run now (long ones only under the limit)."""
        ready = self._ready
        n = 0
        while n < len(ready):
            job = ready[n]
            if job._runner is not None or job._cancelled:
                # A second entry for a job under way, which an interrupted _place left (the
                # run under way started after it was asked for), or an interrupted cancel's.
                del ready[n]
                continue
            if not job.long or self._long_running < self.max_long:
                del ready[n]
                return job
            n += 1
        return None

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._mutex:
                job = self._take()
                if job is not None:
                    job._queued = False
                    job._runner = me
                    done = job._done = threading.Lock()
                    done.acquire()
                    if job.long:
                        self._long_running += 1
            if job is None:
                # A token put after the lock was let go wakes this at once: none is lost.
                try:
                    self._work_wake.get(timeout=_MAX_WAIT)
                except queue.Empty:
                    pass
                continue
            nxt: float | None = None
            try:
                nxt = job._fn()
            except Exception:  # a worker outlives anything a job raises
                logger.exception("background job %s failed", job.name)
            except BaseException as e:  # (a job's own thread would have ended with it)
                logger.debug("background job %s ended by %r", job.name, e)
            with self._mutex:
                self.runs += 1
                job._runner = None
                job._done = None
                if job.long:
                    self._long_running -= 1
                    if self._ready:
                        self._work_wake.put(None)  # a long job may have waited for this slot
                asked, job._asked = job._asked, None
                if asked is not None and (nxt is None or asked < nxt):
                    nxt = asked
                if nxt is not None and not job._cancelled and not self._dead:
                    self._place(job, nxt)
            done.release()
            del job

    # -- fork ------------------------------------------------------------------------------

    def _forked(self) -> None:
        """In a forked child: this copy's threads are gone; schedule nothing from now on."""
        self._mutex = threading.Lock()
        self._timer_wake = queue.SimpleQueue()
        self._work_wake = queue.SimpleQueue()
        self._dead = True
        self._heap.clear()
        self._ready.clear()
        self._watches.clear()


_runtime: Runtime | None = None
_made = threading.Lock()


def runtime() -> Runtime:
    """The process's runtime, made on first use (and again in a forked child)."""
    global _runtime
    rt = _runtime
    if rt is not None and rt.pid == os.getpid():
        return rt
    with _made:
        rt = _runtime
        if rt is None or rt.pid != os.getpid():
            rt = _runtime = Runtime(workers_from_env())
        return rt


def _after_fork_in_child() -> None:
    global _runtime, _made
    _made = threading.Lock()
    if _runtime is not None:
        _runtime._forked()
        _runtime = None


os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = [
    "DEFAULT_WORKERS",
    "Job",
    "MIN_WORKERS",
    "Runtime",
    "SIGNAL_POLL",
    "WORKERS_ENV",
    "runtime",
    "weak_method",
    "workers_from_env",
]

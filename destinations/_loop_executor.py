"""The executor of fsspec's event loop: blocking calls that still run at interpreter exit.

An async fsspec filesystem (s3fs, gcsfs...) runs its requests on an event loop in a daemon
thread, and that loop hands blocking calls to its default executor: aiohttp resolves host
names there (``getaddrinfo``, for every new connection), aiobotocore builds its SSL
contexts there (for every new connection pool). asyncio's default executor is a
``ThreadPoolExecutor``, and ``concurrent.futures`` stops those from a
``threading._register_atexit`` hook, which runs before any ``atexit`` handler: from then on
every ``submit`` raises "cannot schedule new futures after shutdown", so a request that
needs a new connection fails. persistlog writes and seals the logs an app left open from
an ``atexit`` handler (once the app's non-daemon threads have ended, so that every update
they made is sealed too); on an object store that is a PUT, often on a new connection
(s3fs closes its client from a ``weakref.finalize`` at exit, an idle connection times out).

:func:`serve_at_exit` gives a filesystem's loop :class:`ExitSafeExecutor` as its default
executor: a few daemon threads of its own, which nothing stops at exit. One is started at
once, since from Python 3.12 a finalizing interpreter starts no thread; more are started
while calls wait for one, up to a limit.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, ParamSpec, TypeVar

logger = logging.getLogger("persistlog." + __name__)

P = ParamSpec("P")
T = TypeVar("T")

#: Threads the executor runs at most: blocking calls of an fsspec loop are rare (one per
#: new connection) and short.
MAX_WORKERS = 4

#: Seconds to wait for the loop's thread to take the executor (it is never busy that long).
INSTALL_WAIT = 10.0

_Call = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class ExitSafeExecutor(ThreadPoolExecutor):
    """A thread pool for an event loop's blocking calls that keeps working at exit.

    A ``ThreadPoolExecutor`` (``loop.set_default_executor`` takes nothing else) that uses
    none of its base's machinery: its workers are daemon threads of its own, which the
    interpreter's exit neither stops nor waits for, and :meth:`shutdown` does nothing (the
    executor serves its loop for the life of the process).
    """

    def __init__(self, max_workers: int = MAX_WORKERS, name: str = "persistlog-fsspec") -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=name)
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._mutex = threading.Lock()
        self._limit = max_workers
        self._name = name
        self._started = 0
        self._idle = 0  # workers waiting for a call
        self._waiting = 0  # calls no worker took yet
        self._start_worker()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` on a worker; its future."""
        future: Future[T] = Future()
        with self._mutex:
            self._waiting += 1
            grow = self._waiting > self._idle and self._started < self._limit
        self._calls.put((future, fn, args, kwargs))
        if grow:
            self._start_worker()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing: the workers serve the loop until the process ends (they are daemons)."""

    def _start_worker(self) -> None:
        with self._mutex:
            number = self._started
            self._started += 1
        try:
            threading.Thread(target=self._work, name=f"{self._name}-{number}", daemon=True).start()
        except RuntimeError as e:  # a finalizing interpreter (3.12+): the workers there serve
            with self._mutex:
                self._started -= 1
            logger.debug("no new worker for fsspec's loop: %s", e)

    def _work(self) -> None:
        while True:
            with self._mutex:
                self._idle += 1
            future, fn, args, kwargs = self._calls.get()
            with self._mutex:
                self._idle -= 1
                self._waiting -= 1
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - the caller's future carries it
                future.set_exception(e)
            else:
                future.set_result(result)
            del future, fn, args, kwargs


_served: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
_serving = threading.Lock()


def serve_at_exit(fs: Any) -> None:
    """Make the event loop of the fsspec filesystem ``fs`` (if it has one) run its blocking
    calls on an :class:`ExitSafeExecutor`; once per loop."""
    loop = getattr(fs, "loop", None) if getattr(fs, "async_impl", False) else None
    if not isinstance(loop, asyncio.AbstractEventLoop):
        return
    with _serving:
        if loop in _served:
            return
        _served.add(loop)
    executor = ExitSafeExecutor()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop or not loop.is_running():
        loop.set_default_executor(executor)
        return
    # On the loop's own thread, so that it never races with a run_in_executor() there
    # making asyncio's default executor at the same moment.
    installed = threading.Event()

    def install() -> None:
        loop.set_default_executor(executor)
        installed.set()

    loop.call_soon_threadsafe(install)
    installed.wait(INSTALL_WAIT)

"""The asyncio face of the log: :func:`open_async`, :class:`AsyncLog`, :func:`restore_async`.

An AsyncLog is a :class:`~persistlog.Log` driven from an event loop: a second front over
the Log's parts (``_write.log.parts_of``), making the same calls as the Log's own methods. The
loop's thread does CPU work only: it encodes a record into the Log's batch buffer (the
same buffer, LSN counter and lock the sync API uses) and registers a future. Every storage operation runs
elsewhere: writes and syncs on the AsyncLog's commit thread (``_aio.loop_commit``), opening,
closing, restoring and big records on the loop's default executor, flushes and
rotations on the workers of persistlog's runtime (``_runtime``). So an fsync never stalls the loop, and one fsync
resolves every task waiting on it.

Durability means what it means for ``Log.update``: in ``buffered`` mode ``await update()``
returns once the record is in the Log's memory; in ``flush`` mode once its batch was
written to the OS (on an object store: once its segment object's PUT succeeded); in ``fsync`` mode (or with ``sync=True``) once it is durable.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from .._api import OpenOptions, open_log, restore
from .._errors import HandedOver
from .._read.restore import RestoreResult
from .._write.log import HANDOVER_SEAL_WAIT, Log, parts_of
from .._write.rotation import EnumerateAll, Hold
from .._write.secondaries import SecondaryLag
from .loop_commit import LoopCommit

if TYPE_CHECKING:
    # Imported where it is used at run time: ``import persistlog`` (the CLI, a restore-only
    # tool) does not pay for importing asyncio, about a quarter of its own import time.
    import asyncio

logger = logging.getLogger("persistlog")

T = TypeVar("T")


class AsyncLog:
    """A log written from an event loop. Build it with :func:`persistlog.open_async`.

    ``await update()`` appends one record, ``await update_many()`` several as one batch;
    ``await sync()`` makes all of them durable; ``await rotate()`` starts a fresh log with a
    new enumeration; ``await close()`` writes what is pending and seals the log (or use
    ``async with``). An AsyncLog belongs to the loop that opened it: call its coroutines
    from that loop only.

    **When a record is in the log.** ``update()`` encodes and appends its record as soon as
    the coroutine starts running (at the ``await``), before its first suspension; the rest
    is waiting. If the awaiting task is cancelled while it waits, its record stays in the
    log: it is written with its batch (and made durable by the next sync) exactly as if the
    task had not been cancelled, and no other task's write is disturbed. The cancelled task
    gets no acknowledgement, so, as for any update whose acknowledgement was lost, a crash
    may or may not keep that record; apply the change to your state anyway (the log will
    replay it) or treat the resource as in doubt.

    **Errors** are the sync API's, raised in the awaiting task: ``TypeError`` for a record
    that cannot be encoded (nothing is written), ``LogClosedError``, ``LogFailedError``
    (each waiting task gets its own instance), ``EnumerateError`` from ``rotate()``.
    """

    def __init__(self, lg: Log, loop: asyncio.AbstractEventLoop) -> None:
        self._log = lg
        self._parts = parts = parts_of(lg)
        # The parts the hot path calls, one attribute away.
        self._stage = parts.buffer.fast_stage
        self._writer = parts.writer
        self._sync_each = parts.writer.sync_each
        self._rotator = parts.rotator
        self._loop = loop
        self._commit = LoopCommit(lg, parts.writer, loop, f"persistlog-commit {lg.url}")
        self._register = self._commit.register
        self._signal: int | None = None

    # -- writing ------------------------------------------------------------------------

    async def update(self, record: Any, sync: bool | None = None) -> int:
        """Append ``record``; returns its LSN once the log's durability mode is met.

        ``sync=True`` makes the record durable before returning whatever the mode;
        ``None`` (or ``False``) leaves it to the mode, as ``Log.update`` does.
        """
        if sync is not None and sync is not True and sync is not False:
            _check_sync(sync)
        writer = self._writer
        try:
            if self._rotator.gated:
                await self._pass_gate()
            # The hot path, as Log.update's: the buffer's one fast append, then the
            # writer's hand-over rule (BatchWriter.waits) inlined, its commit the loop's.
            staged = self._stage(record)
            if type(staged) is tuple:  # the batch is handed over (every call's in fsync mode)
                lsn, due = staged[0], True
            elif type(staged) is int:
                lsn, due = staged, False
            else:
                # Too big for the buffer as it stands: the slow path may write a batch first.
                lsn, due = await self._offload(writer.staged, staged)
            if sync or due:
                # _written(), inlined: one coroutine less per awaited record (the hot path).
                await self._register(lsn, sync is True or self._sync_each)
            elif not writer.flush_armed:
                writer.arm_flush()
            return lsn
        except HandedOver:
            await self._offload(self._wait_until_let_go)
            raise

    async def update_many(self, records: Iterable[Any], sync: bool | None = None) -> int | None:
        """Append several records as one batch: a crash keeps all of them or none.
        Returns the LSN of the last once the log's durability mode is met (None for no
        records).

        Every record is encoded first: if any cannot be, ``TypeError`` is raised and none is
        written; if together they are more than one batch holds, ``ValueError``.
        """
        _check_sync(sync)
        buffer, writer, rotator = self._parts.buffer, self._writer, self._rotator
        items, body = buffer.encode_many(records)
        if not items:
            return None
        if rotator.gated:
            await self._pass_gate()
        try:
            staged = buffer.stage_many(len(items), body)
            if staged is None:
                # Does not fit beside what is buffered: what is buffered is written first.
                lsn, due = await self._offload(writer.append_whole, items)
            else:
                lsn, due = staged
            if writer.waits(due, sync):
                await self._written(lsn, bool(sync) or writer.sync_each)
            return lsn
        except HandedOver:
            await self._offload(self._wait_until_let_go)
            raise

    def _wait_until_let_go(self) -> None:
        """The Log's own rule for a call told that the log was handed over (off the loop)."""
        self._parts.lease.wait_let_go(HANDOVER_SEAL_WAIT)

    async def sync(self) -> None:
        """Make every record appended so far durable (fsync locally, PUT remotely)."""
        self._parts.writer.check()
        await self._written(self._parts.buffer.next_lsn - 1, True)

    async def _written(self, lsn: int, durable: bool) -> None:
        """Return once the record at ``lsn`` is written (durable if asked), sharing the
        write and the sync with every task waiting meanwhile."""
        fut = self._commit.request(lsn, durable)
        if fut is not None:
            await fut

    # -- log generations and destinations -----------------------------------------------

    async def rotate(self, wait: bool = True, timeout: float | None = None) -> int | None:
        """Start a new log now; returns its seq once complete (``wait=True``).

        The enumeration runs on a persistlog worker thread. If ``enumerate_all`` raises,
        this raises :class:`EnumerateError` and the log keeps working in the incomplete
        log. Cancelling the awaiting task (or ``timeout``, which raises ``TimeoutError``)
        does not cancel the rotation.
        """
        self._parts.writer.check()
        rotator = self._parts.rotator
        if rotator.concurrent:
            fut = rotator.request(coalesce=False)
        else:
            hold = rotator.hold_updates()
            try:
                await self._quiet(hold)
            except BaseException:
                rotator.give_up(hold)
                raise
            fut = rotator.request(coalesce=False, hold=hold)
        if not wait:
            return None
        import asyncio

        return await asyncio.wait_for(self._shielded(fut), timeout)

    async def _pass_gate(self) -> None:
        """The quiet point of a task's call: start a due rotation (once every task that was
        told its record is logged has run on, applying it), or wait for the one holding
        updates. See :meth:`Rotator.pass_gate`, the same step for threads."""
        import asyncio

        rotator = self._parts.rotator
        while rotator.gated:
            hold, mine = rotator.claim_quiet_point(by_thread=False)
            if hold is None:
                return
            if mine:
                try:
                    await self._quiet(hold)
                except BaseException:
                    rotator.give_up(hold)
                    raise
                rotator.request(coalesce=False, hold=hold)
            await asyncio.shield(asyncio.wrap_future(hold.released, loop=self._loop))

    async def _quiet(self, hold: Hold) -> None:
        """Wait, with ``hold`` holding new updates, until every record appended so far
        was acknowledged to its task and those tasks ran on (a task applies its change
        right after its ``await update()``): then the state has every logged change."""
        import asyncio

        # Durable: a task that asked for sync=True is told only then.
        await self._written(self._parts.buffer.next_lsn - 1, True)
        # The acknowledgements just sent woke their tasks: one more pass of the loop runs
        # them before this one.
        await asyncio.sleep(0)

    async def add_destination(
        self, url: str, *, storage_options: dict[str, Any] | None = None, timeout: float | None = None
    ) -> None:
        """Attach a secondary destination and rotate so that it holds a complete log; see
        :meth:`Log.add_destination`."""
        await self._offload(
            functools.partial(self._log.add_destination, url, storage_options=storage_options, timeout=timeout)
        )

    async def remove_destination(self, url: str) -> None:
        """Detach a secondary destination (its current log is sealed and left in place)."""
        await self._offload(self._log.remove_destination, url)

    # -- closing ------------------------------------------------------------------------

    async def close(self) -> list[SecondaryLag]:
        """Wait for a running enumeration, write what is pending, seal, release the lock.

        Tasks still waiting for their records are answered first (sealing makes their
        records durable). Returns the secondaries left behind the primary, as
        :meth:`Log.close` does. Later calls do nothing but return the same list.
        """
        if self._signal is not None:
            self._loop.remove_signal_handler(self._signal)
            self._signal = None
        return await self._offload(self._shut_down)

    def _shut_down(self) -> list[SecondaryLag]:
        try:
            return self._log.close()
        finally:
            self._commit.stop()

    async def __aenter__(self) -> AsyncLog:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- state --------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The same figures as :meth:`Log.stats` (reads counters only, no storage)."""
        return self._log.stats()

    @property
    def url(self) -> str:
        return self._log.url

    @property
    def seq(self) -> int:
        """The seq of the log being written."""
        return self._log.seq

    @property
    def next_lsn(self) -> int:
        return self._log.next_lsn

    @property
    def durable_lsn(self) -> int:
        """The LSN up to which every record is durable."""
        return self._log.durable_lsn

    @property
    def closed(self) -> bool:
        return self._log.closed

    @property
    def failed(self) -> BaseException | None:
        return self._log.failed

    def __repr__(self) -> str:
        return repr(self._log).replace("persistlog.Log", "persistlog.AsyncLog", 1)

    # -- plumbing -----------------------------------------------------------------------

    def _offload(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn`` (storage work) on the loop's default executor."""
        return self._loop.run_in_executor(None, fn, *args)

    def _shielded(self, fut: Future[T]) -> asyncio.Future[T]:
        """Await a Log future without letting a cancelled awaiter cancel it."""
        import asyncio

        wrapped = asyncio.wrap_future(fut, loop=self._loop)
        wrapped.add_done_callback(_consume)
        return asyncio.shield(wrapped)

    def _install_signal(self, signum: int) -> None:
        # The Log's background job makes the rotation due.
        self._loop.add_signal_handler(signum, self._parts.signal_from_loop)
        self._signal = signum


def _check_sync(sync: Any) -> None:
    if sync is not None and sync is not True and sync is not False:
        raise TypeError(f"sync must be True, False or None, not {sync!r}")


def _consume(fut: asyncio.Future[Any]) -> None:
    """Retrieve an outcome nobody may await any more (a shield whose awaiter went away)."""
    if not fut.cancelled():
        fut.exception()


async def open_async(url: str, enumerate_all: EnumerateAll, **options: Unpack[OpenOptions]) -> AsyncLog:
    """Open the log at ``url`` for writing from an event loop; returns an :class:`AsyncLog`.

    Takes the same options as :func:`persistlog.open` (``durability``, triggers,
    ``secondaries``...) and behaves the same: the first log is enumerated and complete
    before this returns. The opening runs on the loop's default executor and the
    enumeration on that thread (on a local disk) or a persistlog worker thread, so the loop
    keeps serving meanwhile; callbacks
    such as ``on_error`` (and ``replay``/``replay_batch`` where ``open`` takes them to
    restore first) run on those threads, never on the loop. ``rotate_on_signal``
    installs a handler on the loop (``loop.add_signal_handler``) instead of
    ``signal.signal``.

    ``enumerate_all`` stays a plain function and runs on a persistlog worker thread while the
    loop's tasks keep updating: see "asyncio" in README.md for how an asyncio app holds its
    per-resource exclusion while a resource is emitted.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    signum = options.pop("rotate_on_signal", None)
    opening = loop.run_in_executor(None, functools.partial(open_log, url, enumerate_all, **options))
    try:
        lg = await asyncio.shield(opening)
    except asyncio.CancelledError:
        # The opening goes on in its thread: close the Log it makes, or it would hold the
        # destination's writer lock until the process exits.
        opening.add_done_callback(functools.partial(_close_abandoned, loop))
        raise
    alog = AsyncLog(lg, loop)
    if signum is not None:
        try:
            alog._install_signal(signum)
        except BaseException:
            await alog.close()
            raise
    return alog


def _close_abandoned(loop: asyncio.AbstractEventLoop, opening: asyncio.Future[Log]) -> None:
    if opening.cancelled() or opening.exception() is not None:
        return
    loop.run_in_executor(None, opening.result().close)


async def restore_async(
    url: str, replay: Callable[[Any], Any] | None = None, **options: Any
) -> RestoreResult:
    """:func:`persistlog.restore` from an event loop: the same options and result.

    The restore runs on the loop's default executor, so ``replay``/``replay_batch`` are
    called on that worker thread, one at a time and in LSN order, while the loop keeps
    serving: do not touch the state they build until this returns (restore before you
    start serving). Cancelling the awaiting task does not stop the restore.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(restore, url, replay, **options))


__all__ = ["AsyncLog", "open_async", "restore_async"]

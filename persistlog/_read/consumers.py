"""Named consumers of one log: a durable stream that many readers replay, each from a
position of its own, served by one poller.

A :class:`ConsumerGroup` (:func:`persistlog.consumers`) holds any number of named
:class:`Consumer` objects for the log at one destination, and one poller thread that
reads that log for all of them: a single :class:`Follower` whose cursor is the slowest
consumer's position. Each batch it yields is read and decoded once and handed to every
consumer that has not had it yet (a consumer further on skips it, or the part of it it
had), so that memory is one batch whatever the number of consumers and however far apart
they are. A consumer added behind the poller, or reset behind it, makes the poller start
again from the new slowest position (a *rewind*); the others skip what they had.

A consumer's *position* moves past a batch once its handler returned; *committing*
stores it: in a file of the destination's ``consumers/`` directory (docs/FORMAT.md), written
whole and atomically, every ``commit_interval`` seconds (0: after every batch), at
:meth:`ConsumerGroup.stop` and at :meth:`Consumer.commit`. A consumer made again under
the same name resumes right after its last committed position, so a crash redelivers
only what was handed out after the last commit. With ``store_positions=False`` the
positions stay in the app's hands: it stores ``batch.cursor`` (``on_batch``) with its own
state and hands it back as ``position=``.

Stored positions register their consumers: a writer opened with
``keep_for_consumers=True`` keeps every log a registered consumer has not read, up to
``retain_max_logs``. A consumer whose position's log is gone all the same resets:
``on_reset(reason)`` (the app drops what it built) and it starts again from the newest
complete log; without ``on_reset`` it stops with :class:`ResetRequired`. Other consumers
go on.

Threads: the poller (``persistlog-consumers <url>``) runs every handler and ``on_reset``;
the process runtime's workers run the periodic commits (one job per group). Locks:
``ConsumerGroup._lock`` guards the consumer table, the rewind flag and the poller's
follower; ``Consumer._commit_lock`` makes one consumer's commits one at a time, in order.
Neither is held while a handler runs or while the other is taken.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any

from destinations import Destination, open_destination

from .._errors import DestinationError, PersistLogError, ResetRequired
from .._format import constants as F
from .._format.codec import Codec
from .._format.decoder import Damage, parse_segment_header
from .._runtime import runtime, weak_method
from .cursor import Cursor
from .follower import FollowedBatch, Follower, follow
from .positions import PositionStore, check_consumer_name
from .reader import list_logs
from .restore import plan
from .resume import records_to_skip

logger = logging.getLogger("persistlog")

#: Seconds between two automatic commits of a consumer's position, by default.
COMMIT_INTERVAL = 1.0
#: Seconds between two polls of a local log by a group's poller, by default: one poll
#: serves every consumer, and 40 polls a second cost about 1 % of a core on a busy 2-core
#: machine (bench/consumers.py), where one follower's 10 ms cost twice that. Object stores
#: keep :func:`persistlog.follow`'s default (250 ms: every poll is a billed request).
LOCAL_POLL_INTERVAL = 0.025


def start_position(dest: Destination) -> Cursor | None:
    """Where a consumer with no position starts: the first byte of the log a restore
    starts from (the newest complete log); None while there is no log."""
    p = plan(dest)
    if p.start is None:
        return None
    segments = p.logs[p.start]
    if segments[0][0] != 0:
        return None
    try:
        first = parse_segment_header(dest.read(segments[0][1], 0, F.SEGMENT_HEADER_SIZE)).first_lsn
    except (Damage, OSError):
        return None  # the follower's own start (a restore) reports what is wrong
    return Cursor(p.start, 0, 0, first)


def check_position(dest: Destination, position: Cursor) -> None:
    """Raise ``ValueError`` if ``position`` (handed in by the app) is no place in the log:
    not a batch boundary, or an LSN that is not due there. A segment that is gone is left
    to the poller (a reset), as is damage (the poller reports it)."""
    name = F.segment_name(position.log, position.segment)
    try:
        if position.offset:
            records_to_skip(dest, position.log, position.segment, position.offset, position.next_lsn)
            return
        first = parse_segment_header(dest.read(name, 0, F.SEGMENT_HEADER_SIZE)).first_lsn
    except (FileNotFoundError, Damage):
        return
    except OSError as e:
        raise DestinationError(f"cannot read {dest.url}/{name}: {e}") from e
    if first != position.next_lsn:
        raise ValueError(f"position {position}: {name} starts at LSN {first}, not {position.next_lsn}")


def _as_position(value: Cursor | str | dict[str, Any] | None) -> Cursor | None:
    if value is None or isinstance(value, Cursor):
        return value
    if isinstance(value, str):
        return Cursor.parse(value)
    if isinstance(value, dict):
        return Cursor.from_dict(value)
    raise TypeError(f"position must be a Cursor, its str() or its to_dict(), not {type(value).__name__}")


class Consumer:
    """One named reader of a :class:`ConsumerGroup`'s log; made by
    :meth:`ConsumerGroup.add`.

    Its handler (``replay``, ``replay_batch`` or ``on_batch``) runs on the group's poller
    thread. The records it gets are shared with the group's other consumers: read them,
    never change them. A handler that raises stops this consumer (:attr:`error`) at the
    position before that batch; the others go on.
    """

    def __init__(
        self,
        group: ConsumerGroup,
        name: str,
        handler: Callable[[FollowedBatch], Any],
        on_reset: Callable[[str], Any] | None,
        position: Cursor | None,
        committed: Cursor | None,
        fresh: bool = False,
    ) -> None:
        self.name = name
        self._group = group
        self._handler = handler
        self._on_reset = on_reset
        self._position = position
        self._committed = committed
        self._commit_lock = threading.Lock()
        #: What stopped this consumer (its handler's exception, or :class:`ResetRequired`).
        self.error: BaseException | None = None
        #: Records handed to the handler so far (by this object).
        self.delivered_records = 0
        #: How many times it started over (``on_reset``), and why the last time.
        self.resets = 0
        self.last_reset: str | None = None
        # Placed at the newest complete log by the group itself (no position handed in,
        # none stored), and handed nothing yet: see _reset.
        self._fresh = fresh

    @property
    def position(self) -> Cursor | None:
        """Where this consumer resumes: right after the last record its handler took
        (None until it has a place in a log)."""
        return self._position

    @property
    def committed(self) -> Cursor | None:
        """The last position committed (stored at the destination, or, with
        ``store_positions=False``, handed to :meth:`commit`)."""
        return self._committed

    def commit(self) -> Cursor | None:
        """Store the current position now (durable when this returns); returns it."""
        with self._commit_lock:
            position = self._position
            if position is None or position == self._committed:
                return self._committed
            if self._group.store_positions:
                self._group.positions.write(self.name, position)
            self._committed = position
            return position

    def wait_caught_up(self, timeout: float | None = None) -> bool:
        """Block until this consumer has every record the group's poller found; False on
        timeout. Raises what stopped this consumer or the group."""
        return self._group.wait_caught_up(timeout, self)

    def __aiter__(self) -> AsyncIterator[FollowedBatch]:
        """``async for batch in consumer`` over a consumer made by
        :meth:`ConsumerGroup.add_async`: its position moves past a batch when the loop
        asks for the next one; leaving the loop stops it before the batch it was in."""
        from .._aio.async_consumers import LoopHandoff  # asyncio only for asyncio apps

        if not isinstance(self._handler, LoopHandoff):
            raise TypeError(f"consumer {self.name!r} has a handler; ConsumerGroup.add_async() makes one to iterate")
        return self._handler.batches()

    def __repr__(self) -> str:
        state = f"stopped by {type(self.error).__name__}" if self.error is not None else "live"
        return (f"<persistlog.Consumer {self.name!r} position={self._position} committed={self._committed} "
                f"delivered={self.delivered_records} {state}>")

    # -- the poller's side ------------------------------------------------------------

    def _offer(self, fb: FollowedBatch) -> bool:
        """Hand the part of ``fb`` this consumer has not had to its handler; False if it
        had all of it already, or is behind it (it waits for a rewind)."""
        position = self._position
        if position is not None:
            skip = position.next_lsn - fb.first_lsn
            if skip > len(fb.records) - 1 or skip < 0:
                return False
            if skip:
                fb = FollowedBatch(fb.records[skip:], fb.first_lsn + skip, fb.last_lsn, fb.commit_time,
                                   fb.cursor, fb.kinds[skip:], fb.record_cursor(fb.first_lsn + skip - 1))
        try:
            self._handler(fb)
        except BaseException as e:
            self._stop(e, f"consumer {self.name!r} of {self._group.url} stopped: its handler raised {e!r}")
            return False
        self._position = fb.cursor
        self.delivered_records += len(fb.records)
        return True

    def _place(self, start: Callable[[Destination], Cursor | None]) -> None:
        """Take a place in the log (``start(dest)``) if this consumer has none yet: it
        was added while the destination held no log."""
        if self._position is None:
            self._position = start(self._group.dest)

    def _stop(self, error: BaseException, message: str) -> None:
        self.error = error
        logger.error("%s", message)

    def _reset(self, why: str, start: Cursor | None) -> None:
        """Start over from ``start`` (``on_reset(why)`` first), or stop with
        :class:`ResetRequired` without ``on_reset``. A consumer the group placed itself
        and that was handed nothing yet just moves: it starts at the newest complete log,
        which is ``start`` now, and the app built nothing from the one before."""
        if self._fresh and self.delivered_records == 0:
            logger.info("consumer %r of %s, handed nothing yet, starts at the newest complete log: %s",
                     self.name, self._group.url, why)
            self._position = start
            return
        if self._on_reset is None:
            self._stop(ResetRequired(f"consumer {self.name!r} of {self._group.url} cannot go on from "
                                     f"{self._position}: {why}"),
                       f"consumer {self.name!r} of {self._group.url} must reset and has no on_reset: {why}")
            return
        logger.warning("consumer %r of %s resets: %s", self.name, self._group.url, why)
        self.resets += 1
        self.last_reset = why
        try:
            self._on_reset(why)
        except BaseException as e:
            self._stop(e, f"consumer {self.name!r} of {self._group.url} stopped: on_reset raised {e!r}")
            return
        self._position = start


def _handler(
    replay: Callable[[Any], Any] | None,
    replay_batch: Callable[[list[Any]], Any] | None,
    on_batch: Callable[[FollowedBatch], Any] | None,
) -> Callable[[FollowedBatch], Any]:
    given = [h for h in (replay, replay_batch, on_batch) if h is not None]
    if len(given) != 1:
        raise TypeError("a consumer takes one of replay=, replay_batch= or on_batch=")
    if on_batch is not None:
        return on_batch
    if replay_batch is not None:
        return lambda fb: replay_batch(fb.records)
    assert replay is not None

    def each(fb: FollowedBatch) -> None:
        for r in fb.records:
            replay(r)

    return each


class ConsumerGroup:
    """The named consumers of the log at one destination, served by one poller; build it
    with :func:`persistlog.consumers`.

    Add consumers with :meth:`add` (before or after :meth:`start`), run the poller with
    ``start()``/``stop()`` or ``with``. :meth:`stop` commits every consumer's position.
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: dict[str, Any] | None,
        codec: Codec,
        poll_interval: float | None,
        commit_interval: float | None,
        store_positions: bool,
        wait_for_log: bool,
    ) -> None:
        self.url = url
        self._storage_options = storage_options
        self.dest = open_destination(url, **(storage_options or {}))
        self.positions = PositionStore(self.dest)
        self._codec = codec
        #: Seconds between two polls of the log (None: :func:`persistlog.follow`'s default).
        self.poll_interval = poll_interval or (LOCAL_POLL_INTERVAL if self.dest.appendable else None)
        self.commit_interval = commit_interval
        self.store_positions = store_positions
        self._wait_for_log = wait_for_log
        self._lock = threading.Lock()
        self._consumers: dict[str, Consumer] = {}
        self._serving: list[Consumer] = []  # the live consumers, rebuilt when one changes
        self._follower: Follower | None = None
        self._rewind = False
        self._changed = threading.Event()  # a consumer was added while none was served
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._commits = runtime().job(weak_method(self._commit_all), f"persistlog-commit {url}")
        self._commit_armed = False
        #: What stopped the poller (every consumer with it), if anything.
        self.error: BaseException | None = None
        #: Batches and records the poller read (once, whatever the number of consumers).
        self.batches_read = 0
        self.records_read = 0
        #: How many times the poller started again from a slower position.
        self.rewinds = 0

    # -- consumers --------------------------------------------------------------------

    def add(
        self,
        name: str,
        replay: Callable[[Any], Any] | None = None,
        *,
        replay_batch: Callable[[list[Any]], Any] | None = None,
        on_batch: Callable[[FollowedBatch], Any] | None = None,
        on_reset: Callable[[str], Any] | None = None,
        position: Cursor | str | dict[str, Any] | None = None,
    ) -> Consumer:
        """Add the consumer ``name``, resuming right after its committed position.

        One handler: ``replay(record)``, ``replay_batch(records)`` or ``on_batch(batch)``
        (a :class:`FollowedBatch`, whose ``cursor`` is the position after it: what an app
        keeping positions itself stores). Where it starts: ``position`` if given (a
        :class:`Cursor`, its ``str()`` or ``to_dict()``), else its stored position, else
        the start of the newest complete log (stored at once, which registers it). A
        ``position`` that is no place in the log (not a batch boundary, or an LSN not due
        there) raises ``ValueError``.
        ``on_reset(reason)`` is called when what its position needs was deleted; the
        consumer then starts again from the newest complete log (one placed there by the
        group and handed nothing yet just moves to the newest, with no reset).
        """
        return self._add(name, _handler(replay, replay_batch, on_batch), on_reset, position)

    def _add(
        self,
        name: str,
        handler: Callable[[FollowedBatch], Any],
        on_reset: Callable[[str], Any] | None,
        position: Cursor | str | dict[str, Any] | None,
    ) -> Consumer:
        check_consumer_name(name)
        if on_reset is not None and not callable(on_reset):
            raise TypeError("on_reset must be callable with the reason, a str")
        start = _as_position(position)
        if start is not None:
            check_position(self.dest, start)
        stored = self.positions.read(name) if self.store_positions else None
        committed = stored.cursor if stored is not None else None
        if start is None:
            start = committed if committed is not None else start_position(self.dest)
        with self._lock:
            if name in self._consumers:
                raise ValueError(f"consumer {name!r} is in this group already")
            consumer = Consumer(self, name, handler, on_reset, start, committed,
                                fresh=position is None and committed is None)
            self._consumers[name] = consumer
            self._serving = self._live()
            self._ask_rewind(consumer)
        if self.store_positions and committed is None and start is not None:
            consumer.commit()  # registered from now on: retention keeps what it has not read
        self._changed.set()
        logger.info("consumer %r of %s starts at %s", name, self.url, start)
        return consumer

    def add_async(
        self,
        name: str,
        *,
        on_reset: Callable[[str], Any] | None = None,
        position: Cursor | str | dict[str, Any] | None = None,
    ) -> Consumer:
        """Add the consumer ``name`` to iterate from the running event loop: ``async for
        batch in consumer`` (a :class:`FollowedBatch` each). It starts, resumes and
        commits as :meth:`add` says; its position moves past a batch when the loop asks
        for the next one, so a body that raises or breaks out, or a cancelled task,
        leaves the batch it was in to be delivered again. The group's one poller waits
        while the loop works on a batch, as it waits for any handler. ``on_reset`` runs on
        the poller thread. Call from a coroutine."""
        import asyncio

        from .._aio.async_consumers import LoopHandoff  # asyncio only for asyncio apps

        return self._add(name, LoopHandoff(asyncio.get_running_loop(), self._stopping), on_reset, position)

    def remove(self, name: str, *, forget: bool = False) -> None:
        """Stop serving consumer ``name`` after committing its position; ``forget=True``
        deletes its stored position too, so retention no longer keeps logs for it."""
        with self._lock:
            consumer = self._consumers.pop(name, None)
            self._serving = self._live()
        if consumer is not None and consumer.error is None:
            consumer.commit()
        if forget:
            self.positions.delete(name)

    def __getitem__(self, name: str) -> Consumer:
        return self._consumers[name]

    def __contains__(self, name: object) -> bool:
        return name in self._consumers

    @property
    def consumers(self) -> list[Consumer]:
        """The consumers of this group, in the order they were added."""
        return list(self._consumers.values())

    def registered(self) -> dict[str, Cursor | None]:
        """Every consumer with a position stored at the destination (this group's or any
        other process's), with that position (None if it is damaged)."""
        found: dict[str, Cursor | None] = {}
        for name, stored in self.positions.all().items():
            found[name] = stored.cursor if stored is not None else None
        return found

    def _live(self) -> list[Consumer]:
        return [c for c in self._consumers.values() if c.error is None]

    def _ask_rewind(self, consumer: Consumer) -> None:
        """(Under ``_lock``.) Make the poller start again if ``consumer`` stands before
        where it reads."""
        follower = self._follower
        if follower is None:
            return
        reading = follower.cursor
        if consumer.position is None or reading is None or consumer.position.next_lsn < reading.next_lsn:
            self._rewind = True
            follower.stop()  # ends its iteration at its next poll or wait

    # -- the poller -------------------------------------------------------------------

    def start(self) -> ConsumerGroup:
        """Run the poller on a background thread."""
        if self._thread is not None:
            raise RuntimeError("consumer group already started")
        self._thread = threading.Thread(target=self._run, name=f"persistlog-consumers {self.url}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop the poller and commit every consumer's position. Raises what stopped the
        poller, if anything did."""
        self._stopping.set()
        self._changed.set()
        with self._lock:
            if self._follower is not None:
                self._follower.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._commits.cancel()
        self._commits.wait_idle(timeout)
        for consumer in list(self._consumers.values()):
            consumer.commit()
        if self.error is not None:
            raise self.error

    def __enter__(self) -> ConsumerGroup:
        if self._thread is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.stop()
            return
        try:
            self.stop()
        except BaseException as e:
            if e is not self.error:
                raise
            logger.debug("consumers of %s had stopped on %r before %r", self.url, e, exc)

    def wait_caught_up(self, timeout: float | None = None, consumer: Consumer | None = None) -> bool:
        """Block until a poll that started after this call found nothing new and every
        live consumer (or just ``consumer``) has all the poller read; False on timeout.
        Raises what stopped the poller (or ``consumer``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        since: tuple[Follower | None, int] = (None, 0)  # a follower, and its polls at the call
        while True:
            self._raise_error(consumer)
            with self._lock:
                follower, rewind = self._follower, self._rewind
            if follower is not since[0]:
                since = (follower, follower.polls if follower is not None else 0)
            # Polls count as they start: two more, and one that began after the call ended.
            elif follower is not None and not rewind and follower.polls >= since[1] + 2 \
                    and self._caught_up(follower, consumer):
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            time.sleep(min(0.005, left) if left is not None else 0.005)

    def _raise_error(self, consumer: Consumer | None) -> None:
        if consumer is not None and consumer.error is not None:
            raise consumer.error
        if self.error is not None:
            raise self.error

    def _caught_up(self, follower: Follower, consumer: Consumer | None) -> bool:
        if not follower.wait_caught_up(0):
            return False
        reading = follower.cursor
        if reading is None:
            return False
        waiting = [consumer] if consumer is not None else self._serving
        return all(c.error is not None or (c.position is not None and c.position.next_lsn >= reading.next_lsn)
                   for c in waiting)

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                follower = self._next_follower()
                if follower is None:
                    self._changed.wait(self.poll_interval or 0.25)
                    self._changed.clear()
                    continue
                try:
                    for fb in follower:
                        self._hand_out(fb)
                except (ResetRequired, ValueError) as e:
                    # ValueError: the follower found the slowest position is no place in
                    # the log (handlers' own errors never get here: _offer keeps them).
                    self._reset_behind(follower, str(e))
                    self._stopping.wait(self.poll_interval or 0.25)  # never a busy loop of resets
                finally:
                    follower.stop()
        except BaseException as e:
            self.error = e
            for consumer in self._live():
                consumer.error = e
            logger.error("consumers of %s stopped: %s", self.url, e)

    def _next_follower(self) -> Follower | None:
        """A follower from the slowest live consumer's position (None: no live one)."""
        for consumer in self._serving:
            consumer._place(start_position)
        with self._lock:
            self._serving = live = self._live()
            if self._follower is not None:
                self.rewinds += 1
            self._rewind = False
            if not live:
                self._follower = None
                return None
            positions = [c.position for c in live]
            slowest = None if any(p is None for p in positions) else min(
                (p for p in positions if p is not None), key=lambda p: p.next_lsn)
            self._follower = follow(
                self.url, cursor=slowest, poll_interval=self.poll_interval, storage_options=self._storage_options,
                codec=self._codec, wait_for_log=self._wait_for_log,
            )
            if self._stopping.is_set():
                self._follower.stop()
            return self._follower

    def _hand_out(self, fb: FollowedBatch) -> None:
        self.batches_read += 1
        self.records_read += len(fb.records)
        took = [c for c in self._serving if c.error is None and c._offer(fb)]
        if not took:
            return
        if self.commit_interval == 0:
            for consumer in took:
                try:
                    consumer.commit()
                except PersistLogError as e:  # the commit job tries again
                    logger.warning("committing consumer %r of %s failed (will retry): %s", consumer.name, self.url, e)
                    self._commits.run_at(time.monotonic() + COMMIT_INTERVAL)
        elif self.commit_interval is not None and not self._commit_armed:
            self._commit_armed = True
            self._commits.run_at(time.monotonic() + self.commit_interval)

    def _commit_all(self) -> float | None:
        """The commit job: store every position that moved; try again later on failure."""
        self._commit_armed = False
        failed = False
        for consumer in list(self._consumers.values()):
            try:
                consumer.commit()
            except PersistLogError as e:
                failed = True
                logger.warning("committing consumer %r of %s failed (will retry): %s", consumer.name, self.url, e)
        if failed:
            self._commit_armed = True
            return time.monotonic() + (self.commit_interval or COMMIT_INTERVAL)
        return None

    def _reset_behind(self, follower: Follower, why: str) -> None:
        """The poller's follower cannot go on (retention deleted what the slowest
        position needs, or it is past the log's end): reset the consumers whose position
        is gone, or, if none is, those at or behind where the poller stood."""
        logs = list_logs(self.dest)
        start = start_position(self.dest)
        live = self._live()
        gone = [c for c in live if c.position is not None and not _still_readable(c.position, logs)]
        if not gone:
            reading = follower.cursor
            gone = [c for c in live if c.position is None or reading is None
                    or c.position.next_lsn <= reading.next_lsn]
        for consumer in gone:
            consumer._reset(why, start)
            if consumer.error is None:
                try:
                    consumer.commit()
                except PersistLogError as e:
                    logger.warning("committing consumer %r of %s after its reset failed: %s", consumer.name, self.url, e)

    def __repr__(self) -> str:
        state = "running" if self._thread is not None and self._thread.is_alive() else "idle"
        return f"<persistlog.ConsumerGroup {self.url!r} consumers={list(self._consumers)} {state}>"


def _still_readable(position: Cursor, logs: dict[int, list[tuple[int, str]]]) -> bool:
    return any(number == position.segment for number, _name in logs.get(position.log, []))


def consumers(
    url: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    codec: Codec | None = None,
    poll_interval: float | None = None,
    commit_interval: float | None = COMMIT_INTERVAL,
    store_positions: bool = True,
    wait_for_log: bool = False,
) -> ConsumerGroup:
    """The named consumers of the log at ``url``: a :class:`ConsumerGroup`, to which the
    app adds consumers (:meth:`ConsumerGroup.add`) and whose one poller reads the log
    once for all of them.

    Positions are committed (stored at ``url``, one file each in ``consumers/``) every
    ``commit_interval`` seconds (0: after every batch; None: only by
    :meth:`Consumer.commit` and :meth:`ConsumerGroup.stop`). With
    ``store_positions=False`` nothing is stored: the app keeps each consumer's position
    (``batch.cursor`` in ``on_batch``) and hands it back as ``add(..., position=)``;
    retention then knows nothing of those consumers (use ``retain_seconds``).
    ``poll_interval`` and ``wait_for_log`` mean what they mean for
    :func:`persistlog.follow`; one poll serves every consumer, every 25 ms on a local disk
    by default, 250 ms on an object store. Nothing runs until ``start()`` (or ``with``).
    """
    if commit_interval is not None and (
        not isinstance(commit_interval, (int, float)) or isinstance(commit_interval, bool) or not commit_interval >= 0
    ):
        raise ValueError(f"commit_interval must be a number of seconds >= 0 or None, not {commit_interval!r}")
    if poll_interval is not None and (not isinstance(poll_interval, (int, float)) or not poll_interval > 0):
        raise ValueError(f"poll_interval must be a positive number of seconds, not {poll_interval!r}")
    if not isinstance(store_positions, bool):
        raise TypeError(f"store_positions must be True or False, not {store_positions!r}")
    if codec is not None and not isinstance(codec, Codec):
        raise TypeError(f"codec must be a persistlog.Codec, not {type(codec).__name__}")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options must be a dict, not {type(storage_options).__name__}")
    return ConsumerGroup(
        os.fspath(url),
        storage_options=storage_options,
        codec=codec or Codec(),
        poll_interval=poll_interval,
        commit_interval=commit_interval,
        store_positions=store_positions,
        wait_for_log=wait_for_log,
    )


__all__ = ["Consumer", "ConsumerGroup", "consumers", "start_position"]

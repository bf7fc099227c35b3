"""``Queue``: a durable FIFO of messages in one log, whose bodies stay on storage.

Memory holds, per message, its id, its position (the LSN of the record holding its body),
its expiry, its size and when a delivery of it times out: some 150 bytes, whatever the
body's size. A body is read back
from the log when the message is delivered, and when a rotation copies the messages not
yet acknowledged into the new log.

Its records (the Spark source and the CLI show them as any other)::

    {"op": "send", "id": 7, "body": b"...", "exp": 1767225600.0}   # "exp" only with a TTL
    {"op": "ack", "id": 7}
    {"op": "next", "id": 8}     # first in each enumeration: ids are never given twice

An enumeration writes the ``next`` record, then one ``send`` record (a snapshot) per
message neither acknowledged nor expired, in id order: a rotation's new log holds exactly
the queue. Delivery state is the process's own: a message received and not acknowledged
before a crash or a restart is delivered again (at least once); an acknowledgement that
returned is never undone (its record was written per the log's durability mode before
``ack`` returned).

A delivered message not acknowledged within its visibility timeout is delivered again
(before any message not delivered yet, the one whose timeout ran out first first); the
timeouts are the process's own too.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Unpack

from destinations import Destination

from .._api import StoreOptions
from .._api import open_log
from .._api import restore as restore_log
from .._errors import CorruptLogError, QuotaExceeded
from .._format.codec import Codec
from .._format.crypt import Keyring, keyring
from .._read.record_reader import RecordNotWritten, RecordReader
from .._read.restore import RestoreResult
from .._write.log import Log
from .._write.secondaries import SecondaryLag
from .._write.settings import destination_at

if TYPE_CHECKING:
    from .log_set import LogSet

logger = logging.getLogger("persistlog")

#: Queues :meth:`Queue.open_many` opens at once: an open waits mostly for the syncs of
#: its new log, which overlap (4 threads open about 3x faster than 1 on a local disk).
OPEN_THREADS = 4

#: Bytes of message bodies a queue's restore keeps in memory for the open's enumeration,
#: which then writes them into the new log without reading them back (the rest, past
#: this, are read back by position): a restart reads each body once, not twice.
KEEP_REPLAYED_BYTES = 4 * 1024 * 1024

#: The codec of every queue opened without one: a queue's own records are plain values
#: (ints, bytes, floats), and a Codec per log would cost some 2 KB per idle queue.
_PLAIN = Codec()
_PLAIN_LOADS = _PLAIN.loads


def _loads_of(codec: Codec) -> Callable[[bytes], Any]:
    """``codec.loads``: for the queues' shared codec one bound method they all share."""
    return _PLAIN_LOADS if codec is _PLAIN else codec.loads

#: Options of :func:`persistlog.open` a Queue sets itself.
_OWN_OPTIONS = {
    "replay": "the queue restores itself",
    "replay_batch": "the queue restores itself",
    "concurrent_enumeration": "the queue's enumeration runs while its sends and acks wait",
    "discard_existing": "the queue restores what is there; delete the location to start over",
    "recovery": "a queue reads bodies back by position, so it restores strictly",
}


@dataclass(frozen=True, slots=True)
class Message:
    """A message handed out by :meth:`Queue.receive`: acknowledge it with
    ``queue.ack(message.id)``. ``expires_at`` is the wall-clock time (``time.time()``)
    after which it is dropped undelivered, or None."""

    id: int
    body: bytes
    expires_at: float | None = None


class _Entry:
    """What memory holds of one message: its body is in the log at ``lsn``. ``visible_at``
    is None until it is delivered, then when it may be delivered again (``inf``: not
    before a restart)."""

    __slots__ = ("id", "lsn", "expires_at", "size", "visible_at")

    def __init__(self, message_id: int, lsn: int, expires_at: float | None, size: int) -> None:
        self.id = message_id
        self.lsn = lsn
        self.expires_at = expires_at
        self.size = size
        self.visible_at: float | None = None


def _check_body(body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    raise TypeError(f"a Queue message is bytes (or a bytearray or memoryview), not {type(body).__name__}; nothing was sent")


def _check_limit(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer or None, not {value!r}")
    return value


def _check_ttl(ttl: Any) -> float | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0 or ttl == float("inf"):
        raise ValueError(f"ttl must be a positive finite number of seconds or None, not {ttl!r}")
    return float(ttl)


def _check_visibility(name: str, timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout < math.inf:
        raise ValueError(f"{name} must be a finite number of seconds >= 0 or None, not {timeout!r}")
    return float(timeout)


#: Compact the list of messages not delivered yet once this many at its head are gone.
_COMPACT_AT = 32


class Queue:
    """A durable FIFO queue of ``bytes`` messages in one log: ``send``, ``receive``, ``ack``.

    >>> q = Queue.open("/var/lib/broker/queue-1")     # restores, then opens its log
    >>> mid = q.send(b"hello")
    >>> m = q.receive()                                # Message(id=mid, body=b"hello")
    >>> q.ack(m.id)
    True

    Open it with :meth:`open` (a location of its own) or :meth:`open_in` (a key of a
    :class:`LogSet`, for thousands of queues). Bodies stay in the log: memory holds about
    200 bytes per message (see the module docstring). Thread-safe: one lock orders every
    call, so the log's order is the queue's order.

    Guarantees, in the log's durability mode (``"flush"`` by default here: a ``send`` or
    ``ack`` that returned survives the process's crash; ``"fsync"`` a power loss too;
    ``"buffered"`` neither, within the flush interval):

    - a message whose ``send`` returned is delivered, in send order, until acknowledged or
      expired; after a restart every message not acknowledged is delivered again, those
      received before it included (at least once);
    - a message whose ``ack`` returned is never delivered again;
    - a message delivered and not acknowledged within its visibility timeout
      (``visibility_timeout`` of the queue or of the ``receive``; None: no timeout) is
      delivered again, before the messages not delivered yet (at least once: a slow
      consumer's message may reach another consumer meanwhile, and an ``ack`` by id
      still acknowledges it);
    - ``send`` raises :class:`QuotaExceeded` before writing anything when the queue would
      hold more than ``max_messages`` messages or ``max_bytes`` bytes of bodies;
    - a message sent with a ``ttl`` (or the queue's default ``ttl``) is dropped once
      ``clock()`` passes its expiry, delivered or not; nothing is written for that.
    """

    # Slots, not a __dict__: a broker holds one Queue per recipient.
    __slots__ = (
        "max_messages", "max_bytes", "ttl", "visibility_timeout", "_clock", "_lock", "_entries", "_ready",
        "_head", "_timeouts", "_bytes", "_in_flight", "_next_id", "_log", "_dest", "_reader", "_loads", "_keys",
        "_replayed", "_kept", "_kept_bytes", "_ordinal", "_open_lsn", "_replay_start", "_enumerated_to", "restored",
    )

    def __init__(
        self,
        *,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        ttl: float | None = None,
        visibility_timeout: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_messages = _check_limit("max_messages", max_messages)
        self.max_bytes = _check_limit("max_bytes", max_bytes)
        self.ttl = _check_ttl(ttl)
        self.visibility_timeout = _check_visibility("visibility_timeout", visibility_timeout)
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}  # every message not acknowledged, by id (id order)
        # Those not delivered yet, in id order, from ``_head`` on (a list and an index:
        # an empty deque costs 600 bytes, an empty list 56, and there is one per queue).
        self._ready: list[_Entry] = []
        self._head = 0
        # (visible_at, id) of delivered messages with a timeout, a heap made at the first
        # one; stale pairs (acknowledged, delivered again) are skipped when they come up.
        self._timeouts: list[tuple[float, int]] | None = None
        self._bytes = 0
        self._in_flight = 0
        self._next_id = 1
        self._log: Log | None = None
        self._dest: Destination | None = None
        self._reader: RecordReader | None = None
        # The open's enumeration decodes with the codec given (or the queues' shared
        # one, _PLAIN); after that the Log's, so that no queue keeps a Codec of its own.
        self._loads: Callable[[bytes], Any] | None = None
        # The keys bodies are read back with, where the log is encrypted (key_provider=).
        self._keys: Keyring | None = None
        # Restoring: each replayed send by ordinal (its LSN once the restore says where
        # the replay started), and the LSN the open's first log starts at.
        self._replayed: dict[int, tuple[int, float | None, int]] | None = {}
        # The send records the restore read, by id, while they fit in
        # KEEP_REPLAYED_BYTES: the open's enumeration writes these as they are.
        self._kept: dict[int, dict[str, Any]] | None = {}
        self._kept_bytes = 0
        self._ordinal = 0
        self._open_lsn = 0
        # (seq, first LSN) of the first log the restore replayed, from its start: where
        # the open's enumeration starts reading bodies.
        self._replay_start: tuple[int, int] | None = None
        # The LSN after the records of the last enumeration (see _appended_at).
        self._enumerated_to = 0
        self.restored: RestoreResult | None = None

    # -- opening ------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        url: str | os.PathLike[str],
        *,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        ttl: float | None = None,
        visibility_timeout: float | None = None,
        clock: Callable[[], float] = time.time,
        **options: Unpack[StoreOptions],
    ) -> Queue:
        """Restore the queue at ``url`` (its messages not acknowledged come back, to be
        delivered again) and open its log for writing.

        ``options`` are those of :func:`persistlog.open` (``durability``, here ``"flush"``
        unless given, and ``share_values``, here False unless given; rotation triggers,
        ``retain``, ``storage_options``...). A rotation copies the messages not
        acknowledged into the new log, reading their bodies from the old one. ``max_messages``/``max_bytes`` are the quota, ``ttl`` the default
        time to live of a message in seconds, ``visibility_timeout`` the seconds a
        delivered message waits for its ``ack`` before it is delivered again (None, the
        default: until a restart), ``clock`` the wall clock expiries and timeouts are
        read against. :class:`WriterConflict` when another process has the queue open.
        """
        queue = cls(max_messages=max_messages, max_bytes=max_bytes, ttl=ttl,
                    visibility_timeout=visibility_timeout, clock=clock)
        opts = queue._options(dict(options))
        so = opts.get("storage_options")

        def restore() -> RestoreResult:
            return restore_log(url, replay_batch=queue._apply_batch, codec=opts.get("codec"), storage_options=so,
                               key_provider=queue._keys)

        queue._start(restore, lambda: open_log(url, queue._enumerate, **opts), lambda: destination_at(url, so))
        return queue

    @classmethod
    def open_in(
        cls,
        log_set: LogSet,
        key: str,
        *,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        ttl: float | None = None,
        visibility_timeout: float | None = None,
        clock: Callable[[], float] = time.time,
        **options: Unpack[StoreOptions],
    ) -> Queue:
        """:meth:`open` the queue named ``key`` in ``log_set`` (its log is
        ``log_set.url(key)``, opened with the set's defaults and ``options`` over them;
        ``durability`` is ``"flush"`` unless one of them names it). The set closes it
        with the others (:meth:`LogSet.close`)."""
        queue = cls(max_messages=max_messages, max_bytes=max_bytes, ttl=ttl,
                    visibility_timeout=visibility_timeout, clock=clock)
        opts = queue._options(dict(options), log_set.defaults)
        if "storage_options" in opts:
            raise TypeError("Queue.open_in() takes no storage_options: the set's reach every log")

        def restore() -> RestoreResult:
            return log_set.restore(key, replay_batch=queue._apply_batch, codec=opts.get("codec"),
                                   key_provider=queue._keys)

        url = log_set.url(key)
        queue._start(
            restore,
            # Over a set default of concurrent_enumeration=True: the queue's enumeration
            # relies on updates being held (see _enumerate).
            lambda: log_set.open(key, queue._enumerate, concurrent_enumeration=False, **opts),
            lambda: destination_at(url, log_set.storage_options),
        )
        return queue

    @classmethod
    def open_many(
        cls,
        log_set: LogSet,
        keys: Iterable[str] | None = None,
        *,
        threads: int = OPEN_THREADS,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        ttl: float | None = None,
        visibility_timeout: float | None = None,
        clock: Callable[[], float] = time.time,
        **options: Unpack[StoreOptions],
    ) -> dict[str, Queue]:
        """:meth:`open_in` for each of ``keys`` (default: every key of ``log_set``, as a
        restart opens them), ``threads`` at a time: an open waits mostly for storage (the
        syncs of its new log), so several overlap. Returns the queues by key. The first
        error is raised once the others have opened; what opened stays in ``log_set``
        (its ``close()`` closes it)."""
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ValueError(f"threads must be a positive integer, not {threads!r}")
        names = list(log_set.keys() if keys is None else keys)

        def open_one(key: str) -> Queue:
            return cls.open_in(log_set, key, max_messages=max_messages, max_bytes=max_bytes, ttl=ttl,
                               visibility_timeout=visibility_timeout, clock=clock, **options)

        if threads == 1 or len(names) < 2:
            return {key: open_one(key) for key in names}
        with ThreadPoolExecutor(min(threads, len(names)), thread_name_prefix="persistlog-queues") as pool:
            futures = [pool.submit(open_one, key) for key in names]
        return {key: f.result() for key, f in zip(names, futures)}

    def _options(self, options: dict[str, Any], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
        for own, why in _OWN_OPTIONS.items():
            if own in options:
                raise TypeError(f"Queue.open() takes no {own}: {why}")
        if "durability" not in options and "durability" not in (defaults or {}):
            options["durability"] = "flush"
        if "share_values" not in options and "share_values" not in (defaults or {}):
            # A queue's snapshot is its pending messages, each body once: nothing repeats
            # for shared values to save, and their bookkeeping would cost every message.
            options["share_values"] = False
        codec = options.get("codec") or (defaults or {}).get("codec")
        if codec is None:
            options["codec"] = codec = _PLAIN
        self._loads = _loads_of(codec)
        provider = options.get("key_provider") or (defaults or {}).get("key_provider")
        self._keys = keyring(provider)
        return options

    def _start(
        self,
        restore: Callable[[], RestoreResult],
        open_: Callable[[], Log],
        destination: Callable[[], Destination],
    ) -> None:
        """Restore (positions by ordinal), then open the log: its first enumeration copies
        every message into it, the send records the restore kept as they are, the rest
        read back from the restored logs."""
        result = restore()
        self._rebuild(result)
        self._dest = destination()
        try:
            lg = open_()
            if lg.next_lsn != self._open_lsn + 1 + len(self._entries):
                lg.close()
                raise RuntimeError(
                    f"{lg.url}: the queue's first log ends at LSN {lg.next_lsn}, not where its "
                    f"enumeration put it ({self._open_lsn + 1 + len(self._entries)})"
                )
        except BaseException:
            self._dest.close()
            raise
        self._log = lg
        self._loads = _loads_of(lg.codec)
        # Bodies are read through the log's destination from here on: one per queue.
        self._dest.close()
        self._dest = lg.dest
        self._reader = RecordReader(self._dest, self._loads, written=lg.sync, keys=self._keys)
        self._reader.seed(lg.seq, self._open_lsn)  # every message is in the log open() began
        self._kept, self._kept_bytes = None, 0  # the open's enumeration took them (if it ran)
        self.restored = result

    def _rebuild(self, result: RestoreResult) -> None:
        """The messages as the restore left them, by LSN, expired ones dropped."""
        if result.skipped:
            raise CorruptLogError(f"{result.destination}: a queue cannot restore past damage ({result.skipped[0].reason})")
        first = result.next_lsn - result.records  # the LSN of the first record replayed
        now = self._clock()
        replayed = self._replayed
        assert replayed is not None
        for message_id in sorted(replayed):
            ordinal, expires_at, size = replayed[message_id]
            if expires_at is not None and expires_at <= now:
                continue
            entry = _Entry(message_id, first + ordinal, expires_at, size)
            self._entries[message_id] = entry
            self._ready.append(entry)
            self._bytes += size
        self._replayed = None  # restored: no longer needed
        self._open_lsn = result.next_lsn
        self._replay_start = (result.logs[0], first) if result.logs else None

    def _apply_batch(self, records: list[Any]) -> None:
        replayed = self._replayed
        assert replayed is not None, "a queue replays only while it opens"
        kept = self._kept
        assert kept is not None
        for r in records:
            ordinal = self._ordinal
            self._ordinal = ordinal + 1
            if type(r) is not dict:
                continue  # not a queue record; tolerate foreign writers
            op = r.get("op")
            message_id = r.get("id")
            if type(message_id) is not int:
                continue
            if op == "send":
                body = r.get("body")
                if type(body) is not bytes:
                    continue
                exp = r.get("exp")
                replayed[message_id] = (ordinal, float(exp) if isinstance(exp, (int, float)) else None, len(body))
                self._unkeep(message_id)
                if self._kept_bytes + len(body) <= KEEP_REPLAYED_BYTES:
                    kept[message_id] = r
                    self._kept_bytes += len(body)
                if message_id >= self._next_id:
                    self._next_id = message_id + 1
            elif op == "ack":
                replayed.pop(message_id, None)
                self._unkeep(message_id)
            elif op == "next" and message_id > self._next_id:
                self._next_id = message_id

    def _unkeep(self, message_id: int) -> None:
        assert self._kept is not None
        record = self._kept.pop(message_id, None)
        if record is not None:
            self._kept_bytes -= len(record["body"])

    # -- the enumeration ----------------------------------------------------------------

    def _enumerate(self, emit: Callable[[Any], None]) -> None:
        # Runs while no send or ack can log anything: in open(), before the queue is
        # handed out; in a rotation, with updates held (the log's quiet point) while the
        # caller whose update started it holds the queue's lock, and every other call
        # waits for that lock. So it reads and moves the entries without the lock.
        lsn = self._log.next_lsn if self._log is not None else self._open_lsn
        assert self._dest is not None and self._loads is not None
        reader = RecordReader(self._dest, self._loads, keys=self._keys)
        kept: dict[int, dict[str, Any]] = {}
        if self._log is None:
            # The open's: the records the restore kept go in as they are; the others
            # are read back from the logs the restore read.
            kept, self._kept, self._kept_bytes = self._kept or {}, None, 0
            if self._replay_start is not None:
                reader.seed(*self._replay_start)
                self._replay_start = None
        emit({"op": "next", "id": self._next_id})
        lsn += 1
        now = self._clock()
        for entry in list(self._entries.values()):
            if entry.expires_at is not None and entry.expires_at <= now:
                self._drop(entry)
                continue
            record = kept.get(entry.id)
            emit(record if record is not None else self._record(reader, entry))
            entry.lsn = lsn
            lsn += 1
        self._enumerated_to = lsn
        if self._reader is not None:
            self._reader.forget()  # every position moved to the new log

    def _record(self, reader: RecordReader, entry: _Entry) -> dict[str, Any]:
        """The send record of ``entry``, read back at its position and checked to be it."""
        try:
            record = reader.record(entry.lsn, entry.size)
        except RecordNotWritten:
            record = None
        if type(record) is not dict or record.get("op") != "send" or record.get("id") != entry.id:
            raise CorruptLogError(
                f"message {entry.id} is not at LSN {entry.lsn} (found {_describe(record)})",
                destination=reader.dest.url,
            )
        return record

    # -- the queue ----------------------------------------------------------------------

    @property
    def log(self) -> Log:
        """The queue's :class:`Log` (for ``stats()``, ``sync()``, its URL...)."""
        if self._log is None:
            raise RuntimeError("Queue is not open; use Queue.open(url) or Queue.open_in(log_set, key)")
        return self._log

    def send(self, body: bytes, ttl: float | None = None) -> int:
        """Append a message; returns its id once its record is written (per the log's
        durability mode). ``ttl`` (seconds; default the queue's ``ttl``) drops it
        undelivered after that long. :class:`QuotaExceeded` (expired messages dropped
        first), ``TypeError`` for a body that is not bytes and ``ValueError`` for one over
        the log's record limit (32 MiB): nothing written. Interrupted (``KeyboardInterrupt``)
        it may or may not be logged, as ``Log.update``: if it was, the queue holds it (it is
        delivered, and after a restart too)."""
        data = body if type(body) is bytes else _check_body(body)
        ttl = self.ttl if ttl is None else _check_ttl(ttl)
        with self._lock:
            lg = self._log or self.log  # (the property raises when not open)
            if self.max_messages is not None or self.max_bytes is not None:
                self._make_room(len(data))
            message_id = self._next_id
            record: dict[str, Any] = {"op": "send", "id": message_id, "body": data}
            expires_at = None
            if ttl is not None:
                expires_at = self._clock() + ttl
                record["exp"] = expires_at
            # The id is spent before the update: a send interrupted after its record was
            # appended (KeyboardInterrupt) must not give the same id to the next one.
            self._next_id = message_id + 1
            before, enumerated = lg.next_lsn, self._enumerated_to
            try:
                self._keep(message_id, lg.update(record), expires_at, len(data))
            except BaseException:
                # Kept all the same once appended: the log holds it, so the queue must
                # (a rotation copies what the queue holds, and would drop it).
                at = self._appended_at(lg, before, enumerated)
                if at is not None and message_id not in self._entries:
                    self._keep(message_id, at, expires_at, len(data))
                raise
            return message_id

    def _appended_at(self, lg: Log, before: int, enumerated: int) -> int | None:
        """The LSN of the record an update that raised appended, or None if it appended
        none: ``before`` was the log's next LSN when it began, and the queue's records
        are the only ones but those of a rotation's enumeration, which runs before the
        update's record (at the quiet point it is held at)."""
        start = before if self._enumerated_to == enumerated else self._enumerated_to
        return start if lg.next_lsn > start else None

    def _keep(self, message_id: int, lsn: int, expires_at: float | None, size: int) -> None:
        """A message just appended at ``lsn``, ready to deliver: whole or not at all, as
        only the last step (a C call) lets CPython run a signal handler after it."""
        entry = _Entry(message_id, lsn, expires_at, size)
        self._entries[message_id] = entry
        self._bytes += size
        self._ready.append(entry)

    def _make_room(self, size: int) -> None:
        if not self._over_quota(size):
            return
        self._expire(self._clock())
        if self._over_quota(size):
            raise QuotaExceeded(
                f"{self.log.url}: the queue holds {len(self._entries)} message(s) of {self._bytes} bytes; "
                f"with {size} more bytes it would pass its quota (max_messages={self.max_messages}, "
                f"max_bytes={self.max_bytes}); nothing was sent"
            )

    def _over_quota(self, size: int) -> bool:
        return (self.max_messages is not None and len(self._entries) >= self.max_messages) or (
            self.max_bytes is not None and self._bytes + size > self.max_bytes
        )

    def receive(self, visibility_timeout: float | None = None) -> Message | None:
        """The next message to deliver, its body read from the log; None when there is
        none. That is a delivered message whose visibility timeout ran out (the one that
        ran out first), else the oldest message not delivered yet; never one acknowledged
        or expired. It stays in the queue until :meth:`ack`: it is delivered again once
        ``visibility_timeout`` seconds pass (default: the queue's; None: not before a
        restart), and after a restart."""
        timeout = self.visibility_timeout if visibility_timeout is None else _check_visibility(
            "visibility_timeout", visibility_timeout)
        with self._lock:
            reader = self._reader
            if reader is None:
                raise RuntimeError("Queue is not open; use Queue.open(url) or Queue.open_in(log_set, key)")
            now = self._clock()
            while True:
                entry = self._timed_out(now) if self._timeouts else None
                again = entry is not None
                if entry is None:
                    entry = self._first_ready()
                    if entry is None:
                        return None
                if entry.expires_at is not None and entry.expires_at <= now:
                    self._take(again)
                    self._drop(entry)
                    continue
                record = self._record(reader, entry)  # raises with the entry still first
                self._take(again)
                if not again:
                    self._in_flight += 1
                if timeout is None:
                    entry.visible_at = math.inf
                else:
                    self._time_out(entry, now + timeout)
                return Message(entry.id, record["body"], entry.expires_at)

    def _time_out(self, entry: _Entry, at: float) -> None:
        entry.visible_at = at
        if self._timeouts is None:
            self._timeouts = []
        heapq.heappush(self._timeouts, (at, entry.id))

    def _timed_out(self, now: float) -> _Entry | None:
        """The delivered message whose timeout ran out first by ``now``, if any (first
        in ``_timeouts`` once stale pairs are dropped)."""
        timeouts = self._timeouts
        while timeouts:  # None or empty: nothing timed
            at, message_id = timeouts[0]
            entry = self._entries.get(message_id)
            if entry is None or entry.visible_at != at:
                heapq.heappop(timeouts)  # acknowledged, expired, or its timeout moved
                continue
            return entry if at <= now else None
        return None

    def _first_ready(self) -> _Entry | None:
        """The oldest message not delivered yet (first from ``_head``), if any."""
        ready, entries = self._ready, self._entries
        while self._head < len(ready):
            entry = ready[self._head]
            if entries.get(entry.id) is entry:
                return entry
            self._head += 1  # acknowledged (or expired) before it was delivered
        del ready[:]
        self._head = 0
        return None

    def _take(self, timed_out: bool) -> None:
        """Take out the entry :meth:`receive` found first (of ``_timeouts`` or ``_ready``)."""
        if timed_out:
            assert self._timeouts is not None
            heapq.heappop(self._timeouts)
            return
        self._head += 1
        if self._head == len(self._ready):
            self._ready.clear()  # every message delivered: hold none of them here
            self._head = 0
        elif self._head >= _COMPACT_AT and 2 * self._head >= len(self._ready):
            del self._ready[:self._head]
            self._head = 0

    def change_visibility(self, message_id: int, timeout: float) -> bool:
        """Deliver message ``message_id``, delivered and not yet visible again, again once
        ``timeout`` seconds from now pass (0: at the next :meth:`receive`); True. False,
        changing nothing, for a message that is not in flight: not delivered, its
        timeout already run out, acknowledged or expired. Writes nothing."""
        if type(message_id) is not int:
            raise TypeError(f"a message id is an int, not {type(message_id).__name__}")
        checked = _check_visibility("timeout", timeout)
        assert checked is not None
        with self._lock:
            entry = self._entries.get(message_id)
            now = self._clock()
            if entry is None or entry.visible_at is None or entry.visible_at <= now:
                return False
            if entry.expires_at is not None and entry.expires_at <= now:
                self._drop(entry)
                return False
            self._time_out(entry, now + checked)
            return True

    def ack(self, message_id: int) -> bool:
        """Acknowledge message ``message_id``: it is never delivered again once this
        returns True (its record is written per the durability mode). False, writing
        nothing, for an id the queue does not hold (acknowledged already, expired, never
        sent): an expired message is gone, whether it was delivered or not. A message may be acknowledged before it was received."""
        if type(message_id) is not int:
            raise TypeError(f"a message id is an int, not {type(message_id).__name__}")
        with self._lock:
            entry = self._entries.get(message_id)
            if entry is None:
                return False
            if entry.expires_at is not None and entry.expires_at <= self._clock():
                self._drop(entry)
                return False
            lg = self._log or self.log
            before, enumerated = lg.next_lsn, self._enumerated_to
            try:
                lg.update({"op": "ack", "id": message_id})
                self._drop(entry)
            except BaseException:
                # Dropped all the same once appended: a rotation would copy it back.
                if self._appended_at(lg, before, enumerated) is not None and message_id in self._entries:
                    self._drop(entry)
                raise
            return True

    def _drop(self, entry: _Entry) -> None:
        # The entry goes last (a dict deletion runs no handler): an interruption at this
        # call's start leaves it all to do again.
        self._bytes -= entry.size
        if entry.visible_at is not None:
            self._in_flight -= 1
        del self._entries[entry.id]

    def expire(self) -> int:
        """Drop every expired message now (delivered or not); returns how many. Expired
        messages are also dropped as :meth:`receive` reaches them, by a full quota, by a
        rotation and by a restart."""
        with self._lock:
            return self._expire(self._clock())

    def _expire(self, now: float) -> int:
        gone = [e for e in self._entries.values() if e.expires_at is not None and e.expires_at <= now]
        for entry in gone:
            self._drop(entry)
        return len(gone)

    def __len__(self) -> int:
        """Messages not acknowledged (delivered or not; expired ones until dropped)."""
        return len(self._entries)

    @property
    def pending_bytes(self) -> int:
        """Bytes of the bodies of the messages not acknowledged."""
        return self._bytes

    @property
    def in_flight(self) -> int:
        """Messages delivered and not acknowledged yet (those whose visibility timeout
        ran out included)."""
        return self._in_flight

    def rotate(self) -> None:
        """Start a new log now, holding just the messages not acknowledged (their bodies
        read back from the old log), and return once it is complete."""
        with self._lock:
            self.log.rotate()

    def sync(self) -> None:
        """Make every send and ack so far durable (fsync)."""
        self.log.sync()

    def close(self, rotate: bool = False) -> list[SecondaryLag]:
        """Close the log (``rotate=True`` first writes a new log holding just the queue).
        Delivery state is not kept: the next open delivers every message not
        acknowledged again."""
        with self._lock:
            lags = self._log.close(rotate=rotate) if self._log is not None else []
            if self._dest is not None:
                self._dest.close()
            return lags

    def __repr__(self) -> str:
        lg = self._log
        where = "not open" if lg is None else f"{lg.url!r} {'closed' if lg.closed else 'open'}"
        return f"<persistlog.Queue {where} {len(self._entries)} messages, {self._in_flight} in flight>"

    def __enter__(self) -> Queue:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _describe(record: Any) -> str:
    if record is None:
        return "no record"
    if type(record) is dict:
        return f"op {record.get('op')!r} id {record.get('id')!r}"
    return f"a {type(record).__name__}"


__all__ = ["Message", "Queue"]

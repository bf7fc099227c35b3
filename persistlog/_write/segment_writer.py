"""Putting framed batches of one log onto one destination, segment by segment.

Two strategies, picked by the destination's kind:

* :class:`AppendSegments` grows a local segment file by append, fsyncs on demand and rolls
  to a new segment at a size limit (syncing the old one first, so segments become durable
  in order);
* :class:`ObjectSegments` keeps batches in memory and writes each flush as a new immutable,
  create-only segment object, so an object store never sees an append or an overwrite.

:func:`fence_newest_log` is what a writer taking an object store over writes before it reads
anything: a fence segment at the name the writer before it would write next.

Both are used under the Log's I/O lock: no method here is called concurrently.

An exception that is not an ``OSError`` (a ``KeyboardInterrupt`` in the app's thread) can
stop an append between its I/O and its bookkeeping. Each writer then knows what it was
doing (``_appending``, ``_putting``) and settles it at its next call from what storage
really holds: an append that went through is counted, one that went half way is cut
back, and a PUT is made again with the same bytes (the one interrupted may still land,
its request going on in the client library's thread). ``append`` of a batch it holds
already does nothing (a record batch whose LSNs were appended, or the control batch
appended last), so the Log simply hands an interrupted batch over again. The chain head (:attr:`SegmentWriter.head`, what the next batch links
to) is part of that bookkeeping: it is always the hash of the last batch the writer holds,
whatever an interruption cut short.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from destinations import AppendFile, Destination

from .._errors import WriterConflict
from .._format import encoder
from .._format import constants as F
from .._format.chain import head_after, segment_version
from .._read.reader import last_segment_state, list_logs, newer_log

logger = logging.getLogger("persistlog")

#: How many times a writer taking an object store over looks again for the end of the
#: newest log when segments keep landing there before its fence does.
FENCE_ATTEMPTS = 10


def now_us() -> int:
    """Commit times: microseconds since the Unix epoch."""
    return time.time_ns() // 1000


def seal_batch(next_lsn: int, complete_lsn: int | None = None, chain: bytes | None = None,
               signed: dict[str, Any] | None = None) -> bytes:
    """The control batch that ends a log whose successor starts at ``next_lsn``;
    ``complete_lsn`` is where its ``complete`` record stands, if it has one; ``chain`` the
    log's chain head (None: the log is not chained); ``signed`` a signature of that head."""
    seal: dict[str, Any] = {"t": F.CONTROL_SEAL, "next_lsn": next_lsn}
    if complete_lsn is not None:
        seal[F.SEAL_COMPLETE_LSN] = complete_lsn
    if chain is not None:
        seal[F.SEAL_CHAIN] = chain
    if signed:
        seal.update(signed)
    return encoder.control_batch([seal], next_lsn, now_us(), chain)


def move_pointer(dest: Destination, seq: int) -> bool:
    """Point CURRENT at complete log ``seq``; False (logged) if that failed.

    CURRENT is a hint, so a failure is not fatal, but retention must wait for a move that
    succeeds (old logs go only once a newer complete log *and its pointer* are durable).
    The first log (seq 1) has no log before it, so nothing is ever deleted on the strength
    of its pointer, and a reader that finds that pointer missing or damaged after a power
    cut searches the logs and finds log 1: it is written without syncs
    (``replace_hint``), which saves a fresh log's open two of its fsyncs.
    """
    try:
        if seq == 1:
            dest.replace_hint(F.CURRENT_NAME, encoder.pointer(seq))
        else:
            dest.replace(F.CURRENT_NAME, encoder.pointer(seq))
    except OSError as e:
        logger.warning("could not move %s/CURRENT to log %d: %s", dest.url, seq, e)
        return False
    return True


def note_closed(dest: Destination, seq: int, next_lsn: int) -> None:
    """Write CLOSED: a clean close sealed log ``seq`` before ``next_lsn`` (docs/FORMAT.md).

    Readers take it as evidence that the newest log ended with its seal, so a newest log
    found later without its seal, ending before ``next_lsn``, lost its end: damage, not a
    crash's torn tail. A hint only: a failure to write it is logged, not raised; and it
    is written without syncs (``replace_hint``): a power cut that loses it, or leaves the
    one before it (which names another log) or a damaged one, leaves readers without that
    evidence, as a log closed by an older writer. It never claims more than is durable,
    because the seal it describes was synced before it was written.
    """
    try:
        dest.replace_hint(F.CLOSED_NAME, encoder.closed_note(seq, next_lsn))
    except OSError as e:
        logger.warning("could not write %s/%s after sealing log %d: %s", dest.url, F.CLOSED_NAME, seq, e)


def fence_newest_log(dest: Destination, writer_id: str) -> str | None:
    """Make the newest log at an object store impossible to continue; returns the name of
    the fence segment written (None when the newest log needs none, or there is no log).

    Called by a writer that has just taken the destination's lease, before it reads what
    is there. The writer that held the lease before (stopped, or cut off, past its lease)
    may still be about to PUT the next segment of its log, and segment objects are written
    create-only: a fence segment (docs/FORMAT.md) created at exactly that name makes that
    PUT fail with ``FileExistsError``, which fails the other writer's Log instead of
    acknowledging anything. If the other writer's segment lands first, the fence goes
    after it, and the restore that follows reads it. A log ended already (sealed, or
    fenced) takes nothing more; a sealed log's writer created its next log before
    sealing it, so a listing after the seal was read shows that log if there is one.
    """
    for _ in range(FENCE_ATTEMPTS):
        logs = list_logs(dest)
        if not logs:
            return None
        seq = max(logs)
        segments = logs[seq]
        st = last_segment_state(dest, seq, segments)
        if st.sealed or st.fence is not None:
            now = list_logs(dest)
            if not now or max(now) == seq:
                return None
            continue  # the writer before rotated meanwhile: fence its new log
        assert st.next_lsn is not None  # a strict scan read the segment's header
        number = segments[-1][0] + 1
        name = F.segment_name(seq, number)
        try:
            dest.create(name, encoder.fence_segment(seq, number, st.next_lsn, writer_id, now_us(), st.chain_head,
                                                     st.version))
        except FileExistsError:
            continue  # the other writer's segment landed first: fence after it
        logger.info("fenced log %d at %s with %s: a writer before this one can add nothing to it", seq, dest.url, name)
        return name
    raise WriterConflict(
        f"segments kept landing in the newest log at {dest.url} while this writer fenced it: another writer is active"
    )


class SegmentWriter:
    """The writing end of one log at one destination."""

    # Slots, not a __dict__: an open Log holds one (a broker, thousands of Logs).
    __slots__ = ("dest", "seq", "segment_bytes", "segment", "bytes_written", "sealed", "next_lsn", "_seal_written",
                 "version", "head", "_last_control")

    def __init__(self, dest: Destination, seq: int, segment_bytes: int) -> None:
        self.dest = dest
        self.seq = seq
        self.segment_bytes = segment_bytes
        self.segment = -1
        self.bytes_written = 0
        self.sealed = False
        self.next_lsn = 0  # the first LSN not appended yet
        self._seal_written = False
        self.version = F.FORMAT_VERSION  # of its segments: that of its header batch
        #: The chain head after the last batch this writer holds (the seal aside): what
        #: the next batch links to. None: the log is not chained.
        self.head: bytes | None = None
        # The last batch appended, if it was a control batch (it takes no LSN): the very
        # batch handed over again after an interruption is not appended twice.
        self._last_control: bytes | None = None

    def holds(self, data: bytes, first_lsn: int, next_lsn: int) -> bool:
        """Whether ``data`` (covering ``[first_lsn, next_lsn)``) was appended already: a
        record batch whose LSNs it holds, or the control batch it appended last."""
        return first_lsn < self.next_lsn or (first_lsn == next_lsn and data is self._last_control)

    def start(self, first_lsn: int, header_batch: bytes) -> None:
        """Create segment 0 holding the log header; durable when this returns."""
        raise NotImplementedError

    def append(self, data: bytes, first_lsn: int, next_lsn: int) -> None:
        """Add batches covering LSNs ``[first_lsn, next_lsn)``; nothing if they were added
        already."""
        raise NotImplementedError

    def flush(self) -> None:
        """Hand what was appended to the storage (the OS, or a PUT)."""

    @property
    def holds_pending(self) -> bool:
        """Whether appended bytes wait in this writer for a :meth:`flush` (an object
        store's segment object not yet PUT)."""
        return False

    def sync(self) -> None:
        """Make everything appended durable."""
        raise NotImplementedError

    def seal(self, seal_batch: bytes) -> None:
        """Write the seal batch and trailer, durably, and close."""
        raise NotImplementedError

    def confirm(self) -> None:
        """Check that what was written is in a log a restore reads: raise
        ``FileExistsError`` if another writer took the destination over meanwhile and its
        retention may have deleted this log (with the fence in it) before a write landed.
        Nothing to check where the writer's lock cannot be taken over (a local OS lock)."""

    def close(self) -> None:
        """Let go of handles without sealing (the log stays open-ended)."""


class AppendSegments(SegmentWriter):
    __slots__ = ("_file", "_size", "_appending")

    def __init__(self, dest: Destination, seq: int, segment_bytes: int) -> None:
        super().__init__(dest, seq, segment_bytes)
        self._file: AppendFile | None = None
        self._size = 0
        # An append under way: (segment size before it, its bytes, next LSN after it,
        # whether it is the seal, the chain head after it, the control batch it is).
        self._appending: tuple[int, int, int, bool, bytes | None, bytes | None] | None = None

    def _open_segment(self, number: int, first_lsn: int, first_batch: bytes = b"") -> None:
        name = F.segment_name(self.seq, number)
        head = encoder.segment_header(self.seq, number, first_lsn, self.version)
        self.dest.create(name, head + first_batch)
        self._file = self.dest.open_append(name)
        self._size = len(head) + len(first_batch)
        self.segment = number
        self.bytes_written += self._size

    def start(self, first_lsn: int, header_batch: bytes) -> None:
        self.version = segment_version(header_batch)
        self._open_segment(0, first_lsn, header_batch)
        self.next_lsn = first_lsn
        self.head = head_after(header_batch)

    def _settle(self) -> None:
        """Count an interrupted append that went through; cut one that went half way."""
        appending = self._appending
        if appending is None:
            return
        assert self._file is not None
        before, n, next_lsn, seal, head, control = appending
        size = self._file.size
        if size == before + n:
            self._size = size
            self.bytes_written += n
            self.next_lsn = next_lsn
            self._seal_written = seal
            self.head = head
            self._last_control = control
            self._appending = None
            return
        if size != before:
            self._file.truncate(before)
        self._appending = None

    def _write(self, data: bytes, next_lsn: int, head: bytes | None, control: bytes | None,
               seal: bool = False) -> None:
        assert self._file is not None
        n = len(data)
        before = self._size
        self._appending = (before, n, next_lsn, seal, head, control)
        self._file.write(data)
        # Bookkeeping without a call in between: an interruption lands before or after.
        self._size = before + n
        self.bytes_written += n
        self.next_lsn = next_lsn
        self._seal_written = seal
        self.head = head
        self._last_control = control
        self._appending = None

    def append(self, data: bytes, first_lsn: int, next_lsn: int) -> None:
        self._settle()
        if self.holds(data, first_lsn, next_lsn):
            return  # an interrupted caller hands the batch over again
        if self._size >= self.segment_bytes:
            self._roll(first_lsn)
        self._write(data, next_lsn, head_after(data), data if first_lsn == next_lsn else None)

    def _roll(self, first_lsn: int) -> None:
        """Continue in a new segment; the full one is synced first (durable in order)."""
        old = self._file
        assert old is not None
        old.sync()
        number = self.segment + 1
        name = F.segment_name(self.seq, number)
        head = encoder.segment_header(self.seq, number, first_lsn, self.version)
        try:
            self.dest.create(name, head)
        except FileExistsError:
            # An interrupted roll-over made it: it holds the header only. Made again, so
            # that its directory entry is durable for sure.
            if self.dest.read(name) != head:
                raise
            self.dest.delete(name)
            self.dest.create(name, head)
        new = self.dest.open_append(name)
        n = len(head)
        self._file = new
        self._size = n
        self.segment = number
        self.bytes_written += n
        old.close()

    def flush(self) -> None:
        self._settle()
        if self._file is not None:
            self._file.flush()

    def sync(self) -> None:
        self._settle()
        if self._file is not None:
            self._file.sync()

    def seal(self, seal_batch: bytes) -> None:
        assert self._file is not None
        self._settle()
        if not self._seal_written:
            # The seal links to the head and leaves it where it is.
            self._write(seal_batch + encoder.seal_trailer(self._size), self.next_lsn, self.head, None, seal=True)
        self._file.sync()
        self.sealed = True
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class ObjectSegments(SegmentWriter):
    __slots__ = ("_pending", "_pending_first_lsn", "_appending", "_putting", "_confirmed")

    def __init__(self, dest: Destination, seq: int, segment_bytes: int) -> None:
        super().__init__(dest, seq, segment_bytes)
        self._pending: list[bytes] = []
        self._pending_first_lsn = 0
        # An append under way: (pending batches before it, next LSN after it, the chain
        # head after it, the control batch it is).
        self._appending: tuple[int, int, bytes | None, bytes | None] | None = None
        # A PUT under way: (segment number, its bytes, pending batches it holds, seal).
        self._putting: tuple[int, bytes, int, bool] | None = None
        # Whether confirm() ran since the last segment of this writer landed.
        self._confirmed = True

    def _settle(self) -> None:
        appending = self._appending
        if appending is not None:
            if len(self._pending) > appending[0]:
                _, self.next_lsn, self.head, self._last_control = appending
            self._appending = None
        putting = self._putting
        if putting is not None:
            # The interrupted PUT may not have landed yet, and land later: the client
            # library's request goes on in its own thread once the caller is interrupted.
            # So it is made again, the same bytes at the same name, create-only: what is
            # there with these bytes is this PUT landed, anything else another writer's.
            number, data, count, seal = putting
            self._create(number, data, again=True)
            self._put_done(number, len(data), count, seal)

    def _put(self, extra: bytes = b"", trailer: bool = False) -> None:
        number = self.segment + 1
        head = encoder.segment_header(self.seq, number, self._pending_first_lsn, self.version)
        count = len(self._pending)
        body = b"".join(self._pending)
        tail = b""
        if trailer:
            tail = extra + encoder.seal_trailer(len(head) + len(body))
        elif extra:
            body += extra
        data = head + body + tail
        self._putting = (number, data, count, trailer)
        self._create(number, data)
        self._put_done(number, len(data), count, trailer)

    def _create(self, number: int, data: bytes, again: bool = False) -> None:
        """PUT segment ``number``, create-only. A segment there already is another
        writer's (``FileExistsError``), unless the PUT is made ``again`` and the object
        holds these very bytes: the interrupted PUT, landed."""
        name = F.segment_name(self.seq, number)
        try:
            self.dest.create(name, data)
        except FileExistsError as e:
            if again:
                try:
                    if self.dest.read(name) == data:
                        return
                except FileNotFoundError:
                    pass
            raise FileExistsError(f"{self.dest.url}/{name} exists already") from e

    def _put_done(self, number: int, size: int, count: int, seal: bool) -> None:
        # Bookkeeping without a call in between: done whole, or not at all and redone.
        self._putting = None
        self._confirmed = False
        del self._pending[:count]
        self.segment = number
        self.bytes_written += size
        self._seal_written = seal
        self._pending_first_lsn = self.next_lsn if not self._pending else self._pending_first_lsn

    def start(self, first_lsn: int, header_batch: bytes) -> None:
        self.version = segment_version(header_batch)
        self._pending_first_lsn = self.next_lsn = first_lsn
        self._pending = [header_batch]
        self._put()
        self.head = head_after(header_batch)

    def append(self, data: bytes, first_lsn: int, next_lsn: int) -> None:
        self._settle()
        if self.holds(data, first_lsn, next_lsn):
            return  # an interrupted caller hands the batch over again
        if not self._pending:
            self._pending_first_lsn = first_lsn
        head = head_after(data)
        control = data if first_lsn == next_lsn else None
        self._appending = (len(self._pending), next_lsn, head, control)
        self._pending.append(data)
        # Bookkeeping without a call in between: an interruption lands before or after.
        self.next_lsn = next_lsn
        self.head = head
        self._last_control = control
        self._appending = None

    @property
    def pending_bytes(self) -> int:
        return sum(len(p) for p in self._pending)

    @property
    def holds_pending(self) -> bool:
        return bool(self._pending)

    def flush(self) -> None:
        self._settle()
        if self._pending:
            self._put()

    def sync(self) -> None:
        """PUT what is pending, and :meth:`confirm` every segment PUT so far."""
        self.flush()
        self.confirm()

    def seal(self, seal_batch: bytes) -> None:
        self._settle()
        if not self._seal_written:
            if not self._pending:
                self._pending_first_lsn = self.next_lsn
            self._put(seal_batch, trailer=True)
        self.sealed = True

    def confirm(self) -> None:
        """Raise ``FileExistsError`` if a log newer than this one is at the destination.

        The fence (``fence_newest_log``) makes a paused writer's next PUT fail only while it
        is there, and the writer that wrote it deletes it with the whole log once it has a
        newer complete log (retention): a PUT after that lands, create-only, in a log no
        restore reads. A newer log is there from before that deletion on (retention keeps
        the newest complete log), so a listing after the PUTs that shows none proves each
        of them landed before the deletion, where the writer that fenced this log read it
        or its fence stopped it. One listing covers every PUT before it; none runs when
        nothing landed since the last.
        """
        if self._confirmed:
            return
        newer = newer_log(self.dest, self.seq)
        if newer is not None:
            raise FileExistsError(
                f"{self.dest.url} holds log {newer}, newer than log {self.seq} this writer writes: "
                f"another writer took over, and what this one wrote since may be in no log a restore reads"
            )
        self._confirmed = True


def segment_writer(dest: Destination, seq: int, segment_bytes: int) -> SegmentWriter:
    cls = AppendSegments if dest.appendable else ObjectSegments
    return cls(dest, seq, segment_bytes)

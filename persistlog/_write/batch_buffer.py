"""The batch buffer: records encoded and numbered, waiting to become a batch, and the cut rule.

A :class:`BatchBuffer` holds the records appended since the last batch, encoded one after
another into one growing buffer (a CBOR sequence, which saves a bytes object per record),
and the LSN counter. It touches no storage: the batch writer (``_write.batch_writer``) takes
what it holds with :meth:`BatchBuffer.detach` and frames it into a batch.

The cut rule says when the call that appended a record hands its batch over itself
(:meth:`BatchBuffer.hand_over_due`): a full batch (``batch_bytes``, lowered by the
rotator to the bytes a size trigger leaves), or the cut LSN (every record in ``flush``
and ``fsync`` modes; in ``buffered`` mode the record-count trigger's LSN, so that a
trigger is seen after the batch that crosses it).

Its lock (``_lock``) guards the buffer and the LSN counter; an append holds it for one
encode and nothing more. Interruptions: records leave the buffer in one step into
``taking`` (detached, not yet with the segment writer), which the writer hands over
again until the segment writer has it; whatever an interrupted encode left in the buffer
past ``_pos`` is cut before the next append (``_blocked`` sends it down the slow path,
:meth:`BatchBuffer._unblock`). A buffer that refuses appends (its log failed or closed)
stays blocked, and the slow path raises the log's error.

Where the C accelerator is built, the fields an append touches and the lock are those of
the base type ``_cbor_json.Staging`` (a pure Python base, ``_Staging``, elsewhere), and
:attr:`BatchBuffer.fast_stage` is its ``_stage_fast``: :meth:`BatchBuffer.stage`'s usual
case in one C call, which lets the lock go before any error propagates and calls
:meth:`BatchBuffer.stage` for the rest. Every other method is the same Python on both.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from .._format import constants as F
from .._format.codec import Codec, array_header_len, check_depth, encode_error, records_list

_MAX_RECORD = F.MAX_RECORD_BYTES
_MAX_DEPTH = F.MAX_RECORD_DEPTH
#: Record bytes one batch may hold, leaving room for a kind bitmap (at most 1/8 of them).
BATCH_FILL = F.MAX_BATCH_BYTES // 9 * 8
# A cut LSN no record reaches: the record-count cut is off.
NEVER = 1 << 62
#: A batch bigger than this, or one holding snapshot records, lets the buffer's encoder
#: and buffer go when it is detached (the next append makes new ones, about 1.5 us):
#: cbor2's encoder keeps a buffer as big as the largest record it encoded, so a Log idle
#: after a big record would hold that much for good (a thousand logs after one 1 MiB
#: record each: 1 GB), and one idle since its enumeration some 900 bytes.
KEEP_ENCODER_BYTES = 1024

#: Records detached for a batch: (payload, snapshot runs, first LSN, next LSN). The snapshot
#: records are given as runs of offsets from the first LSN, ``[start, end, start, end...]``
#: (an enumeration's records are one run, whatever their number).
Taking = tuple[bytes, list[int], int, int]


def snapshot_count(runs: list[int]) -> int:
    """The records that snapshot runs (:data:`Taking`) hold."""
    return sum(runs[1::2]) - sum(runs[0::2])


def snapshot_offsets(runs: list[int]) -> Sequence[int]:
    """The offsets that snapshot runs (:data:`Taking`) hold, in order."""
    if len(runs) == 2:
        return range(runs[0], runs[1])
    return [i for start, end in zip(runs[::2], runs[1::2]) for i in range(start, end)]


def too_large(n: int) -> ValueError:
    return ValueError(f"record of {n} bytes exceeds the {_MAX_RECORD}-byte limit")


class _Staging:
    """The fields an append touches and the buffer's lock, where the C accelerator is not
    built (there, ``_cbor_json.Staging`` holds them, and adds ``_stage_fast``)."""

    __slots__ = ("_lock", "_enc_encode", "_pos", "_first", "_snap", "_blocked", "_next_lsn", "_batch_bytes", "_cut_lsn")

    _lock: threading.Lock
    _enc_encode: Callable[[Any], int]
    _pos: int
    _first: int
    _snap: list[int] | None
    _blocked: bool
    _next_lsn: int
    _batch_bytes: int
    _cut_lsn: int

    def __init__(self, max_record: int) -> None:
        self._lock = threading.Lock()


try:
    from .._cbor_json import Staging as _CStaging
    from .._cbor_json import encode_subset as _encode_subset
except ImportError:  # built without a C compiler (or before the type existed)
    _CStaging = None
    _encode_subset = None
if TYPE_CHECKING:
    _Base = _Staging
else:
    _Base = _CStaging or _Staging


class BatchBuffer(_Base):
    """Records appended and not yet detached for a batch, their LSNs, and the cut rule."""

    __slots__ = ("_codec", "_fp", "_refusal", "_full", "_eager", "_taking", "_taking_batch")

    def __init__(self, codec: Codec, next_lsn: int, batch_bytes: int, eager: bool) -> None:
        """An empty buffer whose first record gets ``next_lsn``; batches of ``batch_bytes``;
        with ``eager`` (``flush`` and ``fsync`` modes) every call hands its batch over."""
        super().__init__(_MAX_RECORD)
        self._codec = codec
        # Made at the first append: a log that is never written holds no buffer.
        self._fp: io.BytesIO | None = None
        self._enc_encode = self._start_encoder  # returns the buffer's new end
        self._pos = 0  # the end of the last whole record
        self._first = next_lsn  # the LSN of the buffer's first record
        self._snap = None  # snapshot records' runs of offsets from _first (see Taking)
        self._blocked = False  # refusing or interrupted: the slow path sorts it out
        self._refusal: Callable[[], None] | None = None  # raises the log's failed/closed error
        self._next_lsn = next_lsn
        self._full = batch_bytes
        self._batch_bytes = batch_bytes
        self._eager = eager
        self._cut_lsn = 0 if eager else NEVER
        self._taking: Taking | None = None
        self._taking_batch: bytes | None = None

    # -- appending ------------------------------------------------------------------------

    @property
    def accelerated(self) -> bool:
        """Whether :attr:`fast_stage` is the C one."""
        return _CStaging is not None

    def stage(self, record: Any, snapshot: bool = False) -> int | tuple[int] | bytes:
        """Encode one record into the buffer, touching no storage. Returns its LSN; or
        ``(lsn,)`` when the call must hand the batch over (:meth:`hand_over_due`); or the
        record's bytes when they must go through :meth:`append_encoded` (a big record, or
        a buffer grown past a record's limit).

        The hot path of ``Log.update()`` and ``AsyncLog.update()`` (through
        :attr:`fast_stage`; where the accelerator is built, its slow path): one encode
        inside a short critical section, the cut rule inlined (it is
        :meth:`hand_over_due`'s), and in the usual case a plain int returned (no tuple to
        build and take apart).
        """
        with self._lock:
            if self._blocked:
                self._unblock()
            try:
                end = self._enc_encode(record)
            except BaseException as e:
                self._blocked = True  # what was encoded of it is cut before the next append
                if isinstance(e, Exception):
                    self._encode_failed(e)
                raise
            if end > _MAX_RECORD:
                self._blocked = True  # cut by the next append if interrupted from here
                return self._take_back(self._pos, end)
            self._pos = end
            lsn = self._next_lsn
            if snapshot:
                self._add_snapshots(lsn - self._first, 1)
                self._next_lsn = lsn + 1
                return (lsn,) if end >= self._batch_bytes else lsn
            self._next_lsn = lsn + 1
        return (lsn,) if end >= self._batch_bytes or lsn >= self._cut_lsn else lsn

    #: The callable ``Log.update()``, ``AsyncLog.update()`` and ``BatchWriter.emit`` stage a
    #: record with: :meth:`stage`, as one C call (lock, encode, end and LSN, cut rule) where
    #: the accelerator is built, which takes :meth:`stage` for every other case.
    fast_stage: Callable[..., int | tuple[int] | bytes] = _CStaging._stage_fast if _CStaging is not None else stage

    def stage_many(self, n: int, body: memoryview, snapshot: bool = False) -> tuple[int, bool] | None:
        """Append ``n`` records encoded by :meth:`encode_many`, touching no storage: (the
        last LSN, whether the call hands the batch over), or None when they do not fit
        beside what is buffered."""
        with self._lock:
            if self._blocked:
                self._unblock()
            end = self._pos + len(body)
            if len(body) > _MAX_RECORD or end > BATCH_FILL:
                return None
            fp = self._fp if self._fp is not None else self._buffer()
            self._blocked = True
            fp.write(body)
            self._pos = end
            if snapshot:
                self._add_snapshots(self._next_lsn - self._first, n)
            self._next_lsn += n
            self._blocked = self._refusal is not None
            lsn = self._next_lsn - 1
        return lsn, self.hand_over_due(lsn, end, snapshot)

    def append_encoded(
        self, records: list[bytes], snapshot: bool, whole: bool, make_room: Callable[[], None]
    ) -> tuple[int, bool]:
        """Append encoded records, cutting batches so none exceeds the format's limit.

        The slow path for big records and big calls: returns (last LSN, whether the call
        hands the batch over). Nothing is appended if any record is over the size limit.
        ``make_room()`` turns what is buffered into a batch (storage work). With ``whole``
        the records go into one batch (the caller checked they fit in one): what is
        buffered is written first if they do not fit beside it.
        """
        for data in records:
            if len(data) > _MAX_RECORD:
                raise too_large(len(data))
        need = sum(map(len, records)) if whole else 0
        lsn = end = 0
        i = 0
        while i < len(records):
            with self._lock:
                if self._blocked:
                    self._unblock()
                end = self._pos
                room = end == 0 or end + need <= BATCH_FILL
                fp = self._fp if self._fp is not None else self._buffer()
                self._blocked = True  # until the records written below are all counted
                while room and i < len(records) and (end == 0 or end + len(records[i]) <= BATCH_FILL):
                    size = len(records[i])
                    fp.write(records[i])
                    end += size
                    self._pos = end
                    if snapshot:
                        self._add_snapshots(self._next_lsn - self._first, 1)
                    self._next_lsn += 1
                    i += 1
                lsn = self._next_lsn - 1
                self._blocked = self._refusal is not None
            if i < len(records):
                make_room()
        return lsn, self.hand_over_due(lsn, end, snapshot)

    def encode(self, record: Any) -> bytes:
        """One record's bytes, apart from the buffer."""
        return self._codec.encode(record)

    def encode_many(self, records: Iterable[Any]) -> tuple[list[Any], memoryview]:
        """The records of an ``update_many()`` (or a chunk of ``emit.many()``'s) as a list,
        and their encoded bytes one after another; raises before anything is appended."""
        items = records_list(records, "update_many()", "update()")
        # One encoder call for the whole list is much cheaper than one per record: encode
        # it as an array and keep only the items (the array header is 1-9 bytes long).
        # The list is one level more than its records.
        encoded = _encode_subset(items, _MAX_DEPTH + 1) if _encode_subset is not None else None
        if encoded is None:
            check_depth(items, limit=_MAX_DEPTH + 1)
            try:
                encoded = self._codec.encode(items)
            except Exception as e:
                raise encode_error(e) from None
        body = memoryview(encoded)[array_header_len(len(items)):]
        if len(body) > BATCH_FILL:
            # One batch is what a crash keeps or drops whole: a bigger call could be torn.
            raise ValueError(
                f"update_many() of {len(body)} bytes exceeds the {BATCH_FILL} bytes one batch "
                "holds; split it into smaller calls"
            )
        return items, body

    # -- the cut rule ---------------------------------------------------------------------

    def hand_over_due(self, lsn: int, end: int, snapshot: bool = False) -> bool:
        """The cut rule: whether the call that appended up to ``lsn`` (``end`` bytes
        buffered) hands the batch over itself: a full batch, or for updates the cut LSN
        (in ``flush`` and ``fsync`` modes every call's). :meth:`stage` inlines it."""
        return end >= self._batch_bytes or (not snapshot and lsn >= self._cut_lsn)

    def cut_batches_at(self, left: int | None) -> None:
        """Hand batches over once they hold ``left`` bytes (what the size trigger leaves in
        this log, at most ``batch_bytes``; None: whole batches)."""
        full = self._full
        self._batch_bytes = full if left is None else max(1, min(full, left))

    def cut_at_lsn(self, lsn: int) -> None:
        """Have updates hand their batch over at ``lsn`` (the record-count trigger's; in
        ``flush`` and ``fsync`` modes every batch is handed over at once anyway)."""
        if not self._eager:
            self._cut_lsn = lsn

    # -- taking records out ---------------------------------------------------------------

    @property
    def next_lsn(self) -> int:
        """The LSN the next record appended gets."""
        return self._next_lsn

    @property
    def pending(self) -> bool:
        """Whether records wait in the buffer, or detached for a batch not handed over."""
        return self._pos > 0 or self._taking is not None

    @property
    def taking(self) -> Taking | None:
        """The records detached for a batch that the segment writer may not hold yet."""
        return self._taking

    def detach(self) -> bool:
        """Move every whole record into :attr:`taking` in one step and empty the buffer;
        False if it holds none."""
        with self._lock:
            if not self._pos:
                return False
            fp = self._fp
            assert fp is not None
            payload = fp.getvalue()
            if len(payload) != self._pos:
                payload = payload[: self._pos]  # an interrupted encode's leftovers
            taking = (payload, self._snap or [], self._first, self._next_lsn)
            # Out of the buffer and into _taking in one step, then the buffer is cleared
            # (the slow path clears it if this is interrupted).
            self._taking = taking
            self._blocked = True
            self._pos = 0
            self._snap = None
            self._first = taking[3]
            if len(payload) > KEEP_ENCODER_BYTES or taking[1]:
                self._fp = None
                self._enc_encode = self._start_encoder
            else:
                self._rewind(0)
            self._blocked = self._refusal is not None
            return True

    def framed(self, frame: Callable[[Taking], bytes]) -> bytes:
        """The batch of the detached records: ``frame(taking)``, made once and kept until
        :meth:`handed_over` (a hand-over interrupted is retried with the same bytes)."""
        data = self._taking_batch
        if data is None:
            taking = self._taking
            assert taking is not None
            data = self._taking_batch = frame(taking)
        return data

    def handed_over(self) -> None:
        """The segment writer holds the detached records."""
        self._taking = None
        self._taking_batch = None

    # -- refusing -------------------------------------------------------------------------

    def refuse(self, refusal: Callable[[], None], mark: Callable[[], None] | None = None) -> None:
        """Refuse every later append: each raises through ``refusal()`` (the log failed or
        closed). ``mark()``, if given, runs under the lock first: an append either went in
        before it, or is refused."""
        if mark is None:
            self._refusal = refusal
            self._blocked = True
            return
        with self._lock:
            mark()
            self._refusal = refusal
            self._blocked = True

    # -- inside ---------------------------------------------------------------------------

    def _add_snapshots(self, offset: int, n: int) -> None:
        """The ``n`` records from ``offset`` (from ``_first``) are snapshot records: they
        join the runs (holds ``_lock``; a run that ends there grows)."""
        runs = self._snap
        if runs is None:
            self._snap = [offset, offset + n]
        elif runs[-1] == offset:
            runs[-1] = offset + n
        else:
            runs += (offset, offset + n)

    def _buffer(self) -> io.BytesIO:
        """The buffer, made at the first append (holds ``_lock``)."""
        fp = self._fp = io.BytesIO()
        return fp

    def _start_encoder(self, record: Any) -> int:
        """The first append: make the buffer and its streaming encoder, then encode."""
        fp = self._fp if self._fp is not None else self._buffer()
        self._enc_encode = self._codec.record_encoder(fp)
        return self._enc_encode(record)

    def _encode_failed(self, e: Exception) -> NoReturn:
        """Raise the error an encoder's ``e`` means to the app (``TypeError``...)."""
        raise encode_error(e) from None

    def _unblock(self) -> None:
        """The slow path of an append (holds ``_lock``): raise if refusing, else cut what an
        interruption left past ``_pos`` and take the fast path again."""
        refusal = self._refusal
        if refusal is not None:
            refusal()
        self._rewind(self._pos)
        # refuse() sets _refusal before _blocked: whichever order this runs in, it stays set.
        self._blocked = self._refusal is not None

    def _rewind(self, pos: int) -> None:
        """Drop a partly encoded record (or call) so nothing of it is ever written."""
        fp = self._fp
        if fp is not None:
            fp.seek(pos)
            fp.truncate()

    def _take_back(self, pos: int, end: int) -> bytes:
        """The bytes of a record just encoded at ``pos``, removed from the buffer."""
        fp = self._fp
        assert fp is not None
        data = fp.getvalue()[pos:end]
        self._rewind(pos)
        return data


__all__ = [
    "BATCH_FILL", "KEEP_ENCODER_BYTES", "NEVER", "BatchBuffer", "Taking", "snapshot_count", "snapshot_offsets", "too_large",
]

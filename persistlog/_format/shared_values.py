"""Values shared across the records of a log (format version 3; docs/FORMAT.md, "Shared
values").

A large string or byte string that several records of a log hold (the same message queued
for a thousand subscribers) is stored once per log: the batch that first holds it *defines*
it, and every later batch of the log refers to it by number. The sharing is a byte-level
substitution below CBOR, so every record reads back exactly as it was logged and no reader
above the decoder sees it.

Writing: :class:`SharedValues` (a ``BatchWriter``'s part) keeps the values its current log
defined and the *hints* of the snapshot records staged and not yet in a batch: for each
large string, in the order their encoding holds them, its first bytes as CBOR and its
length (no copy). Framing a batch (:meth:`SharedValues.share`) finds each hinted value in
the batch's payload and turns the payload into a shared-values stream. A hint that is
missing, stale or found at the wrong place costs compression, never correctness: a
reference replaces bytes only with bytes equal to them.

Reading: :class:`ValueTable` holds what a log defined up to the position a scan reached
(``LogScanner`` keeps one per log and primes it from the log's start when it starts in the
middle; followers and readers hand it from one scan to the next). ``decoder`` expands the
stream.
"""

from __future__ import annotations

import operator
from collections import deque
from hashlib import sha256
from collections.abc import Sequence
from itertools import compress
from typing import Any

from . import constants as F

try:
    from .._cbor_json import record_bounds as _record_bounds
except ImportError:  # no C accelerator: every record is walked
    _record_bounds = None

_MIN = F.SHARED_MIN_BYTES
#: Hint calls in a row without a large value after which only one in QUIET_STRIDE is looked at.
QUIET_CALLS = 4
QUIET_STRIDE = 64


def _head(major: int, n: int) -> bytes:
    """The CBOR head of a string of ``n`` bytes (``major`` 0x40 bytes, 0x60 text)."""
    if n < 24:
        return bytes((major | n,))
    if n < 0x100:
        return bytes((major | 24, n))
    if n < 0x10000:
        return bytes((major | 25, n >> 8, n & 0xFF))
    if n < 0x100000000:
        return bytes((major | 26,)) + n.to_bytes(4, "big")
    return bytes((major | 27,)) + n.to_bytes(8, "big")


#: A hint: the first bytes of a large value's CBOR item (head included) and its length.
Hint = tuple[bytes, int]
_KEY = 16


class _Collector:
    """Collects a hint for each large string and byte string of records, in the order an
    encoder writes them (dict values in order, list and tuple items in order). A hint holds
    no copy of the value: framing finds the value in the batch by its first bytes and
    takes it from there. One value object met again (the same message queued for many
    subscribers) gives the same hint again."""

    __slots__ = ("out", "seen")

    def __init__(self) -> None:
        self.out: list[Hint] = []
        self.seen: dict[int, Hint] = {}  # id of a value object alive during the walk -> its hint

    def walk(self, value: Any) -> None:
        t = type(value)
        if t is dict:
            items = value.values()
        elif t is list or t is tuple:
            items = value
        else:
            if (t is str or t is bytes) and len(value) >= _MIN - 5:
                self.leaf(value)
            return
        for v in items:
            tv = type(v)
            if tv is str or tv is bytes:
                if len(v) >= _MIN - 5:
                    hint = self.seen.get(id(v))
                    if hint is None:
                        self.leaf(v)
                    else:
                        self.out.append(hint)
            elif tv is dict or tv is list or tv is tuple:
                self.walk(v)

    def leaf(self, v: str | bytes) -> None:
        if isinstance(v, str):
            n = len(v) if v.isascii() else len(v.encode("utf-8", "surrogatepass"))
            head = _head(0x60, n)
            start = v[:_KEY].encode("utf-8", "surrogatepass")
        else:
            n = len(v)
            head = _head(0x40, n)
            start = bytes(v[:_KEY])
        size = len(head) + n
        if size >= _MIN:
            hint = ((head + start)[:_KEY], size)
            self.seen[id(v)] = hint
            self.out.append(hint)


def large_values(records: Sequence[Any]) -> list[Hint]:
    """Hints of the large strings and byte strings in ``records``, in order."""
    c = _Collector()
    for r in records:
        c.walk(r)
    return c.out


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class SharedValues:
    """The values a writer's current log defined, and the hints of the records buffered.

    Owned by the ``BatchWriter``; every method runs under its ``io_lock`` (hints are given
    while the records are staged under it, so that no batch is framed in between)."""

    __slots__ = ("_values", "_ids", "_bytes", "_hints", "_mark", "_quiet", "_skip")

    def __init__(self) -> None:
        # The values defined, by their SHA-256 (a writer keeps no copy of a value: a log
        # may define 32 MiB of them, and a process may hold thousands of logs), in order.
        self._values: list[bytes] = []
        self._ids: dict[bytes, int] = {}
        self._bytes = 0
        #: (first LSN, hints of the records from there), in LSN order.
        self._hints: deque[tuple[int, list[Hint]]] = deque()
        #: (first LSN, values, bytes) before the batch framed last: a batch framed again
        #: (its framing was interrupted) first takes back what the first attempt defined.
        self._mark: tuple[int, int, int] | None = None
        # Calls in a row that found no large value, and calls left to pass over: records
        # that hold none (most stores) cost a look at one call in QUIET_STRIDE.
        self._quiet = 0
        self._skip = 0

    def reset(self) -> None:
        """A new log: it starts with no value defined."""
        self._values = []
        self._ids = {}
        self._bytes = 0
        self._mark = None

    def hint(self, lsn: int, records: Sequence[Any], body: bytes | memoryview | None = None) -> None:
        """``records`` were staged at LSNs from ``lsn`` on (``body``: their encoding, back
        to back, when at hand: only a record of 128 bytes or more can hold a large value,
        so only those are walked). After ``QUIET_CALLS`` calls in a row whose records hold
        no large value, only one call in ``QUIET_STRIDE`` is looked at, until one does:
        the records of the others are written as they are (:meth:`passes_over`)."""
        if body is not None and _record_bounds is not None and len(records) > 1:
            bounds = _record_bounds(body, len(records), 0, 1)
            if bounds is not None:
                offsets = bounds[1]
                big = list(map(_MIN.__le__, map(operator.sub, offsets[1:], offsets)))
                records = list(compress(records, big)) if any(big) else []
        found = large_values(records)
        if found:
            self._quiet = 0
            self._hints.append((lsn, found))
        else:
            self._quiet += 1
            if self._quiet >= QUIET_CALLS:
                self._skip = QUIET_STRIDE - 1

    def passes_over(self) -> bool:
        """Whether the next records staged go without a hint (see :meth:`hint`); asked
        before they are staged, so that they are staged as if nothing were shared."""
        if self._skip:
            self._skip -= 1
            return True
        return False

    def handed_over(self, end: int) -> None:
        """The batch of the records before LSN ``end`` was handed over: it is never framed
        again, and their hints go."""
        hints = self._hints
        while hints and hints[0][0] < end:
            hints.popleft()

    @property
    def defined(self) -> int:
        """Values the current log defined so far."""
        return len(self._values)

    def share(self, payload: bytes, first: int, end: int) -> bytes | None:
        """The shared-values stream of ``payload`` (the records at LSNs ``first`` up to
        ``end``), or None when no value of it is shared."""
        hints = self._hints
        while hints and hints[0][0] < first:
            hints.popleft()
        found: list[Hint] = []
        for lsn, hinted in hints:
            if lsn >= end:
                break
            found.extend(hinted)
        if not found:
            return None
        mark = self._mark
        if mark is not None and mark[0] == first:
            self._take_back(mark)
        self._mark = (first, len(self._values), self._bytes)
        values, ids = self._values, self._ids
        tokens: list[bytes] = []
        token = tokens.append
        literals: list[bytes] = []
        put = literals.append
        defined: list[bytes] = []
        cursor = 0
        shared = False
        find = payload.find
        view = memoryview(payload)  # hashed in place: only a value defined is copied
        for key, size in found:
            # Where the value's first bytes are; the bytes there, as long as the value, are
            # shared whatever they are (a reference stands for bytes equal to them).
            at = find(key, cursor)
            if at < 0 or at + size > len(payload):
                continue
            digest = sha256(view[at:at + size]).digest()
            number = ids.get(digest)
            if number is None and self._bytes + size > F.SHARED_MAX_BYTES:
                continue  # the log's table is full: written as it is
            if at > cursor:
                token(_varint((at - cursor) << 2 | F.SHARED_LITERAL))
                put(payload[cursor:at])
            if number is None:
                values.append(digest)  # before the index: a take-back finds it in the list
                ids[digest] = len(values) - 1
                self._bytes += size
                token(_varint(size << 2 | F.SHARED_DEFINE))
                token(_varint(len(values) - 1))
                defined.append(payload[at:at + size])
            else:
                token(_varint(number << 2 | F.SHARED_REFERENCE))
            shared = True
            cursor = at + size
        if not shared:
            return None
        if cursor < len(payload):
            token(_varint((len(payload) - cursor) << 2 | F.SHARED_LITERAL))
            put(payload[cursor:])
        head = b"".join(tokens)
        lit = b"".join(literals)
        # Tokens, literal bytes and values apart: each part compresses better alone.
        return b"".join((F.SHARED_HEADER.pack(len(payload), len(head), len(lit)), head, lit, *defined))

    def _take_back(self, mark: tuple[int, int, int]) -> None:
        _, count, size = mark
        ids = self._ids
        for digest in self._values[count:]:
            ids.pop(digest, None)
        del self._values[count:]
        self._bytes = size


class ValueTable:
    """The values log ``at[0]`` defined before the position ``at`` (``(seq, segment,
    offset)``: where the scan that filled it stopped; None while unused). A reader holds at
    most ``SHARED_MAX_BYTES`` of values per log: a definition past it is damage."""

    __slots__ = ("values", "size", "at", "_before")

    def __init__(self, at: tuple[int, int, int] | None = None) -> None:
        self.values: list[bytes] = []
        self.size = 0
        self.at = at
        # Where the last batch read started, and the values and bytes before it: a reader
        # that reads that batch again (the record reader's cursor stays at a batch's start
        # until its last record is read) takes its definitions back.
        self._before: tuple[tuple[int, int, int], int, int] | None = None

    def reading(self, seq: int, segment: int, offset: int) -> None:
        """The batch at that position is read next (its definitions may be taken back)."""
        self._before = ((seq, segment, offset), len(self.values), self.size)

    def lost(self) -> None:
        """A batch's definitions stayed shut (a structure-only scan): the table holds
        nothing a later batch may refer to."""
        self.at = None

    def read_to(self, seq: int, segment: int, offset: int) -> None:
        """The batch read last ends at that position."""
        self.at = (seq, segment, offset)

    def resume(self, seq: int, segment: int, offset: int) -> bool:
        """Whether the table holds what log ``seq`` defined before that position, taking
        back the definitions of the batch read last if it starts there."""
        if self.reaches(seq, segment, offset):
            return True
        before = self._before
        if before is None or before[0] != (seq, segment, offset) or self.at is None or self.at[0] != seq:
            return False
        _, count, size = before
        del self.values[count:]
        self.size = size
        self.at = (seq, segment, offset)
        return True

    def reaches(self, seq: int, segment: int, offset: int) -> bool:
        """Whether the table holds what log ``seq`` defined before that position: it
        stopped there, or (a position at a segment's start) anywhere in the segment before
        (a scan that read on from there defines each value under its number, so a table
        that misses a definition reads as damage, never as other values)."""
        at = self.at
        if at is None or at[0] != seq:
            return False
        if offset <= F.SEGMENT_HEADER_SIZE:
            return (at[1] == segment and at[2] <= F.SEGMENT_HEADER_SIZE) or at[1] == segment - 1
        return at[1] == segment and at[2] == offset

    def add(self, values: list[bytes], size: int) -> None:
        """A batch defined ``values``: the log's values now take ``size`` bytes."""
        self.values.extend(values)
        self.size = size


__all__ = ["Hint", "SharedValues", "ValueTable", "large_values"]

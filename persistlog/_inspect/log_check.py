"""Checking one log: a scan in ``recovery="skip"`` mode that goes on past damage to find
all of it, turned into a :class:`LogInfo` whose problems are located precisely enough to cut
at.

The scan is the one shared reader's (:class:`~persistlog._read.reader.LogScanner`): nothing here
knows the byte layout, positions come from the reader. With ``check_records`` every app
record is decoded too, so undecodable CBOR is found. Memory stays bounded: only counters and
a few positions are kept, never the records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from destinations import Destination

from .._format import constants as F
from .._format.codec import Codec
from .._format.crypt import OPAQUE, Keyring
from .._format.decoder import Damage, parse_batch_header
from .._read.reader import LogScanner
from .destination_report import CORRUPT, TORN, LogInfo, Problem, SegmentInfo, SignedHead


class LogCheck:
    """Scans one log in skip mode, turning what the scanner records into problems located
    precisely enough to cut at.

    ``expect_first_lsn`` is the LSN the log before it ended at (None: not chained to it),
    ``expect_link`` the chain head it ended at (None: not known or not chained);
    ``on_batch(segment index, bytes of this log read)`` is called after every batch.
    After :meth:`read`, ``records_checked`` counts the app records decoded.
    """

    def __init__(
        self,
        dest: Destination,
        seq: int,
        segments: list[tuple[int, str]],
        expect_first_lsn: int | None,
        check_records: bool,
        on_batch: Callable[[int, int], None] | None,
        expect_link: bytes | None = None,
        keys: Keyring | None = None,
    ) -> None:
        self.dest = dest
        self.keys = keys
        self.expect_link = expect_link
        self.seq = seq
        self.segments = segments
        self.expect = expect_first_lsn
        self.check_records = check_records
        self.on_batch = on_batch
        self.loads = Codec().loads
        self.records_checked = 0

    def read(self) -> LogInfo:
        """Scan the log once; a log whose files vanish meanwhile comes back ``vanished``."""
        sizes = []
        for number, name in self.segments:
            try:
                sizes.append(SegmentInfo(number, name, self.dest.size(name)))
            except FileNotFoundError:
                info = LogInfo(self.seq, sizes, vanished=True)
                return info
        info = LogInfo(self.seq, sizes)
        # Bytes of the log before each segment, for progress.
        before: dict[int, tuple[int, int]] = {}
        total = 0
        for index, seg in enumerate(sizes):
            before[seg.number] = (index, total)
            total += seg.bytes
        scanner = LogScanner(self.dest, self.seq, self.segments, recovery="skip", expect_first_lsn=self.expect,
                             expect_link=self.expect_link, keys=self.keys)
        st = scanner.state
        seen = 0
        # App records of the intact batches read so far, the LSN due after the last of
        # them, and how many batches were read: what a cut at the next damage keeps.
        records = 0
        lsn_due = self.expect
        read = 0
        # Damage the scanner reported but the scan has not passed yet (it reports a gap in
        # the segment numbers before reading any): placed once the scan reaches it.
        pending: list[Problem] = []
        last_point = -1

        def place(p: Problem) -> None:
            nonlocal last_point
            p.records_before = records
            p.lsn = lsn_due if lsn_due is not None else st.first_lsn
            previous = info.problems[-1] if info.problems else None
            if previous is not None and previous.kind == CORRUPT and last_point == read:
                # Nothing intact between the two: one damage site, and what followed from it
                # (an LSN the skipped batch would have carried, a segment after a gap).
                previous.also.append(f"{p.where()}: {p.reason}")
            else:
                info.problems.append(p)
            last_point = read

        def settle(upto: tuple[int, int] | None) -> None:
            nonlocal seen
            for sk in st.skipped[seen:]:
                pending.append(Problem(CORRUPT, sk.reason, sk.log, sk.segment, sk.offset, sk.length))
            seen = len(st.skipped)
            for p in sorted(pending, key=lambda q: q.position):
                if upto is None or p.position[1:] <= upto:
                    pending.remove(p)
                    place(p)

        try:
            for batch in scanner:
                settle((batch.segment, batch.offset))
                count = 0 if batch.is_control else batch.header.count
                if batch.controls is not None:
                    self._controls(info, batch.controls, batch.segment, batch.offset, batch.end)
                elif self.check_records and not (self.keys is OPAQUE and batch.header.flags & F.FLAG_ENCRYPTED):
                    try:
                        for _first, _records in batch.record_slices(self.loads):
                            pass
                        self.records_checked += count
                    except Damage as d:
                        place(Problem(CORRUPT, d.reason, self.seq, _name(self.segments, batch.segment),
                                      batch.offset, batch.header.size))
                records += count
                lsn_due = st.next_lsn
                read += 1
                if self.on_batch is not None:
                    index, done = before.get(batch.segment, (0, 0))
                    self.on_batch(index, done + batch.end)
        except FileNotFoundError:
            info.vanished = True
            return info
        settle(None)
        info.records = st.records
        # The scanner only records a first LSN it had to learn from a segment header.
        info.first_lsn = st.first_lsn if st.first_lsn is not None else self.expect
        info.next_lsn = st.next_lsn
        info.first_commit_us = st.first_commit_us
        info.last_commit_us = st.last_commit_us
        info.complete = st.complete
        info.sealed = st.sealed
        info.chain_head = st.chain_head if st.chained else None
        info.encrypted_batches, info.unopened_batches = st.encrypted, st.unopened
        info.key_ids = list(st.key_ids)
        info.first_link = st.first_link
        if st.torn is not None:
            t = st.torn
            info.problems.append(
                Problem(
                    TORN, t.reason, t.log, t.segment, t.offset, t.length, lsn=st.next_lsn, records_before=st.records,
                    records_lost=0 if st.sealed else self._records_at(t.segment, t.offset),
                )
            )
        if st.header is None and info.segments and not _has_problem_at_start(info):
            info.problems.append(
                Problem(
                    CORRUPT, "log has no header record", self.seq, info.segments[0].name, F.SEGMENT_HEADER_SIZE,
                    lsn=st.first_lsn, records_before=0,
                )
            )
        if st.seal is not None:
            sealed_next = st.seal.get("next_lsn")
            if sealed_next != st.next_lsn and info.seal_at is not None:
                info.problems.append(
                    Problem(
                        CORRUPT, f"seal says the next LSN is {sealed_next}, the log ends at {st.next_lsn}",
                        self.seq, _name(self.segments, info.seal_at[0]), info.seal_at[1],
                        lsn=st.next_lsn, records_before=st.records,
                    )
                )
        return info

    def _records_at(self, name: str, offset: int) -> int | None:
        """The records of the batch whose header starts at ``offset`` (a torn tail's: its
        header says how many it was to hold), None when that header cannot be read."""
        try:
            return parse_batch_header(self.dest.read(name, offset, F.BATCH_HEADER_SIZE), offset).lsn_count
        except Damage:
            return None

    def _controls(self, info: LogInfo, controls: list[dict[str, Any]], segment: int, offset: int, end: int) -> None:
        for c in controls:
            t = c["t"]
            if t == F.CONTROL_HEADER:
                info.header_end = (segment, end)
                version = c.get("v")
                info.version = version if isinstance(version, int) else None
                writer = c.get("writer")
                info.writer = writer if isinstance(writer, str) else None
                created = c.get("created")
                info.created_us = created if isinstance(created, int) else None
            elif t == F.CONTROL_COMPLETE:
                info.complete_at = (segment, offset)
                n = c.get("records")
                info.snapshot_records = n if isinstance(n, int) else None
            elif t == F.CONTROL_SEAL:
                info.seal_at = (segment, offset)
                if "sig" in c and isinstance(c.get(F.SEAL_CHAIN), bytes) and isinstance(c.get("next_lsn"), int):
                    info.signed.append(SignedHead(self.seq, _name(self.segments, segment), offset, "seal",
                                                  c["next_lsn"], c[F.SEAL_CHAIN], c))
            elif t == F.CONTROL_CHECKPOINT:
                if isinstance(c.get("head"), bytes) and isinstance(c.get("lsn"), int):
                    info.signed.append(SignedHead(self.seq, _name(self.segments, segment), offset, "checkpoint",
                                                  c["lsn"], c["head"], c))
            elif t == F.CONTROL_FENCE:
                writer = c.get("writer")
                info.fenced_by = writer if isinstance(writer, str) else "an unnamed writer"


def _name(segments: list[tuple[int, str]], number: int) -> str:
    for n, name in segments:
        if n == number:
            return name
    return F.segment_name(0, number)


def _has_problem_at_start(info: LogInfo) -> bool:
    """Whether segment 0's own header is already reported (then a missing log header is
    the same damage, not news)."""
    return any(p.kind == CORRUPT and p.offset == 0 and p.position[1] <= 0 for p in info.problems)


__all__ = ["LogCheck"]

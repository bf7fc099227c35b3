"""What someone who can write the bucket can do to a local destination's logs.

:func:`load` parses every segment into editable batches (the bytes as stored, split into
header fields, link and stored payload); :func:`save` writes them back with every checksum
fixed, so the only thing that can tell a change is the hash chain (and signatures). With
``relink=True`` :func:`save` also recomputes every link and every seal's ``chain`` from
the first log on: the attacker who knows the format exactly and holds no key.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from typing import Any

import cbor2

from persistlog._format import chain, decoder
from persistlog._format import encoder
from persistlog._format import constants as F


@dataclass
class Batch:
    count: int
    flags: int
    first_lsn: int
    commit_us: int
    raw_len: int
    link: bytes | None
    body: bytes  # the stored payload after the link

    @property
    def kind(self) -> int:
        return self.flags & F.KIND_MASK

    def controls(self) -> list[dict[str, Any]]:
        assert self.kind == F.KIND_CONTROL and not self.flags & F.COMPRESSION_MASK
        return list(cbor2.loads(b"\x9f" + self.body + b"\xff"))

    def set_controls(self, records: list[dict[str, Any]]) -> None:
        self.body = b"".join(cbor2.dumps(r) for r in records)
        self.raw_len = len(self.body)

    def control_type(self) -> str | None:
        """The ``t`` of its first control record (``"?"`` when that does not decode)."""
        if self.kind != F.KIND_CONTROL:
            return None
        try:
            return str(self.controls()[0]["t"])
        except Exception:
            return "?"

    def to_bytes(self) -> bytes:
        stored = (self.link or b"") + self.body
        head = F.BATCH_HEADER.pack(len(stored), self.raw_len, self.count, self.flags, F.BATCH_MARKER,
                                   self.first_lsn, self.commit_us, zlib.crc32(stored))
        return head + F.U32.pack(zlib.crc32(head)) + stored


@dataclass
class Segment:
    name: str
    seq: int
    number: int
    first_lsn: int
    version: int
    batches: list[Batch] = field(default_factory=list)
    trailer: bool = False

    def to_bytes(self) -> bytes:
        out = bytearray(encoder.segment_header(self.seq, self.number, self.first_lsn, self.version))
        for b in self.batches:
            seal_at = len(out)
            out += b.to_bytes()
        if self.trailer:
            out += encoder.seal_trailer(seal_at)
        return bytes(out)


def parse(name: str, data: bytes) -> Segment:
    sh = decoder.parse_segment_header(data)
    seg = Segment(name, sh.seq, sh.segment, sh.first_lsn, sh.version)
    pos = F.SEGMENT_HEADER_SIZE
    while pos + F.BATCH_HEADER_SIZE <= len(data):
        h = decoder.parse_batch_header(data[pos:pos + F.BATCH_HEADER_SIZE], pos)
        stored = data[pos + F.BATCH_HEADER_SIZE:pos + h.size]
        link = stored[:F.LINK_SIZE] if h.linked else None
        body = stored[F.LINK_SIZE:] if h.linked else stored
        seg.batches.append(Batch(h.count, h.flags, h.first_lsn, h.commit_us, h.raw_len, link, body))
        pos += h.size
        if len(data) - pos == F.TRAILER_SIZE and decoder.parse_trailer(data[pos:]) is not None:
            seg.trailer = True
            break
    return seg


def load(path: str) -> list[Segment]:
    """Every segment at ``path``, in (seq, number) order."""
    names = sorted(n for n in os.listdir(path) if F.parse_segment_name(n) is not None)
    out = []
    for n in names:
        with open(os.path.join(path, n), "rb") as f:
            out.append(parse(n, f.read()))
    return out


def relink(segments: list[Segment], head: bytes = chain.GENESIS) -> None:
    """Recompute every link, seal ``chain`` and checkpoint ``head`` (and its ``seq`` and
    ``lsn``) in order, as the writer would have: everything but the signatures. The first
    batch links to ``head``."""
    for seg in segments:
        for b in seg.batches:
            if b.link is None:
                continue
            b.link = head
            t = b.control_type()
            if t == F.CONTROL_SEAL:
                controls = b.controls()
                controls[0][F.SEAL_CHAIN] = head
                b.set_controls(controls)
            elif t == F.CONTROL_CHECKPOINT:  # the head and position it names; not its signature
                controls = b.controls()
                controls[0].update(head=head, seq=seg.seq, lsn=b.first_lsn)
                b.set_controls(controls)
            if t in (F.CONTROL_SEAL, F.CONTROL_FENCE):
                continue
            head = chain.batch_hash(b.to_bytes())


def save(path: str, segments: list[Segment], *, relink_all: bool = False) -> None:
    """Write ``segments`` back to ``path`` (checksums fixed), removing segment files that
    are not among them."""
    if relink_all:
        relink(segments)
    keep = {s.name for s in segments}
    for n in os.listdir(path):
        if F.parse_segment_name(n) is not None and n not in keep:
            os.remove(os.path.join(path, n))
    for s in segments:
        with open(os.path.join(path, s.name), "wb") as f:
            f.write(s.to_bytes())


def record_batches(segments: list[Segment]) -> list[tuple[Segment, int, Batch]]:
    """``(segment, index, batch)`` of every batch holding app records, in order."""
    return [(s, i, b) for s in segments for i, b in enumerate(s.batches) if b.kind != F.KIND_CONTROL]


def offset_of(seg: Segment, index: int) -> int:
    """The byte offset of batch ``index`` of ``seg`` as :func:`save` writes it."""
    return F.SEGMENT_HEADER_SIZE + sum(len(b.to_bytes()) for b in seg.batches[:index])


def renumber(segments: list[Segment]) -> None:
    """Make the LSNs gapless again from the first segment's first LSN on (every batch's
    first LSN, segment headers, log headers' ``first_lsn``, seals' ``next_lsn`` and
    ``complete_lsn``): what hides a dropped or inserted batch from the LSN checks."""
    lsn = segments[0].first_lsn
    complete: int | None = None
    for seg in segments:
        seg.first_lsn = lsn
        for b in seg.batches:
            b.first_lsn = lsn
            t = b.control_type()
            if t is None:
                lsn += b.count
                continue
            if t == "?":
                continue
            controls = b.controls()
            c = controls[0]
            if t == F.CONTROL_HEADER:
                c["first_lsn"], complete = lsn, None
            elif t == F.CONTROL_COMPLETE:
                complete = lsn
            elif t == F.CONTROL_SEAL:
                c["next_lsn"] = lsn
                if F.SEAL_COMPLETE_LSN in c and complete is not None:
                    c[F.SEAL_COMPLETE_LSN] = complete
            b.set_controls(controls)


def replace_log(segments: list[Segment], newer: int, older: int) -> list[Segment]:
    """The segments with log ``newer``'s replaced by copies of log ``older``'s, renamed and
    their seqs rewritten (segment headers, log header): an older log put in place of a
    newer one. Renumber and relink afterwards as the attack goes."""
    forged = []
    for s in (s for s in segments if s.seq == older):
        copy = parse(F.segment_name(newer, s.number), s.to_bytes())
        copy.seq = newer
        if s.number == 0:
            controls = copy.batches[0].controls()
            controls[0]["seq"] = newer
            copy.batches[0].set_controls(controls)
        forged.append(copy)
    out = [s for s in segments if s.seq != newer] + forged
    return sorted(out, key=lambda s: (s.seq, s.number))

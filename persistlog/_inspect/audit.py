"""What signed checkpoints prove about a destination, given its public key: the part of
``persistlog verify --public-key`` (one or more keys) beyond the checks every reader makes.

:func:`audit` takes the :class:`~persistlog._inspect.destination_report.DestinationReport` of a
whole destination (every link checked) and checks every signature in it. The history is
*proven* up to the newest signed head when every signature verifies with the key and
nothing before that head is damaged or breaks the chain: by the links, every byte of every
batch from the start of the chain (the oldest log here, or the last log that does not
continue a chained log) to that head is what the key holder's writer wrote, in its order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._format.signing import Verifier
from .destination_report import CORRUPT, DestinationReport, Problem, SignedHead


@dataclass
class Audit:
    """The verdict: ``proven`` is the newest signed head whose history is intact (None when
    there is none), ``chain_from`` the log its chain starts in, ``problems`` the bad
    signatures, and ``breaks`` every corruption before the newest signed head."""

    key_ids: tuple[str, ...]
    signed: int = 0
    proven: SignedHead | None = None
    chain_from: int | None = None
    problems: list[Problem] = field(default_factory=list)
    breaks: list[Problem] = field(default_factory=list)
    #: LSNs written after the proven head, which no signature covers yet.
    unsigned_lsns: int = 0
    #: Signed records naming a key that was not given (key id -> how many): not checked,
    #: neither proof nor damage (the chain still covers those before the proven head).
    unknown_keys: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.proven is not None and not self.problems and not self.breaks


def audit(report: DestinationReport, verifier: Verifier) -> Audit:
    """Check every signature at the destination ``report`` describes with ``verifier``."""
    result = Audit(key_ids=verifier.key_ids)
    valid: list[SignedHead] = []
    chain_from: int | None = None
    starts: dict[int, int] = {}  # log -> the log its chain starts in
    for lg in report.logs:
        # A link that differs from the head of the log before is corruption the reader
        # reported; the proof starts afresh where that link was not checked: after an
        # unchained log, a declared gap, or an oldest log cut short as an interrupted
        # retention leaves it.
        if lg.chain_head is None:
            chain_from = None  # an unchained log: nothing before it is covered
        elif chain_from is None or not lg.continues:
            chain_from = lg.seq
        if chain_from is not None:
            starts[lg.seq] = chain_from
        for s in lg.signed:
            result.signed += 1
            key = s.record.get("key")
            if isinstance(key, str) and "sig" in s.record and key not in verifier.key_ids:
                result.unknown_keys[key] = result.unknown_keys.get(key, 0) + 1
                continue
            why = verifier.check(s.record, s.log, s.lsn, s.head)
            if why is not None:
                result.problems.append(Problem(CORRUPT, f"signed {s.kind}: {why}", s.log, s.segment, s.offset, lsn=s.lsn))
            else:
                valid.append(s)
    if not valid:
        return result
    newest = max(valid, key=lambda s: s.position)
    result.proven = newest
    result.chain_from = starts.get(newest.log)
    start = result.chain_from if result.chain_from is not None else newest.log
    result.breaks = [
        p for p in report.corrupt
        if p.log is not None and start <= p.log and p.position <= newest.position
    ]
    last = report.logs[-1].next_lsn if report.logs else None
    result.unsigned_lsns = max(0, last - newest.lsn) if last is not None else 0
    return result


__all__ = ["Audit", "audit"]

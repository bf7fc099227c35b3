"""Building real logs for the CLI tests, and damaging them the way crashes and bad disks do.

Logs are written by persistlog itself (no hand-made bytes); damage is file surgery on real
segment files: a torn tail is the end of an unsealed log cut in the middle of a batch, and
corruption is one flipped bit inside a batch that is not at the tail.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from typing import Any

import persistlog
from destinations import open_destination
from kv_app import apply
from persistlog._format import constants as F
from persistlog._read.reader import LogScanner, list_logs
from persistlog.cli import main


@dataclass
class Run:
    status: int
    out: str
    err: str


def cli(*argv: str) -> Run:
    """``persistlog.cli.main(argv)`` in this process, capturing its output."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(list(argv))
    return Run(status, out.getvalue(), err.getvalue())


def cli_subprocess(*argv: str, timeout: float = 60) -> Run:
    """``python -m persistlog ARGV`` as a child process."""
    proc = subprocess.run(
        [sys.executable, "-m", "persistlog", *argv], capture_output=True, text=True, timeout=timeout
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


class KV:
    """A dict logged with the ResourceStore convention, enumerable for rotations."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def enumerate_all(self, emit: Callable[[Any], None]) -> None:
        for key, value in list(self.data.items()):
            emit({"op": "put", "key": key, "value": value})

    def apply(self, record: Any) -> None:
        """Replay one record (``persistlog.open(..., replay=kv.apply)`` restores first)."""
        apply(self.data, record)

    def put(self, log: persistlog.Log, key: str, value: Any) -> int:
        lsn = log.update({"op": "put", "key": key, "value": value})
        self.data[key] = value
        return lsn

    def delete(self, log: persistlog.Log, key: str) -> int:
        lsn = log.update({"op": "del", "key": key})
        self.data.pop(key, None)
        return lsn


def write_logs(url: str, updates: int = 400, rotate_every: int = 200, keys: int = 50, retain: int = 5) -> KV:
    """Two or more logs of small segments and batches, closed cleanly (sealed)."""
    kv = KV()
    lg = persistlog.open(url, kv.enumerate_all, rotate_bytes=None, segment_bytes=4096, batch_bytes=600, retain=retain
    )
    try:
        for i in range(updates):
            if i % 7 == 3:
                kv.delete(lg, f"k{(i * 3) % keys}")
            else:
                kv.put(lg, f"k{i % keys}", {"i": i, "pad": "x" * (i % 13)})
            if i % 25 == 24:
                lg.sync()  # many batches, so that damage can sit in the middle of a log
            if rotate_every and i % rotate_every == rotate_every - 1 and i + 1 < updates:
                lg.rotate()
    finally:
        lg.close()
    return kv


@dataclass
class BatchAt:
    log: int
    segment: str
    offset: int
    size: int
    first_lsn: int
    count: int
    control: str | None  # the first control record's "t", None for app records


def batches(path: str) -> list[BatchAt]:
    """Every batch at a local destination, in order (through the real reader)."""
    dest = open_destination(path)
    out = []
    for seq, segments in list_logs(dest).items():
        names = dict(segments)
        for b in LogScanner(dest, seq, segments):
            control = b.controls[0]["t"] if b.controls else None
            out.append(BatchAt(seq, names[b.segment], b.offset, b.header.size, b.first_lsn, b.header.count, control))
    return out


def unseal_newest(path: str) -> BatchAt:
    """Cut the newest log just before its seal: what a writer killed mid-run leaves.
    Returns the last batch that remains."""
    all_batches = batches(path)
    seal = next(b for b in reversed(all_batches) if b.control == "seal")
    with open(os.path.join(path, seal.segment), "r+b") as f:
        f.truncate(seal.offset)
    # A writer killed mid-run writes no CLOSED note (the clean close that made this log did).
    if os.path.exists(os.path.join(path, "CLOSED")):
        os.remove(os.path.join(path, "CLOSED"))
    return [b for b in all_batches if b.log == seal.log and (b.segment, b.offset) < (seal.segment, seal.offset)][-1]


def tear_newest(path: str, keep: int = 57) -> tuple[str, int]:
    """Unseal the newest log and leave half a batch at its end (a crash mid-write).
    Returns ``(segment name, offset of the torn batch)``."""
    last = unseal_newest(path)
    seg = os.path.join(path, last.segment)
    with open(seg, "rb") as f:
        f.seek(last.offset)
        partial = f.read(min(keep, last.size - 1))
    with open(seg, "ab") as f:
        f.write(partial)
    size = os.path.getsize(seg)
    return last.segment, size - len(partial)


def corrupt_middle(path: str, log: int | None = None) -> BatchAt:
    """Flip one bit in the payload of an app-record batch in the middle of a log (of the
    newest log unless ``log`` is given). Returns the damaged batch."""
    all_batches = batches(path)
    seq = log if log is not None else max(b.log for b in all_batches)
    candidates = [b for b in all_batches if b.log == seq and b.control is None]
    victim = candidates[len(candidates) // 2]
    flip(os.path.join(path, victim.segment), victim.offset + F.BATCH_HEADER_SIZE + 3)
    return victim


def flip(file: str, offset: int, bit: int = 2) -> None:
    with open(file, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ (1 << bit)]))


def tree_digest(path: str) -> str:
    """A digest of every file name and byte under ``path`` (LOCK aside), to prove nothing
    changed."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            if name == "LOCK":
                continue
            full = os.path.join(root, name)
            h.update(os.path.relpath(full, path).encode() + b"\0")
            with open(full, "rb") as f:
                h.update(f.read())
    return h.hexdigest()

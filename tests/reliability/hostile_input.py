"""Hostile input for the read side: a corpus of valid logs, mutators, and the contract check.

The contract (docs/DESIGN.md invariants 2 and 5, docs/FORMAT.md "Torn tails and corruption"): given
any bytes at a destination, ``persistlog.restore`` (strict or ``recovery="skip"``) and a
follower's ``poll`` either succeed, handing the app only inert values, or raise
``persistlog.CorruptLogError`` (or, a follower where no log is left at all,
``persistlog.LogNotFoundError``). Nothing else escapes, no length read from storage makes
anything allocate beyond the batch limit, and no class is constructed that the app did not
register (records are CBOR's plain types, cbor2's standard semantic types, or
``cbor2.CBORTag``).

Mutators work at three levels: raw bytes (bit flips, truncation, insertion, deletion,
overwrites, splices, random files), framing with checksums recomputed (so that header
fields and payloads reach the deeper checks: extreme lengths, counts, flags, LSNs, seqs,
versions), and CBOR payloads with checksums recomputed (deep nesting, 4 GiB length claims,
unknown and dangerous tags, value-sharing cycles, bad UTF-8, bignums...).
"""

from __future__ import annotations

import datetime
import decimal
import fractions
import ipaddress
import os
import random
import shutil
import struct
import tempfile
import uuid
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cbor2

import persistlog
from persistlog._format import constants as F

# -- the corpus -------------------------------------------------------------------------------

_CORPUS: dict[str, dict[str, bytes]] | None = None


def corpus() -> dict[str, dict[str, bytes]]:
    """Named destinations (file name -> bytes) written by the real writer."""
    global _CORPUS
    if _CORPUS is None:
        root = tempfile.mkdtemp(prefix="pl-corpus-")
        try:
            _CORPUS = {}
            for name, opts in {
                "plain": dict(compression=None),
                "gzip": dict(compression="gzip"),
                "zstd": dict(compression="zstd"),
            }.items():
                path = os.path.join(root, name)
                state: dict[Any, Any] = {f"s{i}": {"n": i, "tags": ["a", "b"]} for i in range(6)}

                def dump(emit: Callable[[Any], None], state: dict[Any, Any] = state) -> None:
                    for k, v in list(state.items()):
                        emit({"op": "put", "key": k, "value": v})

                lg = persistlog.open(path, dump, durability="flush", segment_bytes=4096, retain=3, **opts)
                for i in range(30):
                    rec = {"op": "put", "key": f"k{i % 5}", "value": {
                        "i": i, "when": datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc),
                        "amount": decimal.Decimal("1.5"), "id": uuid.UUID(int=i), "blob": b"\x00" * (i * 7),
                        "text": "x" * (i * 11)}}
                    lg.update(rec)
                    state[f"k{i % 5}"] = rec["value"]
                    if i == 14:
                        lg.rotate()
                lg.update_many([{"op": "del", "key": "k1"}, {"op": "put", "key": "z", "value": None}])
                lg.close()
                _CORPUS[name] = {n: open(os.path.join(path, n), "rb").read() for n in sorted(os.listdir(path))
                                 if n != "LOCK"}
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return _CORPUS


# -- framing helpers --------------------------------------------------------------------------


def batches(seg: bytes) -> list[tuple[int, int]]:
    """``(offset, size)`` of every well-framed batch in a segment."""
    out = []
    pos = F.SEGMENT_HEADER_SIZE
    while pos + F.BATCH_HEADER_SIZE <= len(seg):
        body = seg[pos:pos + F.BATCH_HEADER.size]
        fields = F.BATCH_HEADER.unpack(body)
        if fields[4] != F.BATCH_MARKER:
            break
        size = F.BATCH_HEADER_SIZE + fields[0]
        if pos + size > len(seg):
            break
        out.append((pos, size))
        pos += size
    return out


def reframe(fields: list[Any], payload: bytes, fix_payload_crc: bool = True) -> bytes:
    """A batch from header ``fields`` (as BATCH_HEADER unpacks them) and ``payload``."""
    if fix_payload_crc:
        fields[7] = zlib.crc32(payload)
    head = F.BATCH_HEADER.pack(*fields)
    return head + F.U32.pack(zlib.crc32(head)) + payload


def splice_batch(seg: bytes, off: int, size: int, new: bytes) -> bytes:
    """``seg`` with the batch at ``off`` replaced by ``new``; a seal trailer after it is
    moved along, so that the damage is the new batch and nothing else."""
    out = seg[:off] + new + seg[off + size:]
    delta = len(new) - size
    if delta and len(seg) >= F.TRAILER_SIZE:
        body = seg[-F.TRAILER_SIZE:-4]
        magic, seal_at = F.TRAILER.unpack(body)
        if magic == F.TRAILER_MAGIC and zlib.crc32(body) == F.U32.unpack(seg[-4:])[0] and seal_at > off:
            body = F.TRAILER.pack(F.TRAILER_MAGIC, (seal_at + delta) % 2**32)
            out = out[:-F.TRAILER_SIZE] + body + F.U32.pack(zlib.crc32(body))
    return out


def segment_header(seq: int, number: int, first_lsn: int, version: int = F.FORMAT_VERSION,
                   hsize: int = F.SEGMENT_HEADER_SIZE) -> bytes:
    head = F.SEGMENT_HEADER.pack(F.SEGMENT_MAGIC, version, hsize, number % 2**32, seq % 2**64,
                                 first_lsn % 2**64, 0)
    return head + F.U32.pack(zlib.crc32(head))


# -- hostile CBOR -----------------------------------------------------------------------------


def _u(major: int, n: int) -> bytes:
    """A CBOR head of major type ``major`` with argument ``n``."""
    if n < 24:
        return bytes([major << 5 | n])
    if n < 1 << 8:
        return bytes([major << 5 | 24, n])
    if n < 1 << 16:
        return bytes([major << 5 | 25]) + struct.pack(">H", n)
    if n < 1 << 32:
        return bytes([major << 5 | 26]) + struct.pack(">I", n)
    return bytes([major << 5 | 27]) + struct.pack(">Q", n)


def hostile_items(rng: random.Random) -> list[tuple[str, bytes]]:
    """Single CBOR items (or fragments) meant to hurt a decoder."""
    deep = rng.choice([201, 1000, 100_000])
    return [
        ("deep-array", b"\x81" * deep + b"\x00"),
        ("deep-map", b"\xa1\x00" * deep + b"\x00"),
        ("deep-tag", b"\xd9\x12\x34" * deep + b"\x00"),
        ("deep-indef", b"\x9f" * deep + b"\xff" * deep),
        ("bytes-4GiB", _u(2, 0xFFFFFFFF)),
        ("bytes-2^63", _u(2, 1 << 63)),
        ("text-4GiB", _u(3, 0xFFFFFFFF) + b"abc"),
        ("array-4G-items", _u(4, 0xFFFFFFFF)),
        ("map-4G-pairs", _u(5, 0xFFFFFFFF) + b"\x00\x00"),
        ("array-60M-items", _u(4, 60_000_000) + b"\x00" * 64),
        ("unknown-tag", _u(6, 0x1234_5678) + b"\x00"),
        ("tag-2^64-1", b"\xdb" + b"\xff" * 8 + b"\x00"),
        ("tag27-unregistered", _u(6, 27) + cbor2.dumps(["os.system", ["rm -rf /"]])),
        ("tag27-malformed", _u(6, 27) + cbor2.dumps({"a": 1})),
        ("regex", _u(6, 35) + cbor2.dumps("(a+)+$")),
        ("mime", _u(6, 36) + cbor2.dumps("Content-Type: text/plain\r\n\r\nhi")),
        ("shareable-cycle", bytes.fromhex("d81c81d81d00")),
        ("sharedref-dangling", bytes.fromhex("d81d05")),
        ("stringref", bytes.fromhex("d9010082") + cbor2.dumps("abcd") + bytes.fromhex("d81900")),
        ("bad-utf8", b"\x62\xff\xfe"),
        ("bignum-1MB", _u(6, 2) + _u(2, 1 << 20) + bytes(rng.randrange(256) for _ in range(64)) * (1 << 14)),
        ("bigfloat-huge-exp", bytes.fromhex("c5821b0fffffffffffffff01")),
        ("decimal-huge-exp", bytes.fromhex("c4821b7fffffffffffffff01")),
        ("fraction-zero", bytes.fromhex("d81e820100")),
        ("datetime-garbage", _u(6, 0) + cbor2.dumps("not a date")),
        ("epoch-huge", _u(6, 1) + b"\xfb\x7f\xef\xff\xff\xff\xff\xff\xff"),
        ("uuid-short", _u(6, 37) + cbor2.dumps(b"\x01")),
        ("ip-garbage", _u(6, 260) + cbor2.dumps(b"\x01\x02\x03")),
        ("set-unhashable", _u(6, 258) + cbor2.dumps([[1], {"a": 1}])),
        ("map-unhashable-key", b"\xa1\x80\x00"),
        ("break-alone", b"\xff"),
        ("reserved-ai", bytes([0x1c])),
        ("indef-text-wrong-chunk", b"\x7f\x41a\xff"),
        ("simple-undefined", b"\xf7"),
        ("simple-reserved", b"\xf8\x10"),
        ("half-nan", b"\xf9\x7e\x00"),
        ("neg-bignum-empty", _u(6, 3) + b"\x40"),
        ("self-describe", bytes.fromhex("d9d9f7") + b"\x00"),
    ]


ALLOWED_TYPES: tuple[type, ...] = (
    dict, list, tuple, str, bytes, int, float, bool, type(None), set, frozenset,
    datetime.datetime, datetime.date, decimal.Decimal, fractions.Fraction, uuid.UUID,
    ipaddress.IPv4Address, ipaddress.IPv6Address, ipaddress.IPv4Network, ipaddress.IPv6Network,
    ipaddress.IPv4Interface, ipaddress.IPv6Interface,
    cbor2.CBORTag, cbor2.CBORSimpleValue, type(cbor2.undefined), cbor2.frozendict,
)


def _children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return list(value.keys()) + list(value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    if isinstance(value, cbor2.CBORTag):
        return [value.value]
    return []


def foreign_types(value: Any) -> list[str]:
    """Types in ``value`` (at any depth; iterative, cycles allowed) that are not inert data."""
    out: list[str] = []
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if type(v) not in ALLOWED_TYPES:
            out.append(f"{type(v).__module__}.{type(v).__qualname__}")
        stack.extend(_children(v))
    return out


def is_cyclic(value: Any) -> bool:
    """Whether ``value`` contains itself (iterative depth-first search with colours)."""
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        v, leaving = stack.pop()
        if leaving:
            state[id(v)] = 2
            continue
        children = _children(v)
        if not children:
            continue
        mark = state.get(id(v))
        if mark == 1:
            return True
        if mark == 2:
            continue
        state[id(v)] = 1
        stack.append((v, True))
        for c in children:
            if state.get(id(c)) == 1:
                return True
            stack.append((c, False))
    return False


# -- mutators ---------------------------------------------------------------------------------


def _segments(files: dict[str, bytes]) -> list[str]:
    return [n for n in files if F.parse_segment_name(n) is not None]


# Ranges of the BATCH_HEADER fields ("<IIIH2sQqI"); the marker is left alone.
_FIELD_RANGES = [(0, 2**32 - 1)] * 3 + [(0, 2**16 - 1), (b"", b"\xff\xff"), (0, 2**64 - 1),
                                         (-(2**63), 2**63 - 1), (0, 2**32 - 1)]


def mutate(files: dict[str, bytes], rng: random.Random) -> tuple[str, dict[str, bytes]]:
    """One random mutation of a destination; returns its name and the new files."""
    files = dict(files)
    segs = _segments(files)
    if not segs:  # an earlier mutation dropped the only segment
        segs = [F.segment_name(1, 0)]
        files[segs[0]] = b""
    name = rng.choice(segs)
    data = bytearray(files[name])
    kind = rng.choice([
        "bitflip", "bitflip", "truncate", "insert", "delete", "overwrite", "zeros", "splice",
        "random-file", "header-field", "header-field", "payload-cbor", "payload-cbor",
        "segment-header", "current", "drop-file", "trailer",
    ])
    if not data and kind not in ("insert", "current", "drop-file"):
        kind = "random-file"
    if kind == "bitflip":
        for _ in range(rng.choice([1, 1, 2, 8])):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del data[rng.randrange(len(data) + 1):]
    elif kind == "insert":
        i = rng.randrange(len(data) + 1)
        data[i:i] = rng.randbytes(rng.choice([1, 4, 40, 300]))
    elif kind == "delete":
        i = rng.randrange(len(data))
        del data[i:i + rng.choice([1, 4, 40, 300])]
    elif kind == "overwrite":
        i = rng.randrange(len(data))
        n = rng.choice([1, 8, 40])
        data[i:i + n] = rng.randbytes(min(n, len(data) - i))
    elif kind == "zeros":
        i = rng.randrange(len(data))
        data[i:] = bytes(len(data) - i)
    elif kind == "splice":
        other = files[rng.choice(segs)] or bytes(data)
        i, j = rng.randrange(len(data)), rng.randrange(len(other))
        data[i:] = other[j:]
    elif kind == "random-file":
        data = bytearray(rng.randbytes(rng.choice([0, 1, 39, 40, 100, 5000])))
        if rng.random() < 0.5 and len(data) >= 40:
            seq, number = F.parse_segment_name(name)  # type: ignore[misc]
            data[:40] = segment_header(seq, number, rng.choice([1, 2, 1 << 63]))
    elif kind in ("header-field", "payload-cbor"):
        bl = batches(bytes(data))
        if bl:
            off, size = rng.choice(bl)
            fields = list(F.BATCH_HEADER.unpack(bytes(data[off:off + F.BATCH_HEADER.size])))
            payload = bytes(data[off + F.BATCH_HEADER_SIZE:off + size])
            if kind == "header-field":
                idx = rng.choice([0, 1, 2, 3, 5, 6])
                extreme = {
                    0: [0, 1, fields[0] + 1, F.MAX_BATCH_BYTES, F.MAX_BATCH_BYTES + 1, 0xFFFFFFFF],
                    1: [0, 1, fields[1] + 1, F.MAX_BATCH_BYTES, 0xFFFFFFFF],
                    2: [0, 1, fields[2] + 1, 0xFFFFFFFF],
                    3: [0, 1, 2, 3, 4, 8, 12, 0x10, 0xFFFF],
                    5: [0, 1, fields[5] + 1, fields[5] - 1, (1 << 64) - 1],
                    6: [-(1 << 63), 0, (1 << 63) - 1],
                }[idx]
                fields[idx] = rng.choice(extreme)
                for k, (lo, hi) in enumerate(_FIELD_RANGES):
                    fields[k] = min(max(fields[k], lo), hi)
                batch = reframe(fields, payload, fix_payload_crc=rng.random() < 0.9)
                data = bytearray(splice_batch(bytes(data), off, size, batch[:F.BATCH_HEADER_SIZE] + payload))
            else:
                label, item = rng.choice(hostile_items(rng))
                raw = item if rng.random() < 0.7 else payload[: rng.randrange(len(payload) + 1)] + item
                fields[0] = fields[1] = len(raw)
                fields[3] &= F.KIND_MASK  # stored uncompressed
                if fields[3] == F.KIND_MIXED and rng.random() < 0.5:
                    raw = cbor2.dumps(bytes([0xFF]) * ((fields[2] + 7) // 8)) + raw
                    fields[0] = fields[1] = len(raw)
                if rng.random() < 0.5:
                    fields[2] = 1
                data = bytearray(splice_batch(bytes(data), off, size, reframe(fields, raw)))
                kind = f"payload-cbor:{label}"
    elif kind == "segment-header":
        seq, number = F.parse_segment_name(name)  # type: ignore[misc]
        first = struct.unpack_from("<Q", data, 24)[0] if len(data) >= 40 else 1
        if len(data) < 40:
            data = bytearray(40)
        choice = rng.choice(["seq", "number", "lsn", "version", "hsize"])
        data[:40] = segment_header(
            seq + (1 if choice == "seq" else 0),
            number + (1 if choice == "number" else 0),
            {"lsn": rng.choice([0, first + 1, (1 << 64) - 1])}.get(choice, first),
            version=2 if choice == "version" else F.FORMAT_VERSION,
            hsize=64 if choice == "hsize" else F.SEGMENT_HEADER_SIZE,
        )
    elif kind == "current":
        choice = rng.random()
        if choice < 0.4:
            files["CURRENT"] = rng.randbytes(rng.choice([0, 23, 24, 25, 5000]))
        else:
            body = F.POINTER.pack(F.POINTER_MAGIC, F.FORMAT_VERSION, 0, rng.choice([0, 1, 2, 99, (1 << 64) - 1]))
            files["CURRENT"] = body + F.U32.pack(zlib.crc32(body))
        return kind, files
    elif kind == "drop-file":
        del files[name]
        return kind, files
    elif kind == "trailer":
        if len(data) >= F.TRAILER_SIZE:
            body = F.TRAILER.pack(F.TRAILER_MAGIC, rng.choice([0, 40, max(len(data) - 56, 0), 0xFFFFFFFF]))
            data[-F.TRAILER_SIZE:] = body + F.U32.pack(zlib.crc32(body))
    files[name] = bytes(data)
    return kind, files


# -- the contract check -----------------------------------------------------------------------


@dataclass
class FuzzFigures:
    inputs: int = 0
    ok: int = 0
    corrupt: int = 0
    escapes: int = 0
    foreign: int = 0
    cyclic: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    escape_examples: list[str] = field(default_factory=list)

    def add(self, other: FuzzFigures) -> None:
        for f in ("inputs", "ok", "corrupt", "escapes", "foreign", "cyclic"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.kinds.update(other.kinds)
        self.escape_examples += other.escape_examples


def write_destination(path: str, files: dict[str, bytes]) -> None:
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    for n, b in files.items():
        with open(os.path.join(path, n), "wb") as f:
            f.write(b)


def check_destination(path: str, figures: FuzzFigures, label: str) -> None:
    """Read ``path`` every way a reader does; count outcomes, record escapes."""
    figures.inputs += 1
    for part in label.replace("+", " ").split():
        figures.kinds[part.split(":")[0]] += 1
    readers = (("restore", _restore_strict), ("skip", _restore_skip), ("follow", _follow_once), ("json", _json_rows))
    for mode, reader in readers:
        try:
            records = reader(path)
        except (persistlog.CorruptLogError, persistlog.LogNotFoundError):
            # Damage, or (every log file dropped) no log at all: each its own honest error.
            figures.corrupt += 1
            continue
        except BaseException as e:  # noqa: BLE001 - exactly what this counts
            figures.escapes += 1
            if len(figures.escape_examples) < 20:
                figures.escape_examples.append(f"{mode} {label}: {type(e).__module__}.{type(e).__name__}: {e}"[:400])
            continue
        figures.ok += 1
        for r in records:
            bad = foreign_types(r)
            if bad:
                figures.foreign += 1
                if len(figures.escape_examples) < 20:
                    figures.escape_examples.append(f"{mode} {label}: foreign types {bad[:3]}")
            if is_cyclic(r):
                figures.cyclic += 1


def _restore_strict(path: str) -> list[Any]:
    out: list[Any] = []
    persistlog.restore(path, out.append)
    return out


def _restore_skip(path: str) -> list[Any]:
    out: list[Any] = []
    persistlog.restore(path, out.append, recovery="skip")
    return out


def _follow_once(path: str) -> list[Any]:
    out: list[Any] = []
    f = persistlog.follow(path, out.append)
    try:
        f.poll()
        f.poll()
    finally:
        f.stop()
    return out


def _json_rows(path: str) -> list[Any]:
    """The records as the Spark replay's executors read them (JSON text, from the C path
    where it applies), parsed back."""
    from spark_replay._options import ReadOptions
    from spark_replay._plan import plan
    from spark_replay._scan import read_records

    from persistlog._format.jsonify import from_json

    out: list[Any] = []
    try:
        parts = plan(ReadOptions.parse({"path": path}))
    except persistlog.LogNotFoundError:
        return out  # every log file dropped: the reader says so, as restore's found=False does
    for part in parts:
        for batch in read_records(part):
            for text in batch.column("record").to_pylist():
                try:
                    out.append(from_json(text))
                except RecursionError:  # sound text, deeper than json.loads reads
                    out.append(text)
    return out


def campaign(n: int, seed: int = 0, workdir: str | None = None) -> FuzzFigures:
    """``n`` mutated destinations (plus every hostile CBOR item once), checked."""
    rng = random.Random(seed)
    figures = FuzzFigures()
    root = workdir or tempfile.mkdtemp(prefix="pl-fuzz-")
    path = os.path.join(root, "dest")
    try:
        base = corpus()
        for label, item in hostile_items(rng):
            files = dict(base["plain"])
            name = _segments(files)[-1]
            seg = files[name]
            off, size = batches(seg)[-2]
            fields = list(F.BATCH_HEADER.unpack(seg[off:off + F.BATCH_HEADER.size]))
            fields[0] = fields[1] = len(item)
            fields[2], fields[3] = 1, F.KIND_UPDATE
            files[name] = splice_batch(seg, off, size, reframe(fields, item))
            write_destination(path, files)
            check_destination(path, figures, f"payload-cbor:{label}")
        for _ in range(n):
            which = rng.choice(sorted(base))
            label, files = mutate(base[which], rng)
            for _ in range(rng.choice([0, 0, 1])):
                label2, files = mutate(files, rng)
                label = f"{label}+{label2}"
            write_destination(path, files)
            check_destination(path, figures, label)
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    return figures

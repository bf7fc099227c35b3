"""Hostile input: random and mutated bytes at a destination, read every way readers read.

Only ``persistlog.CorruptLogError`` may escape ``restore`` (strict and ``recovery="skip"``)
and a follower's ``poll``; records are inert values; no length read from storage allocates
more than the batch limit allows (``tracemalloc`` peak, and an address-space limit in a
child process for allocations made outside Python's allocator); no unregistered class is
ever constructed. See ``hostile_input.py`` for the mutators.
"""

from __future__ import annotations

import functools
import os
import random
import re
import subprocess
import sys
import tempfile
import textwrap
import tracemalloc
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hostile_input import (
    FuzzFigures,
    batches,
    campaign,
    check_destination,
    corpus,
    foreign_types,
    hostile_items,
    mutate,
    reframe,
    segment_header,
    splice_batch,
    write_destination,
)
from crash_matrix import ROOT

import persistlog
from persistlog._format import constants as F

EXAMPLES = int(os.environ.get("PERSISTLOG_FUZZ_EXAMPLES", "120"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("PERSISTLOG_FUZZ_RANDOM") is None,
)


def _assert_clean(figures: FuzzFigures) -> None:
    assert figures.escapes == 0 and figures.foreign == 0, "\n".join(figures.escape_examples)


@pytest.mark.slow
def test_seeded_mutation_campaign() -> None:
    """A few hundred structured mutations of real logs (plain, gzip, zstd), all readers."""
    figures = campaign(int(os.environ.get("PERSISTLOG_FUZZ_CAMPAIGN", "250")), seed=6)
    _assert_clean(figures)
    assert figures.inputs >= 250 and figures.corrupt > 0 and figures.ok > 0


@pytest.mark.slow
@FUZZ
@given(data=st.binary(max_size=3000), with_header=st.booleans(), name_seq=st.integers(1, 3))
def test_random_bytes_as_a_segment(data: bytes, with_header: bool, name_seq: int) -> None:
    if with_header:
        data = segment_header(name_seq, 0, 1) + data
    figures = FuzzFigures()
    with tempfile.TemporaryDirectory() as root:
        write_destination(root + "/d", {F.segment_name(name_seq, 0): data})
        check_destination(root + "/d", figures, "random")
    _assert_clean(figures)


@pytest.mark.slow
@FUZZ
@given(rnd=st.randoms(use_true_random=False), which=st.sampled_from(["plain", "gzip", "zstd"]),
       rounds=st.integers(1, 3))
def test_mutated_valid_logs(rnd: random.Random, which: str, rounds: int) -> None:
    files = corpus()[which]
    label = ""
    for _ in range(rounds):
        kind, files = mutate(files, rnd)
        label += kind + " "
    figures = FuzzFigures()
    with tempfile.TemporaryDirectory() as root:
        write_destination(root + "/d", files)
        check_destination(root + "/d", figures, label)
    _assert_clean(figures)


# -- memory -----------------------------------------------------------------------------------


@dataclass
class Hostile:
    name: str
    files: dict[str, bytes]


def _with_batch(fields_update: dict[int, int], payload: bytes, *, fix_crc: bool = True) -> dict[str, bytes]:
    """The plain corpus with its last update batch replaced."""
    files = dict(corpus()["plain"])
    name = [n for n in files if n.endswith(".plog")][-1]
    seg = files[name]
    off, size = batches(seg)[-2]
    fields = list(F.BATCH_HEADER.unpack(seg[off:off + F.BATCH_HEADER.size]))
    fields[0] = fields[1] = len(payload)
    fields[2], fields[3] = 1, F.KIND_UPDATE
    for i, v in fields_update.items():
        fields[i] = v
    files[name] = splice_batch(seg, off, size, reframe(fields, payload, fix_payload_crc=fix_crc))
    return files


@functools.lru_cache(maxsize=1)
def hostile_cases() -> list[Hostile]:
    import zstandard

    rng = random.Random(0)
    cases = [Hostile(f"cbor:{label}", _with_batch({}, item)) for label, item in hostile_items(rng)]
    # Built by streaming, so that making them never needs 256 MiB at once.
    mib = bytes(1 << 20)
    zc = zstandard.ZstdCompressor(write_content_size=True).compressobj(size=256 << 20)
    zbomb = b"".join(zc.compress(mib) for _ in range(256)) + zc.flush()
    gc = zlib.compressobj(9)
    gbomb = b"".join(gc.compress(mib) for _ in range(256)) + gc.flush()
    # A zstd frame whose header declares 4 GiB of content, followed by a 3-byte raw block.
    zliar = bytes.fromhex("28b52ffd") + bytes([0xA0]) + (0xFFFFFFF0).to_bytes(4, "little") + b"\x19\x00\x00abc"
    cases += [
        Hostile("stored-length-4GiB", _with_batch({0: 0xFFFFFFFF, 1: 0xFFFFFFFF}, b"\x00")),
        Hostile("stored-length-at-limit-in-tiny-file", _with_batch({0: F.MAX_BATCH_BYTES, 1: F.MAX_BATCH_BYTES}, b"\x00")),
        Hostile("count-4G", _with_batch({2: 0xFFFFFFFF}, b"\x00" * 64)),
        Hostile("zstd-bomb-256MiB-declared", _with_batch({1: 100, 3: F.KIND_UPDATE | F.COMPRESSION_ZSTD}, zbomb)),
        Hostile("zstd-frame-declaring-4GiB", _with_batch({1: 100, 3: F.KIND_UPDATE | F.COMPRESSION_ZSTD}, zliar)),
        Hostile("gzip-bomb-256MiB", _with_batch({1: 100, 3: F.KIND_UPDATE | F.COMPRESSION_GZIP}, gbomb)),
        Hostile("pointer-4GiB-file", {**corpus()["plain"], "CURRENT": os.urandom(64) * 1024}),
    ]
    return cases


# Peak of Python allocations while reading a few-KiB destination whose bytes claim far more.
MEMORY_BUDGET = 8 << 20


@pytest.mark.parametrize("case", hostile_cases(), ids=lambda c: c.name)
def test_lengths_from_storage_allocate_nothing(case: Hostile, tmp_path: Path) -> None:
    write_destination(str(tmp_path / "d"), case.files)
    # Once untraced first: the first read in a process imports modules and fills caches,
    # which is no allocation the bytes asked for (and made the peak depend on test order).
    check_destination(str(tmp_path / "d"), FuzzFigures(), case.name)
    figures = FuzzFigures()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        check_destination(str(tmp_path / "d"), figures, case.name)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _assert_clean(figures)
    # A bignum really stored (1 MiB) is a big value; the JSON reader also writes it as
    # 2 MiB of hex text, which Arrow copies and this test's reader parses back.
    budget = MEMORY_BUDGET + (16 << 20 if "bignum" in case.name else 0)
    assert peak < budget, f"{case.name}: peak {peak / 2**20:.1f} MiB while reading"


_NATIVE_CHILD = textwrap.dedent(
    """
    import sys, logging
    logging.disable(logging.CRITICAL)
    sys.path[:0] = [sys.argv[1]]
    sys.path.append(sys.argv[2])
    import test_hostile_input as t
    from hostile_input import FuzzFigures, check_destination, write_destination
    # Arrow's allocator and the threads' malloc arenas reserve address space when first
    # used: read a sound destination once before any case is measured.
    from hostile_input import corpus
    write_destination(sys.argv[3], corpus()["plain"])
    check_destination(sys.argv[3], FuzzFigures(), "warm-up")

    def vm_peak():
        with open("/proc/self/status") as f:
            return [int(l.split()[1]) * 1024 for l in f if l.startswith("VmPeak")][0]

    cases = t.hostile_cases()
    figures = FuzzFigures()
    for case in cases:
        write_destination(sys.argv[3], case.files)
        before = vm_peak()
        check_destination(sys.argv[3], figures, case.name)
        print(case.name, vm_peak() - before)
    print("escapes", figures.escapes)
    for e in figures.escape_examples:
        print(e)
    """
)

# Growth of the process's peak address space (VmPeak) allowed while reading one case.
NATIVE_BUDGET = 128 << 20


@pytest.mark.slow
def test_native_allocations_are_bounded_too(tmp_path: Path) -> None:
    """Allocations outside Python's allocator (zstd, zlib, cbor2's C code) stay bounded:
    each hostile case is read in a child process whose peak address space (VmPeak, which
    even an untouched multi-GiB malloc raises) is watched. A MemoryError would not show:
    the decoder turns any decompressor complaint into damage."""
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run(
        [sys.executable, "-c", _NATIVE_CHILD, here, os.path.dirname(here), str(tmp_path / "d")],
        capture_output=True, text=True, timeout=300,
        # One malloc arena: glibc reserves 128 MiB of address space for each new arena a
        # thread gets (a reader's thread, the first time a case starts one), which is not an
        # allocation the bytes asked for and would make VmPeak jump by it at random.
        env=dict(os.environ, PYTHONPATH=ROOT, MALLOC_ARENA_MAX="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    growth = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in lines if not line.startswith("escapes") and " " in line and line.rsplit(" ", 1)[1].lstrip("-").isdigit()}
    assert len(growth) == len(hostile_cases())
    over = {k: f"{v / 2**20:.0f} MiB" for k, v in growth.items() if v > NATIVE_BUDGET}
    assert not over, f"reading these grew the address space: {over}"
    assert "escapes 0" in lines, proc.stdout[-3000:]


# -- no code from the bytes -------------------------------------------------------------------


def test_only_registered_classes_are_constructed(tmp_path: Path) -> None:
    codec = persistlog.Codec()
    built: list[Any] = []

    @codec.register("app.Point")
    @dataclass
    class Point:
        x: int
        y: int

        def __post_init__(self) -> None:
            built.append(self)

    # Unchained, so that a batch put in with valid CRCs reaches the codec: what is checked
    # here is what decoding builds, not the hash chain (test_hash_chain.py refuses such a batch).
    lg = persistlog.open(str(tmp_path / "log"), lambda emit: None, codec=codec, hash_chain=False)
    lg.update(Point(1, 2))
    lg.close()
    # Append a batch of records naming classes the app never registered, with valid CRCs.
    evil = [
        cbor2.CBORTag(27, ["builtins.eval", ["__import__('os').system('false')"]]),
        cbor2.CBORTag(27, ["app.Point", {"x": 1}]),  # registered name, bad fields
        cbor2.CBORTag(27, ["subprocess.Popen", [["false"]]]),
        cbor2.CBORTag(35, "(a+)+$"),
        cbor2.CBORTag(36, "Content-Type: text/plain\r\n\r\nhello"),
        cbor2.CBORTag(999999, {"__class__": "object"}),
    ]
    out: list[Any] = []
    for record in evil:
        path = tmp_path / f"d{len(out)}"
        files = {n: (tmp_path / "log" / n).read_bytes() for n in os.listdir(tmp_path / "log") if n.endswith(".plog")}
        name = sorted(files)[-1]
        seg = files[name]
        off, size = batches(seg)[-2]
        fields = list(F.BATCH_HEADER.unpack(seg[off:off + F.BATCH_HEADER.size]))
        payload = cbor2.dumps(record)
        fields[0] = fields[1] = len(payload)
        fields[2], fields[3] = 1, F.KIND_UPDATE
        files[name] = splice_batch(seg, off, size, reframe(fields, payload))
        write_destination(str(path), files)
        got: list[Any] = []
        try:
            persistlog.restore(str(path), got.append, codec=codec)
        except persistlog.CorruptLogError:
            got.append("corrupt")
        except persistlog.CodecError as e:
            assert e.type_name == "app.Point" and isinstance(e.__cause__, TypeError)
            got.append("codec")
        out.append(got[-1])
    assert len(built) == 1  # only the Point the app logged, when it was logged
    assert isinstance(out[0], cbor2.CBORTag) and out[0].tag == 27
    # A registered class refusing intact fields is the app's CodecError: not damage, not a crash.
    assert out[1] == "codec"
    assert isinstance(out[2], cbor2.CBORTag)
    assert isinstance(out[3], cbor2.CBORTag) and not isinstance(out[3], re.Pattern)
    assert isinstance(out[4], cbor2.CBORTag)
    assert isinstance(out[5], cbor2.CBORTag)
    assert all(not foreign_types(o) for o in out if o not in ("corrupt", "codec"))

"""Encrypted and hash-chained logs through the Spark source: option ``keyProvider`` names
an importable key provider (never a key) that every executor imports; a missing or wrong
key is persistlog's KeyUnavailableError; the chain is checked across partitions and logs
as restore checks it, so a batch dropped where one log ends fails a strict read."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import shutil
import sys
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

import persistlog
from spark_replay._job import main
from spark_replay._options import ReadOptions
from spark_replay._plan import plan
from spark_replay._scan import read_problems, read_records

# The test keys of tests/persistlog/crypt_keys.py, imported by name as the executors do
# (the worktree is on their path; ``tests`` is a namespace package).
PROVIDER = "tests.persistlog.crypt_keys:provider"
WRONG = "tests.persistlog.crypt_keys:wrong"


@pytest.fixture(scope="module")
def keys() -> Any:
    pytest.importorskip("cryptography")
    import importlib

    return importlib.import_module("tests.persistlog.crypt_keys")


@pytest.fixture(scope="module")
def tamper() -> Any:
    sys.path.insert(0, str(Path(__file__).parent.parent / "persistlog"))
    try:
        import tamper as module
    finally:
        sys.path.pop(0)
    return module


def write(url: str, *, encrypted: bool, rotations: int = 2, updates: int = 40) -> None:
    """The same ResourceStore history every time: ``rotations`` rotations, small segments."""
    options: dict[str, Any] = {}
    if encrypted:
        from tests.persistlog.crypt_keys import provider

        options = {"key_provider": provider, "key_id": lambda: ("2026-10", "2026-11")[state["r"] % 2]}
    state = {"r": 0}
    store = persistlog.ResourceStore.open(url, rotate_bytes=None, retain=50, segment_bytes=4096, **options)
    try:
        for r in range(rotations + 1):
            state["r"] = r
            for i in range(updates):
                store[f"k{i % 17}"] = {"r": r, "i": i, "secret": "s3cr3t-" + "v" * 50}
            store.log.sync()
            if r < rotations:
                store.log.rotate()
    finally:
        store.close()


# Rows of write()'s history: its updates, and the snapshot of 17 keys each rotation writes.
TOTAL = 3 * 40 + 2 * 17


def rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((r["log_seq"], r["lsn"], r["kind"], r["record"], r["key"], r["value"]) for r in df.collect())


def spark_error(df: Any) -> str:
    with pytest.raises(Exception) as caught:
        df.collect()
    return str(caught.value)


@pytest.fixture
def logs(tmp_path: Path, keys: Any) -> Iterator[tuple[str, str]]:
    plain, sealed = str(tmp_path / "plain"), str(tmp_path / "sealed")
    write(plain, encrypted=False)
    write(sealed, encrypted=True)
    yield plain, sealed


# -- keyProvider ---------------------------------------------------------------------------


@pytest.mark.spark
def test_an_encrypted_log_reads_as_the_same_log_in_clear(spark: Any, logs: tuple[str, str]) -> None:
    plain, sealed = logs
    with open(os.path.join(sealed, sorted(n for n in os.listdir(sealed) if n.endswith(".plog"))[0]), "rb") as f:
        assert b"s3cr3t" not in f.read()
    expected = rows(spark.read.format("persistlog").option("convention", "resource").load(plain))
    got = rows(
        spark.read.format("persistlog").option("convention", "resource").option("keyProvider", PROVIDER)
        .option("max_partition_bytes", "64k").load(sealed)
    )
    assert len(expected) == TOTAL and got == expected


@pytest.mark.spark
def test_a_read_without_the_key_fails_with_key_unavailable(spark: Any, logs: tuple[str, str]) -> None:
    _plain, sealed = logs
    message = spark_error(spark.read.format("persistlog").load(sealed))
    assert "KeyUnavailableError" in message and "no key provider was given" in message
    # No CorruptLogError raised (the traceback's source lines may name the class in an
    # except clause the error went through).
    assert "CorruptLogError:" not in message
    message = spark_error(spark.read.format("persistlog").option("keyProvider", WRONG).load(sealed))
    assert "KeyUnavailableError" in message and "is not the key this batch was sealed with" in message
    assert "CorruptLogError:" not in message


def test_a_provider_name_that_does_not_import_is_refused_at_once() -> None:
    for bad, says in [
        ("crypt_keys", "needs MODULE:CALLABLE"),
        ("no_such_module_here:provider", "cannot import it"),
        ("tests.persistlog.crypt_keys:KEYS", "must be a callable"),
    ]:
        with pytest.raises(ValueError, match="option keyProvider") as caught:
            ReadOptions.parse({"path": "/nowhere", "keyProvider": bad})
        assert says in str(caught.value)


@pytest.mark.spark
def test_no_key_shows_in_the_plan_or_the_partitions(spark: Any, logs: tuple[str, str], keys: Any) -> None:
    _plain, sealed = logs
    df = spark.read.format("persistlog").option("keyProvider", PROVIDER).load(sealed)
    out = io.StringIO()
    with redirect_stdout(out):
        df.explain(True)
    parts = plan(ReadOptions.parse({"path": sealed, "keyProvider": PROVIDER, "max_partition_bytes": "64k"}))
    shown = out.getvalue() + repr(parts) + repr(df.schema) + str(df.collect()[:3])
    for key in [*keys.KEYS.values(), *keys.WRONG.values()]:
        for form in (key.hex(), repr(key), key.decode("latin-1")):
            assert form not in shown
    for p in parts:  # what travels to the executors: the provider's name only
        assert p.key_provider == PROVIDER
        assert all(key not in pickle.dumps(p) for key in keys.KEYS.values())


@pytest.mark.spark
def test_a_stream_follows_an_encrypted_log(spark: Any, logs: tuple[str, str]) -> None:
    plain, sealed = logs
    expected = rows(spark.read.format("persistlog").option("convention", "resource").load(plain))
    query = (
        spark.readStream.format("persistlog").option("convention", "resource").option("keyProvider", PROVIDER)
        .option("startingPosition", "earliest").option("maxRecordsPerTrigger", "25").load(sealed)
        .writeStream.format("memory").queryName("encrypted_stream").start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert rows(spark.table("encrypted_stream")) == expected


@pytest.mark.spark
def test_the_replay_job_takes_key_provider(spark: Any, logs: tuple[str, str], tmp_path: Path, capsys: Any) -> None:
    _plain, sealed = logs
    out = tmp_path / "out"
    assert main([sealed, "--out", str(out), "--key-provider", PROVIDER, "-q"], spark=spark, stdout=io.StringIO()) == 0
    assert spark.read.parquet(str(out / "events")).count() == TOTAL
    assert spark.read.parquet(str(out / "state")).count() == 17
    capsys.readouterr()
    assert main([sealed, "--out", str(tmp_path / "none"), "-q"], spark=spark, stdout=io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "KeyUnavailableError" in err and "--key-provider" in err and "CorruptLogError" not in err
    assert not (tmp_path / "none").exists()


# -- the hash chain across partitions and logs ----------------------------------------------


def drop_last_batch_of_log(tamper: Any, url: str, seq: int) -> int:
    """Drop the last record batch of log ``seq`` and hide it from every check but the chain
    between logs: LSNs renumbered, and the links recomputed up to the end of log ``seq``
    and from the start of the next log on (which still links to the head log ``seq`` had).
    Returns how many records it held."""
    segments = tamper.load(url)
    later = [s for s in segments if s.seq > seq]
    assert later and later[0].batches[0].link is not None
    next_link = later[0].batches[0].link
    batches = [(s, i) for s, i, _b in tamper.record_batches(segments) if s.seq == seq]
    seg, index = batches[-1]
    dropped: int = seg.batches.pop(index).count
    tamper.renumber(segments)
    tamper.relink([s for s in segments if s.seq <= seq])
    tamper.relink(later, head=next_link)
    tamper.save(url, segments)
    return dropped


def test_a_batch_dropped_at_the_end_of_a_log_fails_the_partition_reader(tmp_path: Path, tamper: Any) -> None:
    url = str(tmp_path / "log")
    write(url, encrypted=False, rotations=1)
    drop_last_batch_of_log(tamper, url, 1)
    opts = ReadOptions.parse({"path": url, "max_partition_bytes": "64k"})
    with pytest.raises(persistlog.CorruptLogError, match="hash chain broken between logs 1 and 2"):
        for p in plan(opts):
            list(read_records(pickle.loads(pickle.dumps(p))))
    skip = ReadOptions.parse({"path": url, "recovery": "skip"})
    found = [row for p in plan(skip) for row in read_problems(p)]
    assert [(r[0], r[2], r[5]) for r in found] == [(1, "00000000000000000002-0000000000.plog", "skipped")]
    assert found[0][6].startswith("hash chain broken between logs 1 and 2: ")


@pytest.mark.spark
def test_a_broken_chain_fails_the_spark_read_and_the_job_unless_skip(
    spark: Any, tmp_path: Path, tamper: Any, capsys: Any, caplog: Any
) -> None:
    url = str(tmp_path / "log")
    write(url, encrypted=False, rotations=2)
    dropped = drop_last_batch_of_log(tamper, url, 2)
    message = spark_error(spark.read.format("persistlog").option("max_partition_bytes", "64k").load(url))
    assert "CorruptLogError" in message and "hash chain broken between logs 2 and 3" in message
    out = tmp_path / "out"
    assert main([url, "--out", str(out), "-q"], spark=spark, stdout=io.StringIO()) == 1
    assert "hash chain broken between logs 2 and 3" in capsys.readouterr().err
    with caplog.at_level(logging.ERROR):
        assert main([url, "--out", str(out), "--recovery", "skip", "-q"], spark=spark, stdout=io.StringIO()) == 0
    corrupt = spark.read.parquet(str(out / "_corrupt")).collect()
    assert [(r["log_seq"], r["kind"]) for r in corrupt] == [(2, "skipped")]
    assert corrupt[0]["reason"].startswith("hash chain broken between logs 2 and 3: ")
    assert spark.read.parquet(str(out / "events")).count() == TOTAL - dropped
    shutil.rmtree(out)


def test_the_stream_tail_checks_an_encrypted_batch_without_its_key(logs: tuple[str, str]) -> None:
    """What the header walk of a micro-batch could not take (a batch that grew past the size
    it read) is checked for its structure only: the driver holds no key."""
    from destinations import open_destination
    from persistlog._read.cursor import Cursor
    from persistlog._format import constants as F
    from persistlog._read.reader import walk_headers
    from spark_replay._tail import Tail

    _plain, sealed = logs
    dest = open_destination(sealed)
    try:
        name = F.segment_name(1, 0)
        walk = walk_headers(dest, 1, 0, name, dest.size(name), whole=True)
        assert walk.batches is not None
        # A record batch: one the next batch's first LSN comes after.
        offset, lsn, _size = next(b for b, after in zip(walk.batches, walk.batches[1:]) if after[1] > b[1])
        assert Tail(dest)._check_rest(Cursor(1, 0, offset, lsn), name, final=False) is True
    finally:
        dest.close()


# -- the heads view --------------------------------------------------------------------------


@pytest.mark.spark
def test_the_heads_view_lists_every_signed_head(spark: Any, tmp_path: Path, keys: Any, tamper: Any) -> None:
    """Every signed checkpoint and seal, with the LSN and chain head it signs and its key's
    id; encrypted payloads need no key for it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from persistlog._format import constants as F

    signing = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    public = signing.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    url = str(tmp_path / "signed")
    store = persistlog.ResourceStore.open(
        url, rotate_bytes=None, retain=50, segment_bytes=4096, signing_key=signing, sign_interval=1e-9,
        key_provider=keys.provider, key_id="2026-10",
    )
    for r in range(3):
        for i in range(5):
            store[f"k{i}"] = {"r": r, "i": i}
            store.log.sync()
        if r < 2:
            store.log.rotate()
    store.close()
    expected = []
    for seg in tamper.load(url):
        for i, b in enumerate(seg.batches):
            t = b.control_type()
            if t in (F.CONTROL_CHECKPOINT, F.CONTROL_SEAL):
                c = b.controls()[0]
                lsn = c["lsn"] if t == F.CONTROL_CHECKPOINT else c["next_lsn"]
                assert b.link is not None
                expected.append((seg.seq, seg.number, tamper.offset_of(seg, i), t, lsn, b.link.hex(), c["key"]))
    got = [tuple(r) for r in spark.read.format("persistlog").option("view", "heads").load(url).collect()]
    assert sorted(got) == sorted(expected)
    assert {r[3] for r in got} == {"checkpoint", "seal"} and len([r for r in got if r[3] == "seal"]) == 3  # each log, the last at close
    assert {r[6] for r in got} == {hashlib.sha256(public).hexdigest()[:16]}

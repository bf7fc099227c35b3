"""The hash chain (docs/DESIGN.md invariant 8; format version 2, docs/FORMAT.md "Hash
chain"): every batch links to the SHA-256 of the batch before it, across segments and logs,
and every reader checks it.

The hostile cases edit the files as someone who can write the bucket would, with every
CRC (and LSN) fixed (``tamper``): only the chain can tell. With every hash recomputed as
well, the chain alone proves nothing, which the last test pins down (signed checkpoints
are what catch that).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest
import tamper
from kv_app import App, restore_state
from log_files import crash

import persistlog
from persistlog._format import chain
from persistlog._format import constants as F
from persistlog.cli import main

# Every case reads with the decoder's batch checks in C and with the Python checks alone.
pytestmark = pytest.mark.usefixtures("batch_checks")


def cli(*argv: str) -> tuple[int, str]:
    """``persistlog ARGV`` in this process: (exit status, what it printed)."""
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        status = main(list(argv))
    return status, out.getvalue()


def write(url: str, *, rotations: int = 2, updates: int = 6, **options: Any) -> App:
    """Logs of a few segments each (small segments), ``rotations`` + 1 logs, sealed."""
    app = App({"seed": 0})
    app.open(url, durability="fsync", segment_bytes=4096, retain=10, **options)
    for r in range(rotations + 1):
        for i in range(updates):
            app.put(f"k{r}.{i}", "v" * 700)  # about one segment every five updates
        if r < rotations:
            app.log.rotate()  # type: ignore[union-attr]
    app.log.close()  # type: ignore[union-attr]
    return app


def sha256(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()


def test_each_batch_links_to_the_sha256_of_the_one_before_across_segments_and_logs(log_dir: str) -> None:
    write(log_dir)
    segments = tamper.load(log_dir)
    assert {s.version for s in segments} == {F.SHARED_VERSION} and len({s.seq for s in segments}) == 3
    assert max(s.number for s in segments) >= 1  # the chain crosses segments
    head = bytes(32)  # the genesis link: nothing before log 1
    heads = {}
    for seg in segments:
        for b in seg.batches:
            assert b.flags & F.FLAG_LINKED and b.link == head, (seg.name, b.first_lsn)
            if b.control_type() == "seal":
                assert b.controls()[0]["chain"] == head
                heads[seg.seq] = head
                continue  # off the line: the next log was linked before the seal
            head = sha256(b.to_bytes())
    first = {s.seq: s.batches[0] for s in segments if s.number == 0}
    assert first[2].link == heads[1] and first[3].link == heads[2]
    assert restore_state(log_dir)[1].logs == [3]


def test_hash_chain_false_writes_format_version_1(log_dir: str) -> None:
    write(log_dir, rotations=1, hash_chain=False)
    segments = tamper.load(log_dir)
    assert {s.version for s in segments} == {1}
    assert all(b.link is None for s in segments for b in s.batches)
    assert "chain" not in [b for b in segments[-1].batches if b.control_type() == "seal"][0].controls()[0]
    restore_state(log_dir)


def test_the_chain_runs_on_over_a_crash_and_a_reopen(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, durability="fsync")
    app.put("b", 2)
    crash(lg)
    state, _ = restore_state(log_dir)
    app2 = App(state)
    app2.open(log_dir, durability="fsync")
    app2.put("c", 3)
    app2.log.close()  # type: ignore[union-attr]
    segments = tamper.load(log_dir)
    log1 = [b for s in segments if s.seq == 1 for b in s.batches]
    log2_header = next(s for s in segments if s.seq == 2).batches[0]
    assert log2_header.link == sha256(log1[-1].to_bytes())  # unsealed: its last batch is the head
    status, out = cli("verify", log_dir)
    assert status == 0, out


def edit_a_record(log_dir: str) -> tuple[str, int]:
    """Change one byte of a record in a middle batch of the newest log (what a restore
    reads), fixing its CRCs; returns where the break shows: the batch after it."""
    segments = tamper.load(log_dir)
    newest = max(s.seq for s in segments)
    batches = [found for found in tamper.record_batches(segments) if found[0].seq == newest]
    seg, index, b = batches[len(batches) // 2]
    at = b.body.index(b"vvvv")
    b.body = b.body[:at] + b"w" + b.body[at + 1:]
    tamper.save(log_dir, segments)
    nxt = (seg, index + 1) if index + 1 < len(seg.batches) else (segments[segments.index(seg) + 1], 0)
    return nxt[0].name, tamper.offset_of(*nxt)


def test_edit_one_byte_and_fix_its_crc(log_dir: str) -> None:
    write(log_dir)
    name, offset = edit_a_record(log_dir)
    with pytest.raises(persistlog.CorruptLogError) as info:
        restore_state(log_dir)
    e = info.value
    assert (e.destination, e.segment, e.offset) == (log_dir, name, offset)
    assert "hash chain broken" in str(e) and e.log == int(name[:20])
    state, result = restore_state(log_dir, recovery="skip")
    assert [(s.segment, s.offset) for s in result.skipped] == [(name, offset)]
    assert "hash chain broken" in result.skipped[0].reason
    status, out = cli("verify", log_dir)
    assert status == 1 and f"CORRUPT: log {e.log} segment {name} offset {offset}" in out
    assert "hash chain broken" in out


def test_batches_hashed_off_the_reading_thread_are_checked_alike(log_dir: str) -> None:
    """A batch of ``chain.OFFLOAD_BYTES`` or more is hashed on another thread while the
    reader goes on: an edit in one is still named at the batch after it, and the chain
    head reported at the end is the hash of the last batch."""
    app = App({"seed": 0})
    app.open(log_dir, durability="fsync", retain=10)
    for i in range(6):
        app.put(f"k{i}", "v" * (chain.OFFLOAD_BYTES + 1000))  # one batch each, all offloaded
    app.log.close()  # type: ignore[union-attr]
    assert restore_state(log_dir)[0] == app.data
    assert any(t.name.startswith("persistlog-hash") for t in threading.enumerate())  # offloaded
    status, out = cli("info", "--json", log_dir)
    segments = tamper.load(log_dir)
    newest = max(s.seq for s in segments)
    moving = [b for s in segments if s.seq == newest for b in s.batches if b.control_type() != "seal"]
    assert status == 0 and json.loads(out)["logs"][-1]["chain_head"] == sha256(moving[-1].to_bytes()).hex()
    name, offset = edit_a_record(log_dir)
    with pytest.raises(persistlog.CorruptLogError, match="hash chain broken") as info:
        restore_state(log_dir)
    assert (info.value.segment, info.value.offset) == (name, offset)


def test_a_forked_child_hashes_on_a_thread_of_its_own(log_dir: str) -> None:
    """The hashing thread of the parent does not exist in a child forked after it started
    (a Spark worker, say): the child's reads make their own."""
    app = App({"seed": 0})
    app.open(log_dir, durability="fsync")
    for i in range(3):
        app.put(f"k{i}", "v" * (chain.OFFLOAD_BYTES + 1000))
    app.log.close()  # type: ignore[union-attr]
    assert restore_state(log_dir)[0] == app.data  # the parent's thread is started
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if the same state comes back
        try:
            os._exit(0 if restore_state(log_dir)[0] == app.data else 1)
        finally:
            os._exit(2)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's restore hung")


def test_drop_a_batch(log_dir: str) -> None:
    write(log_dir, rotations=0, updates=8)
    segments = tamper.load(log_dir)
    seg, index, _ = tamper.record_batches(segments)[4]
    del seg.batches[index]
    tamper.renumber(segments)  # the LSNs no longer tell
    tamper.save(log_dir, segments)
    with pytest.raises(persistlog.CorruptLogError) as info:
        restore_state(log_dir)
    assert "hash chain broken" in str(info.value)
    assert (info.value.segment, info.value.offset) == (seg.name, tamper.offset_of(seg, index))


def test_swap_two_segments(log_dir: str) -> None:
    write(log_dir, rotations=0, updates=20)
    segments = tamper.load(log_dir)
    log1 = [s for s in segments if s.seq == 1]
    assert len(log1) >= 4
    a, b = log1[1], log1[2]
    a.batches, b.batches = b.batches, a.batches
    tamper.renumber(segments)
    tamper.save(log_dir, segments)
    with pytest.raises(persistlog.CorruptLogError) as info:
        restore_state(log_dir)
    assert "hash chain broken" in str(info.value)
    assert (info.value.segment, info.value.offset) == (a.name, F.SEGMENT_HEADER_SIZE)


def test_replay_an_older_log_in_place_of_a_newer_one(log_dir: str, tmp_path: Any) -> None:
    """Log 2's files replaced by log 1's, renamed and renumbered: its header links to the
    genesis, not to where log 1's chain ends."""
    write(log_dir, rotations=2)
    segments = tamper.replace_log(tamper.load(log_dir), 2, 1)
    tamper.renumber(segments)
    tamper.save(log_dir, segments)
    status, out = cli("verify", log_dir)
    assert status == 1
    assert f"CORRUPT: log 2 segment {F.segment_name(2, 0)} offset {F.SEGMENT_HEADER_SIZE}" in out
    assert "the log before it ends at chain head" in out


def test_a_writer_that_recomputes_every_hash_is_not_caught_by_the_chain_alone(log_dir: str) -> None:
    """What the chain does not prove (docs/SECURITY.md): without a signature, a full
    rewrite reads as sound."""
    write(log_dir, rotations=1)
    segments = tamper.load(log_dir)
    _, _, b = tamper.record_batches(segments)[3]
    at = b.body.index(b"vvvv")
    b.body = b.body[:at] + b"w" + b.body[at + 1:]
    tamper.save(log_dir, segments, relink_all=True)
    status, out = cli("verify", log_dir)
    assert status == 0, out


def test_a_follower_and_a_read_from_a_position_check_the_chain(log_dir: str, tmp_path: Any) -> None:
    write(log_dir, rotations=0, updates=8)
    pristine = str(tmp_path / "pristine")
    shutil.copytree(log_dir, pristine)
    edit_a_record(log_dir)
    with pytest.raises(persistlog.CorruptLogError, match="hash chain broken"):
        list(persistlog.read(log_dir))
    follower = persistlog.follow(log_dir, lambda record: None)
    with pytest.raises(persistlog.CorruptLogError, match="hash chain broken"):
        follower.poll()
    follower.stop()
    assert len(list(persistlog.read(pristine))) == 9
    assert persistlog.follow(pristine, lambda record: None).poll() == 9


def test_a_follower_checks_the_links_between_its_polls(log_dir: str) -> None:
    """Segments and logs written after a follower's last poll must continue the chain it
    read: a log put in place of the one it was about to read is a break, even though each
    scan starts where the last one ended."""
    app = App({"seed": 0})
    app.open(log_dir, durability="fsync", segment_bytes=4096, retain=10)
    for i in range(4):
        app.put(f"a{i}", "v" * 700)
    follower = persistlog.follow(log_dir, lambda record: None)
    assert follower.poll() == 5
    app.log.rotate()  # type: ignore[union-attr]
    for i in range(8):
        app.put(f"b{i}", "v" * 700)  # across segments of log 2
    app.log.close()  # type: ignore[union-attr]
    pristine = tamper.load(log_dir)
    segments = tamper.replace_log(pristine, 2, 1)  # log 2 becomes a copy of log 1
    tamper.renumber(segments)
    tamper.save(log_dir, segments, relink_all=False)
    with pytest.raises(persistlog.CorruptLogError, match="hash chain broken") as info:
        follower.poll()
    assert (info.value.log, info.value.segment, info.value.offset) == (2, F.segment_name(2, 0), F.SEGMENT_HEADER_SIZE)
    follower.stop()

"""One pass over a segment's batch headers (``walk_headers``) tells what planning needs of a
log -- its first LSN, its header record, whether it follows a gap, its complete marker --
exactly as a full scan and ``declares_gap`` tell it, from one read where the snapshot is
small; damage ends the walk and says where."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from crashsim import CrashSim
from hypothesis import given
from hypothesis import strategies as st
from hypothesis_profiles import active_profile
from secondary_crashes import crash_with_secondary_behind, restart_and_crash_on_the_secondary

import persistlog
from destinations import Destination, open_destination
from persistlog._format import constants as F
from persistlog._read.reader import WALK_CHUNK, LogScanner, declares_gap, list_logs, walk_headers


class CountingReads:
    """``dest``'s reads, counted (everything else passes through)."""

    def __init__(self, dest: Destination) -> None:
        self.dest = dest
        self.reads = 0

    def read(self, name: str, offset: int, length: int) -> bytes:
        self.reads += 1
        return self.dest.read(name, offset, length)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dest, name)


def _write(url: str, snapshot: int, updates: int, rotations: int, value: int) -> None:
    """A log whose snapshots hold ``snapshot`` records of ``value`` bytes, rotated
    ``rotations`` times with ``updates`` updates in each log."""
    state = {f"k{i}": "v" * value for i in range(snapshot)}
    lg = persistlog.open(url, lambda emit: [emit({"k": k, "v": v}) for k, v in state.items()],
                         rotate_bytes=None, discard_existing=True)
    for r in range(rotations + 1):
        for i in range(updates):
            lg.update({"k": f"u{r}-{i}", "v": i})
        if r < rotations:
            lg.rotate()
    lg.close()


def _check_against_a_scan(url: str) -> None:
    dest = open_destination(url)
    for seq, segments in list_logs(dest).items():
        number, name = segments[0]
        assert number == 0
        scanner = LogScanner(dest, seq, segments, recovery="skip")
        for _batch in scanner:
            pass
        state = scanner.state
        walk = walk_headers(dest, seq, 0, name, dest.size(name))
        assert walk.damage is None or walk.damage.offset > F.SEGMENT_HEADER_SIZE  # at most a seal trailer
        assert walk.first_lsn == state.first_lsn
        assert walk.header == state.header
        assert walk.after_gap == declares_gap(dest, segments)
        assert walk.done
        if walk.complete_lsn is not None or len(segments) == 1:
            assert walk.complete_lsn == state.complete_lsn


@pytest.mark.slow
@given(
    snapshot=st.integers(0, 150),
    updates=st.integers(0, 30),
    rotations=st.integers(0, 2),
    value=st.sampled_from([1, 100, 800]),
    limit=st.integers(F.SEGMENT_HEADER_SIZE, 200_000),
)
@active_profile(max_examples=10)
def test_walk_tells_what_a_scan_tells(
    tmp_path_factory: Any, snapshot: int, updates: int, rotations: int, value: int, limit: int
) -> None:
    url = str(tmp_path_factory.mktemp("walk") / "log")
    _write(url, snapshot, updates, rotations, value)
    _check_against_a_scan(url)
    # With a limit, the walk reads the start once and stops there; it is done where it
    # reached the marker (or the end), and then it tells the same.
    dest = open_destination(url)
    for seq, segments in list_logs(dest).items():
        name = segments[0][1]
        size = dest.size(name)
        whole = walk_headers(dest, seq, 0, name, size)
        counted = CountingReads(dest)
        start = walk_headers(counted, seq, 0, name, size, limit=limit)  # type: ignore[arg-type]
        assert (start.first_lsn, start.header) == (whole.first_lsn, whole.header)
        if start.done:
            assert start.complete_lsn == whole.complete_lsn
        else:
            assert start.complete_lsn is None and whole.complete_lsn is not None or not whole.done
        if size <= min(limit, WALK_CHUNK):
            assert start.done and counted.reads == 1


def test_a_log_after_a_gap_says_so(tmp_path: Path) -> None:
    """The secondary's writer died behind; its next writer's first log there declares the
    gap: the walk reads it from the header as declares_gap does."""
    sec_url, acked = crash_with_secondary_behind("local", tmp_path, CrashSim(), lease_ttl=0.4)
    restart_and_crash_on_the_secondary("local", tmp_path, sec_url, acked)
    dest = open_destination(sec_url)
    gaps = [seq for seq, segments in list_logs(dest).items()
            if walk_headers(dest, seq, 0, segments[0][1], dest.size(segments[0][1])).after_gap]
    assert len(gaps) == 1
    _check_against_a_scan(sec_url)


def test_damage_ends_the_walk_and_says_where(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    _write(url, 10, 5, 0, 10)
    dest = open_destination(url)
    (seq, segments), = list_logs(dest).items()
    name = segments[0][1]
    path = os.path.join(url, name)
    data = bytearray(Path(path).read_bytes())
    # Another log's segment under this name: the segment header names the wrong log.
    walk = walk_headers(dest, seq + 1, 0, name, len(data))
    assert walk.first_lsn is None and walk.damage is not None and "log 1 segment 0" in walk.damage.reason
    # A flipped byte in the segment header.
    data[9] ^= 0xFF
    Path(path).write_bytes(data)
    walk = walk_headers(dest, seq, 0, name, len(data))
    assert walk.first_lsn is None and walk.header is None and walk.done
    assert walk.damage is not None and walk.damage.offset == 0
    # A flipped byte in the header batch's payload: the first LSN is known, nothing after.
    data[9] ^= 0xFF
    data[F.SEGMENT_HEADER_SIZE + F.BATCH_HEADER_SIZE + 2] ^= 0xFF
    Path(path).write_bytes(data)
    walk = walk_headers(dest, seq, 0, name, len(data))
    assert walk.first_lsn == F.FIRST_LSN and walk.header is None and walk.complete_lsn is None
    assert walk.damage is not None and walk.damage.offset == F.SEGMENT_HEADER_SIZE

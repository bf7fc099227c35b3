"""Segment sizes taken from a listing: ``list_logs_sized`` lists each segment with its size
in one listing, and a ``LogScanner`` handed those sizes reads each segment as it was
listed, asking the destination for no size (a plan's listing, reused by the task that
reads the log)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import persistlog
from destinations import Destination, open_destination
from persistlog.reading import LogScanner, list_logs, list_logs_sized


class CountingSizes:
    """``dest``'s size look-ups, counted (everything else passes through)."""

    def __init__(self, dest: Destination) -> None:
        self.dest = dest
        self.sizes = 0

    def size(self, name: str) -> int:
        self.sizes += 1
        return self.dest.size(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dest, name)


@pytest.mark.usefixtures("clean_memory_fs")
@pytest.mark.parametrize("where", ["local", "memory"])
def test_list_logs_sized_is_list_logs_with_each_segments_size(tmp_path: Path, where: str) -> None:
    url = str(tmp_path / "log") if where == "local" else "memory://sized/log"
    lg = persistlog.open(url, lambda emit: None, rotate_records=3)
    for i in range(10):
        lg.update({"i": i})
    lg.close()
    dest = open_destination(url)
    listing, sizes = list_logs_sized(dest)
    assert listing == list_logs(dest) and len(listing) > 1
    assert sizes == {name: dest.size(name) for segments in listing.values() for _n, name in segments}


def test_a_scan_given_the_listed_sizes_reads_segments_as_listed_and_asks_no_size(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    lg = persistlog.open(url, lambda emit: None, rotate_bytes=None)
    lg.update_many([{"i": i} for i in range(5)])
    lg.sync()
    listing, sizes = list_logs_sized(open_destination(url))
    lg.update_many([{"i": i} for i in range(5, 9)])  # written after the listing
    lg.sync()
    ((seq, segments),) = listing.items()
    dest = CountingSizes(open_destination(url))
    listed = LogScanner(dest, seq, segments, sizes=sizes)
    records = sum(b.header.count for b in listed if not b.is_control)
    assert records == 5 and dest.sizes == 0
    assert listed.state.torn is None and listed.state.next_lsn == 6
    live = LogScanner(dest, seq, segments)
    assert sum(b.header.count for b in live if not b.is_control) == 9 and dest.sizes == 1
    lg.close()

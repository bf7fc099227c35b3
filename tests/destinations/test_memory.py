"""memory:// through the object-store driver: the conformance suite plus retry behaviour."""

from __future__ import annotations

import errno
import uuid
from typing import Iterator

import pytest
from conformance import DestinationConformance, LeaseConformance, MakeDest

from destinations import open_destination
from destinations.objectstore import ObjectStoreDestination


class TestMemory(DestinationConformance, LeaseConformance):
    # memory:// checks existence then writes: two threads can both win.
    race_free_create = False

    @pytest.fixture
    def make_dest(self, clean_memory_fs: None) -> Iterator[MakeDest]:
        base = f"memory://t{uuid.uuid4().hex[:8]}"

        def make(subdir: str = "log") -> ObjectStoreDestination:
            dest = open_destination(f"{base}/{subdir}")
            assert isinstance(dest, ObjectStoreDestination)
            return dest

        yield make


def test_memory_driver_defaults(clean_memory_fs: None) -> None:
    dest = open_destination("memory://x/log")
    assert isinstance(dest, ObjectStoreDestination)
    assert not dest.appendable
    assert dest.default_flush_interval < 0.1
    assert not dest.exists()
    dest.ensure()
    assert dest.exists()


def test_memory_stats_count_requests(clean_memory_fs: None) -> None:
    dest = open_destination("memory://x/log")
    dest.ensure()
    assert isinstance(dest, ObjectStoreDestination)
    dest.create("a", b"1")
    dest.replace("b", b"2")
    dest.read("a")
    dest.size("a")
    dest.list()
    dest.delete("a")
    assert dest.stats() == {"PUT": 2, "GET": 1, "LIST": 1, "DELETE": 1, "HEAD": 1}


def test_unused_errno_is_permanent() -> None:
    # Guard for the fault tests: ENOSPC must stay a permanent error.
    from destinations._retry import is_transient

    assert not is_transient(OSError(errno.ENOSPC, "full"))

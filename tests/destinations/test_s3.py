"""s3:// through the object-store driver against a real moto server on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import pytest
from conformance import DestinationConformance, LeaseConformance, MakeDest

from destinations import LockHeld, open_destination
from destinations.objectstore import ObjectStoreDestination

pytestmark = pytest.mark.s3


class TestS3(DestinationConformance, LeaseConformance):
    replace_rounds = 20  # each PUT is a real HTTP request

    @pytest.fixture
    def make_dest(self, s3_bucket: str, s3_storage_options: dict[str, Any]) -> Iterator[MakeDest]:
        def make(subdir: str = "log") -> ObjectStoreDestination:
            dest = open_destination(f"s3://{s3_bucket}/app/{subdir}", **s3_storage_options)
            assert isinstance(dest, ObjectStoreDestination)
            return dest

        yield make

    def test_missing_directory_lists_empty(self, make_dest: MakeDest) -> None:
        super().test_missing_directory_lists_empty(make_dest)
        assert not make_dest("never-made").exists()


def test_s3a_and_bucket_root(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    root = open_destination(f"s3a://{s3_bucket}", **s3_storage_options)
    root.ensure()
    assert root.exists()
    root.create("top", b"1")
    sub = open_destination(f"s3://{s3_bucket}/sub", **s3_storage_options)
    sub.create("inner", b"2")
    assert root.list() == ["top"]  # "sub/inner" is not a file of the root
    assert sub.list() == ["inner"]
    assert sub.exists()


def test_missing_bucket_is_a_clear_error(
    moto_server: str, s3_storage_options: dict[str, Any]
) -> None:
    dest = open_destination("s3://no-such-bucket-here/log", **s3_storage_options)
    assert isinstance(dest, ObjectStoreDestination)
    assert not dest.exists()
    with pytest.raises(FileNotFoundError, match="no-such-bucket-here"):
        dest.ensure()
    with pytest.raises(FileNotFoundError, match="no-such-bucket-here"):
        dest.list()
    with pytest.raises(FileNotFoundError):
        dest.create("a", b"1")
    assert dest.stats()["PUT"] == 1  # a missing bucket is permanent: not retried


@pytest.mark.slow
def test_list_pages_through_continuation_tokens(
    s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    dest = open_destination(f"s3://{s3_bucket}/log", **s3_storage_options)
    assert isinstance(dest, ObjectStoreDestination)
    names = [f"{i:020d}" for i in range(7)]
    for name in names:
        dest.create(name, b"x")
    dest.list_page_size = 2
    before = dest.stats()["LIST"]
    assert dest.list() == names
    assert dest.stats()["LIST"] - before == 4
    assert dest.list(start_after=names[4]) == names[5:]
    assert dest.stats()["LIST"] - before == 5


@pytest.mark.slow
def test_expired_lease_takeover_has_one_winner(
    s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    url = f"s3://{s3_bucket}/log"
    open_destination(url, **s3_storage_options).lock("dead-writer", ttl=0.2)
    time.sleep(0.3)
    winners: list[str] = []
    losers: list[str] = []
    barrier = threading.Barrier(4)

    def contender(i: int) -> None:
        dest = open_destination(url, **s3_storage_options)
        barrier.wait()
        try:
            dest.lock(f"writer-{i}", ttl=30)
            winners.append(f"writer-{i}")
        except LockHeld as e:
            losers.append(e.holder)

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1, (winners, losers)
    assert all(winners[0] in holder for holder in losers)


def test_requests_per_operation(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    dest = open_destination(f"s3://{s3_bucket}/log", **s3_storage_options)
    assert isinstance(dest, ObjectStoreDestination)
    dest.create("a", b"1")
    dest.replace("b", b"2")
    dest.read("a", 0, 1)
    dest.size("a")
    dest.list()
    dest.delete("a")
    assert dest.stats() == {"PUT": 2, "GET": 1, "LIST": 1, "DELETE": 1, "HEAD": 1}

"""The Destination contract, as a mixin test class every driver's test module opts into.

A driver's module subclasses :class:`DestinationConformance` and provides one fixture,
``make_dest``: a factory ``make_dest(subdir="log") -> Destination`` returning a new
instance (never a cached one) for the directory ``<base>/<subdir>`` of a fresh, per-test
base location. Two calls with the same ``subdir`` give two instances over the same place.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import pytest

from destinations import Destination, LockHeld, open_destination

MakeDest = Callable[..., Destination]


class DestinationConformance:
    """Contract tests shared by every driver."""

    # -- directory -------------------------------------------------------------------

    def test_missing_directory_lists_empty(self, make_dest: MakeDest) -> None:
        dest = make_dest("never-made")
        assert dest.list() == []
        assert dest.list(start_after="a") == []

    def test_a_missing_directory_is_described(self, make_dest: MakeDest) -> None:
        dest = make_dest("never-made")
        assert not dest.exists()
        why = dest.describe_missing()
        assert why == "the directory does not exist" or why.startswith("no object in bucket")

    def test_a_missing_directory_can_be_made(self, make_dest: MakeDest) -> None:
        dest = make_dest("never-made")
        assert dest.why_not_creatable() is None
        dest.ensure()
        assert dest.why_not_creatable() is None

    def test_ensure_is_idempotent_and_makes_it_exist(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        dest.ensure()
        dest.create("a", b"1")
        assert dest.exists()
        assert dest.list() == ["a"]

    # -- create / read / size ---------------------------------------------------------

    def test_create_then_read_back(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        payload = bytes(range(256)) * 50
        dest.create("seg", payload)
        assert dest.read("seg") == payload
        assert dest.size("seg") == len(payload)

    def test_create_empty_file(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        dest.create("empty", b"")
        assert dest.read("empty") == b""
        assert dest.size("empty") == 0

    def test_create_is_create_only(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        dest.create("seg", b"first")
        with pytest.raises(FileExistsError):
            dest.create("seg", b"second")
        with pytest.raises(FileExistsError):
            make_dest().create("seg", b"third")
        assert dest.read("seg") == b"first"

    def test_create_is_create_only_under_threads(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        winners: list[int] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(4)

        def racer(i: int) -> None:
            other = make_dest()
            barrier.wait()
            try:
                other.create("race", f"writer {i}".encode())
                winners.append(i)
            except FileExistsError:
                pass
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=racer, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        if self.race_free_create:
            assert len(winners) == 1
        assert len(winners) >= 1
        assert dest.read("race") in {f"writer {i}".encode() for i in winners}

    #: Whether concurrent creates of one name are guaranteed a single winner.
    race_free_create = True

    def test_read_ranges(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        dest.create("seg", b"0123456789")
        assert dest.read("seg", 0) == b"0123456789"
        assert dest.read("seg", 3) == b"3456789"
        assert dest.read("seg", 3, 4) == b"3456"
        assert dest.read("seg", 8, 100) == b"89"  # short at end of file
        assert dest.read("seg", 10) == b""
        assert dest.read("seg", 25, 5) == b""
        assert dest.read("seg", 4, 0) == b""
        with pytest.raises(ValueError):
            dest.read("seg", -1)

    def test_missing_file_raises_file_not_found(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        with pytest.raises(FileNotFoundError):
            dest.read("nope")
        with pytest.raises(FileNotFoundError):
            dest.read("nope", 5, 5)
        with pytest.raises(FileNotFoundError):
            dest.read("nope", 0, 0)
        with pytest.raises(FileNotFoundError):
            dest.size("nope")

    # -- replace / delete -------------------------------------------------------------

    def test_replace_creates_and_overwrites(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        dest.replace("CURRENT", b"one")
        assert dest.read("CURRENT") == b"one"
        dest.replace("CURRENT", b"two, longer")
        assert dest.read("CURRENT") == b"two, longer"
        dest.replace("CURRENT", b"3")
        assert dest.read("CURRENT") == b"3"
        assert dest.list() == ["CURRENT"]

    def test_replace_is_atomic_for_readers(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        versions = [bytes([i]) * (20_000 + i * 3_000) for i in range(2)]
        dest.replace("CURRENT", versions[0])
        reader = make_dest()
        seen: list[bytes] = []
        stop = threading.Event()

        def read_loop() -> None:
            while not stop.is_set():
                seen.append(reader.read("CURRENT"))

        thread = threading.Thread(target=read_loop)
        thread.start()
        try:
            for i in range(self.replace_rounds):
                dest.replace("CURRENT", versions[i % 2])
        finally:
            stop.set()
            thread.join()
        assert seen
        assert all(s in versions for s in seen)

    #: How many replaces the atomicity test races against a reader.
    replace_rounds = 60

    def test_delete_and_delete_missing(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        dest.create("a", b"1")
        dest.delete("a")
        assert dest.list() == []
        with pytest.raises(FileNotFoundError):
            dest.read("a")
        dest.delete("a")  # missing is fine
        dest.delete("never-was")
        dest.create("a", b"again")  # the name is free again
        assert dest.read("a") == b"again"

    # -- list -------------------------------------------------------------------------

    def test_list_is_sorted_and_honours_start_after(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        names = [f"{n:020d}-{s:04d}.seg" for n in (2, 10, 1) for s in (1, 0)] + ["CURRENT"]
        for name in names:
            dest.create(name, name.encode())
        assert dest.list() == sorted(names)
        assert dest.list(start_after=f"{2:020d}-{0:04d}.seg") == sorted(names)[3:]
        assert dest.list(start_after="00000000000000000002") == sorted(names)[2:]
        assert dest.list(start_after="ZZZZ") == []
        assert dest.list(start_after="") == sorted(names)

    def test_list_sizes_gives_every_listed_name_with_its_size(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        assert dest.list_sizes() == {}  # a missing directory lists as empty
        dest.ensure()
        data = {"b.seg": b"22", "a.seg": b"1", "CURRENT": b"", "c d.seg": b"x" * 1000}
        for name, body in data.items():
            dest.create(name, body)
        sizes = make_dest().list_sizes()
        assert list(sizes) == dest.list() == sorted(data)
        assert sizes == {name: len(body) for name, body in data.items()}
        dest.replace("b.seg", b"333")
        dest.delete("a.seg")
        assert make_dest().list_sizes() == {"CURRENT": 0, "b.seg": 3, "c d.seg": 1000}

    def test_list_sees_other_instances_writes_at_once(self, make_dest: MakeDest) -> None:
        writer, follower = make_dest(), make_dest()
        writer.ensure()
        assert follower.list() == []  # prime any cache the follower might keep
        writer.create("a", b"1")
        assert follower.list() == ["a"]
        assert follower.list(start_after="a") == []
        writer.create("b", b"2")
        assert follower.list(start_after="a") == ["b"]
        assert follower.size("b") == 1
        writer.replace("b", b"22")
        assert follower.size("b") == 2
        assert follower.read("b") == b"22"
        writer.delete("a")
        assert follower.list() == ["b"]

    def test_names_with_dots_and_spaces(self, make_dest: MakeDest) -> None:
        dest = make_dest("dir with space.and.dots")
        dest.ensure()
        names = ["a b.c", "x.y.z", "with  two spaces", "dots...", "_under-score"]
        for name in names:
            dest.create(name, name.encode())
        assert dest.list() == sorted(names)
        for name in names:
            assert dest.read(name) == name.encode()
            assert dest.size(name) == len(name)
        assert make_dest("dir with space.and.dots").list() == sorted(names)

    def test_sibling_directories_never_mix(self, make_dest: MakeDest) -> None:
        log, log2, nested = make_dest("log"), make_dest("log2"), make_dest("log/inner")
        for d in (log, log2, nested):
            d.ensure()
        log.create("a", b"log")
        log2.create("b", b"log2")
        nested.create("c", b"nested")
        assert log.list() == ["a"]
        assert log2.list() == ["b"]
        assert nested.list() == ["c"]
        assert log.list(start_after="") == ["a"]
        with pytest.raises(FileNotFoundError):
            log.read("b")

    def test_bad_names_are_rejected(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        for bad in ["", ".", "..", "a/b", "../escape", ".x.tmp"]:
            with pytest.raises(ValueError):
                dest.create(bad, b"x")
            with pytest.raises(ValueError):
                dest.read(bad)

    # -- lock / lease -----------------------------------------------------------------

    def test_lock_conflict_names_the_holder(self, make_dest: MakeDest) -> None:
        dest, rival = make_dest(), make_dest()
        dest.ensure()
        lock = dest.lock("writer-one")
        try:
            with pytest.raises(LockHeld) as info:
                rival.lock("writer-two")
            assert "writer-one" in info.value.holder
            assert "writer-one" in str(info.value)
            assert isinstance(info.value, BlockingIOError)
            lock.renew()  # still ours
        finally:
            lock.release()

    def test_released_lock_is_acquirable(self, make_dest: MakeDest) -> None:
        dest, rival = make_dest(), make_dest()
        dest.ensure()
        lock = dest.lock("writer-one")
        lock.release()
        lock.release()  # idempotent
        second = rival.lock("writer-two")
        try:
            with pytest.raises(LockHeld) as info:
                dest.lock("writer-three")
            assert "writer-two" in info.value.holder
            with pytest.raises(LockHeld):
                lock.renew()  # a released lock stays released
        finally:
            second.release()

    def test_of_racing_takers_exactly_one_wins(self, make_dest: MakeDest) -> None:
        dests = [make_dest() for _ in range(6)]
        dests[0].ensure()
        barrier = threading.Barrier(len(dests))
        won: list[Any] = []
        refused: list[LockHeld] = []

        def take(i: int) -> None:
            barrier.wait()
            try:
                won.append(dests[i].lock(f"racer-{i}"))
            except LockHeld as e:
                refused.append(e)

        threads = [threading.Thread(target=take, args=(i,)) for i in range(len(dests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            assert len(won) == 1 and len(refused) == len(dests) - 1
            holders = {e.holder.split(" ", 1)[0] for e in refused}
            assert len(holders) == 1 and holders <= {f"racer-{i}" for i in range(len(dests))}
        finally:
            for lk in won:
                lk.release()

    def test_lock_on_missing_directory(self, make_dest: MakeDest) -> None:
        dest = make_dest("fresh")  # no ensure(): taking the lock must not need it
        lock = dest.lock("w")
        lock.release()

    # -- append -----------------------------------------------------------------------

    def test_append_grows_file_and_reports_size(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        dest.create("seg", b"HDR")
        if not dest.appendable:
            with pytest.raises(NotImplementedError):
                dest.open_append("seg")
            return
        f = dest.open_append("seg")
        try:
            assert f.size == 3
            f.write(b"abc")
            assert f.size == 6  # unflushed bytes count
            f.flush()
            assert dest.size("seg") == 6
            big = b"x" * 300_000
            f.write(big)
            for _ in range(1000):
                f.write(b"0123456789")
            assert f.size == 6 + len(big) + 10_000
            f.sync()
            assert dest.size("seg") == f.size
        finally:
            f.close()
            f.close()  # idempotent
        assert dest.read("seg") == b"HDRabc" + big + b"0123456789" * 1000
        g = dest.open_append("seg")  # reopened: size from the file, not from zero
        try:
            assert g.size == 6 + len(big) + 10_000
            g.write(b"!")
        finally:
            g.close()
        assert dest.read("seg", dest.size("seg") - 1) == b"!"

    def test_open_append_missing_file(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        expected = FileNotFoundError if dest.appendable else NotImplementedError
        with pytest.raises(expected):
            dest.open_append("nope")

    # -- rebuilding elsewhere ---------------------------------------------------------

    def test_rebuilt_from_url_and_options(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        dest.create("a", b"1")
        again = open_destination(dest.url, **dest.storage_options)
        assert type(again) is type(dest)
        assert again.list() == ["a"]
        reduced = dest.__reduce__()
        assert isinstance(reduced, tuple)
        factory, args = reduced[:2]
        rebuilt = factory(*args)
        assert rebuilt.url == dest.url
        assert rebuilt.list() == ["a"]
        dest.close()
        dest.close()


class LeaseConformance:
    """Extra contract of object stores: the lease expires and is taken over."""

    def test_expired_lease_is_taken_over(self, make_dest: MakeDest) -> None:
        old, new = make_dest(), make_dest()
        old.ensure()
        # Long enough that the rival below meets it unexpired on a loaded machine (a PUT to
        # a local S3 server can take a few tenths of a second then).
        stale = old.lock("old-writer", ttl=1.0)
        written = time.time()  # the lease's expiry was set before this, at most 1 s ahead
        with pytest.raises(LockHeld):
            new.lock("new-writer", ttl=30)
        time.sleep(max(0.0, written + 1.0 - time.time()) + 0.05)
        fresh = new.lock("new-writer", ttl=30)
        try:
            with pytest.raises(LockHeld) as info:
                stale.renew()
            assert "new-writer" in info.value.holder
            stale.release()  # must not delete the new writer's lease
            with pytest.raises(LockHeld):
                make_dest().lock("third", ttl=30)
            fresh.renew()
        finally:
            fresh.release()
        make_dest().lock("third").release()

    def test_renew_keeps_the_lease(self, make_dest: MakeDest) -> None:
        dest, rival = make_dest(), make_dest()
        dest.ensure()
        lease = dest.lock("holder", ttl=0.5)
        try:
            for _ in range(3):
                time.sleep(0.25)
                lease.renew()
                with pytest.raises(LockHeld):
                    rival.lock("rival", ttl=30)
        finally:
            lease.release()

    def test_lost_lease_object_is_reclaimed_on_renew(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        lease = dest.lock("holder", ttl=30)
        dest.delete("LEASE")
        lease.renew()
        with pytest.raises(LockHeld):
            make_dest().lock("rival")
        lease.release()
        assert "LEASE" not in dest.list()

    def test_own_lease_is_taken_back_and_a_held_one_says_when_it_ends(self, make_dest: MakeDest) -> None:
        """A writer whose renewal landed but whose answer was lost finds the lease under
        its own (unique) owner name and takes it back at once; another writer is refused
        and told when the lease runs out."""
        dest = make_dest()
        dest.ensure()
        lost = dest.lock("writer-1", ttl=30)
        started = time.time()
        again = make_dest().lock("writer-1", ttl=30)
        try:
            with pytest.raises(LockHeld) as info:
                make_dest().lock("writer-2", ttl=30)
            assert info.value.expires is not None and started + 25 < info.value.expires < time.time() + 31
            with pytest.raises(LockHeld):
                lost.renew()  # the version it knew is gone
            again.renew()
        finally:
            again.release()
        make_dest().lock("writer-2").release()

    def test_idle_poll_costs_one_list(self, make_dest: MakeDest) -> None:
        dest = make_dest()
        dest.ensure()
        for i in range(5):
            dest.create(f"{i:020d}", b"x")
        follower = make_dest()
        before = follower.stats()  # type: ignore[attr-defined]
        assert follower.list(start_after=f"{4:020d}") == []
        after = follower.stats()  # type: ignore[attr-defined]
        assert after["LIST"] - before["LIST"] == 1
        assert sum(after.values()) - sum(before.values()) == 1

"""The asyncio face: open_async/AsyncLog, restore_async and ``async for`` over a follower.

Each test runs its own event loop with ``asyncio.run``. Storage faults and slow syncs come
from the fault-injecting filesystem (``faulty://`` over memory://, an object-store
destination whose sync is a PUT); the loop is the real asyncio loop, counted where a test
needs to know how often another thread woke it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
from async_app import AsyncApp
from faults import FaultPlan

import persistlog
from kv_app import restore_state
from threads import wait_until

T = TypeVar("T")


def run(main: Callable[[], Coroutine[Any, Any, T]], loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None) -> T:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main())


def nothing(emit: Callable[[Any], None]) -> None:
    pass


class ThreadsPlan(FaultPlan):
    """A fault plan that also notes which thread made each storage call, and whether a
    ``pipe_file`` (a PUT: the object store's write and sync) is in progress."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()
        self.putting = 0

    def run(self, op: str, call: Callable[[], Any]) -> Any:
        self.threads.add(threading.get_ident())
        if op != "pipe_file":
            return super().run(op, call)
        self.putting += 1
        try:
            return super().run(op, call)
        finally:
            self.putting -= 1


def faulty(plan: FaultPlan) -> tuple[str, dict[str, Any]]:
    return f"faulty://a{uuid.uuid4().hex[:8]}/log", {"target_protocol": "memory", "faults": plan}


class CountingLoop(asyncio.SelectorEventLoop):
    """The stock loop, counting how often other threads hand it a callback."""

    threadsafe_calls = 0

    def call_soon_threadsafe(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.threadsafe_calls += 1
        return super().call_soon_threadsafe(*args, **kwargs)


# -- durability: what an awaited update means in each mode -----------------------------


def test_fsync_mode_a_record_is_durable_when_its_await_returns(log_dir: str) -> None:
    async def main() -> list[int]:
        alog = await persistlog.open_async(log_dir, nothing, durability="fsync")
        late: list[int] = []

        async def writer(t: int) -> None:
            for j in range(20):
                lsn = await alog.update({"op": "put", "key": f"t{t}k{j % 3}", "value": j})
                if alog.durable_lsn < lsn:
                    late.append(lsn)

        await asyncio.gather(*(writer(t) for t in range(32)))
        stats = alog.stats()
        assert stats["updates"] == 640 and stats["syncs"] < 640  # some fsyncs were shared
        await alog.close()
        return late

    assert run(main) == []
    state, result = restore_state(log_dir)
    assert result.records == 640
    assert state == {f"t{t}k{j % 3}": j for t in range(32) for j in range(20)}


def test_flush_mode_a_record_is_written_when_its_await_returns(log_dir: str) -> None:
    async def main() -> None:
        alog = await persistlog.open_async(log_dir, nothing, durability="flush", flush_interval=60)
        for i in range(3):
            await alog.update({"op": "put", "key": "k", "value": i})
            # Another reader sees it in the file: it reached the OS, not only the Log's memory.
            state, _ = restore_state(log_dir)
            assert state == {"k": i}
        assert alog.durable_lsn < alog.next_lsn - 1  # written, not synced
        await alog.close()

    run(main)


def test_buffered_mode_returns_with_the_record_in_memory_and_sync_makes_it_durable(log_dir: str) -> None:
    async def main() -> None:
        alog = await persistlog.open_async(log_dir, nothing, flush_interval=60)
        lsn = await alog.update({"op": "put", "key": "k", "value": 1})
        assert alog.durable_lsn < lsn
        assert restore_state(log_dir)[0] == {}  # still in memory
        lsn2 = await alog.update({"op": "put", "key": "k", "value": 2}, sync=True)
        assert alog.durable_lsn >= lsn2 and restore_state(log_dir)[0] == {"k": 2}
        await alog.update_many([{"op": "put", "key": "a", "value": 1}, {"op": "del", "key": "k"}])
        await alog.sync()
        assert alog.durable_lsn == alog.next_lsn - 1
        assert restore_state(log_dir)[0] == {"a": 1}
        await alog.close()

    run(main)


def test_a_full_batch_is_written_in_buffered_mode(log_dir: str) -> None:
    async def main() -> None:
        alog = await persistlog.open_async(log_dir, nothing, flush_interval=60, batch_bytes=1000)
        for i in range(100):
            await alog.update({"op": "put", "key": i, "value": "v" * 40})
        assert alog.stats()["batches"] >= 4
        assert len(restore_state(log_dir)[0]) >= 80  # the full batches reached the file
        await alog.close()

    run(main)


# -- group commit on the loop ----------------------------------------------------------


def test_one_sync_answers_its_whole_group_with_one_wakeup_of_the_loop(clean_memory_fs: None) -> None:
    """256 tasks in fsync mode over a slow PUT (the object store's sync): each sync wakes
    the loop once, whatever the size of the group it covered."""
    plan = FaultPlan()
    url, so = faulty(plan)
    tasks, each = 256, 4

    async def main() -> tuple[int, int]:
        alog = await persistlog.open_async(url, nothing, durability="fsync", storage_options=so)
        plan.delay("pipe_file", 0.05, nth=plan.calls["pipe_file"] + 1, times=10**6)
        loop = asyncio.get_running_loop()
        assert isinstance(loop, CountingLoop)
        syncs0, calls0 = alog.stats()["syncs"], loop.threadsafe_calls

        async def writer(t: int) -> None:
            for j in range(each):
                await alog.update({"op": "put", "key": f"t{t}", "value": j})

        await asyncio.gather(*(writer(t) for t in range(tasks)))
        wakeups, syncs = loop.threadsafe_calls - calls0, alog.stats()["syncs"] - syncs0
        await alog.close()
        return wakeups, syncs

    wakeups, syncs = run(main, CountingLoop)
    assert 0 < wakeups <= syncs, (wakeups, syncs)
    assert syncs <= tasks * each // 8, syncs  # a 50 ms sync gathers many tasks' records
    state, result = restore_state(url, storage_options={"target_protocol": "memory"})
    assert result.records == tasks * each and state == {f"t{t}": each - 1 for t in range(tasks)}


def test_no_storage_io_runs_on_the_loop_thread(clean_memory_fs: None) -> None:
    plan = ThreadsPlan()
    url, so = faulty(plan)

    async def main() -> None:
        loop_thread = threading.get_ident()
        app = AsyncApp(asyncio.get_running_loop())
        alog = await app.open(url, durability="fsync", storage_options=so, rotate_records=200)
        await asyncio.gather(*(app.put(f"k{i % 50}", i) for i in range(600)))
        await alog.update_many([{"op": "del", "key": f"k{i}"} for i in range(5)], sync=True)
        assert await alog.rotate() == alog.seq
        await alog.update({"op": "put", "key": "big", "value": "x" * 100_000})
        await alog.sync()
        await alog.close()
        result = await persistlog.restore_async(url, lambda r: None, storage_options=so)
        assert result.complete
        follower = persistlog.follow(url, storage_options=so)
        async for batch in follower:
            if batch.last_lsn >= result.last_lsn:
                break
        follower.stop()
        assert plan.threads and loop_thread not in plan.threads
        assert app.enumerations >= 3

    run(main)


@pytest.mark.slow
def test_the_loop_keeps_running_while_a_sync_is_in_progress(clean_memory_fs: None) -> None:
    """A ticker task counts its ticks while a (0.3 s) PUT is in progress with 256 tasks
    waiting in fsync mode: a sync on the loop's thread would leave it none."""
    plan = ThreadsPlan()
    url, so = faulty(plan)

    async def main() -> tuple[int, int]:
        alog = await persistlog.open_async(url, nothing, durability="fsync", storage_options=so)
        plan.delay("pipe_file", 0.3, nth=plan.calls["pipe_file"] + 1, times=10**6)
        ticks_during_put = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks_during_put
            while not done.is_set():
                await asyncio.sleep(0.001)
                ticks_during_put += plan.putting > 0

        async def writer(t: int) -> None:
            for j in range(3):
                await alog.update({"op": "put", "key": t, "value": j})

        tick = asyncio.create_task(ticker())
        await asyncio.gather(*(writer(t) for t in range(256)))
        done.set()
        await tick
        syncs = alog.stats()["syncs"]
        await alog.close()
        return ticks_during_put, syncs

    ticks, syncs = run(main)
    assert syncs >= 2 and ticks >= syncs, (ticks, syncs)


# -- cancellation ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_cancelled_task_leaves_its_record_written_and_the_others_acknowledged(clean_memory_fs: None) -> None:
    plan = FaultPlan()
    url, so = faulty(plan)

    async def main() -> None:
        alog = await persistlog.open_async(url, nothing, durability="fsync", storage_options=so)
        plan.delay("pipe_file", 0.5, nth=plan.calls["pipe_file"] + 1, times=2)
        tasks = [asyncio.create_task(alog.update({"op": "put", "key": i, "value": i})) for i in range(40)]
        await asyncio.sleep(0.02)  # every task has appended and waits for the slow sync
        for t in tasks[::2]:
            t.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        cancelled = [r for r in results if isinstance(r, asyncio.CancelledError)]
        lsns = [r for r in results if isinstance(r, int)]
        assert len(cancelled) == 20 and len(lsns) == 20
        assert alog.durable_lsn >= max(lsns)
        # The log goes on: the shared write was neither cancelled nor torn.
        assert await alog.update({"op": "put", "key": "after", "value": 1}) > max(lsns)
        await alog.close()

    run(main)
    state, result = restore_state(url, storage_options={"target_protocol": "memory"})
    assert state == {**{i: i for i in range(40)}, "after": 1}


def test_cancelling_a_rotate_does_not_cancel_the_rotation(log_dir: str) -> None:
    async def main() -> None:
        started, release = threading.Event(), threading.Event()
        calls = []

        def slow(emit: Callable[[Any], None]) -> None:
            calls.append(1)
            if len(calls) == 2:
                started.set()
                release.wait(10)
            emit({"op": "put", "key": "snap", "value": len(calls)})

        alog = await persistlog.open_async(log_dir, slow)
        seq = alog.seq
        task = asyncio.create_task(alog.rotate())
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(TimeoutError):
            await alog.rotate(timeout=0.05)  # queued behind the running one
        release.set()
        await asyncio.get_running_loop().run_in_executor(None, wait_until, lambda: alog.stats()["rotations"] >= 3)
        assert alog.seq == seq + 2
        await alog.close()

    run(main)


def test_cancelling_open_async_closes_the_log_it_opened(log_dir: str) -> None:
    release = threading.Event()

    def slow(emit: Callable[[Any], None]) -> None:
        release.wait(10)

    async def main() -> None:
        task = asyncio.create_task(persistlog.open_async(log_dir, slow))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        # The Log opened in the executor is closed: its writer lock is free again.
        def reopen() -> bool:
            try:
                persistlog.open(log_dir, nothing).close()
            except persistlog.WriterConflict:
                return False
            return True

        persistlog.restore(log_dir, lambda r: None)
        await asyncio.get_running_loop().run_in_executor(None, wait_until, reopen)

    run(main)


# -- errors -------------------------------------------------------------------------------


def test_bad_records_raise_typeerror_in_the_task_and_write_nothing(log_dir: str) -> None:
    async def main() -> None:
        alog = await persistlog.open_async(log_dir, nothing, durability="fsync")
        before = alog.next_lsn
        with pytest.raises(TypeError):
            await alog.update({"op": "put", "key": "k", "value": object()})
        with pytest.raises(TypeError):
            await alog.update_many([{"op": "put", "key": "a", "value": 1}, {"value": object()}])
        with pytest.raises(TypeError):
            await alog.update({"op": "put", "key": "k", "value": 1}, sync="yes")  # type: ignore[arg-type]
        assert alog.next_lsn == before
        await alog.update({"op": "put", "key": "k", "value": 1})
        await alog.close()

    run(main)
    assert restore_state(log_dir)[0] == {"k": 1}


@pytest.mark.slow
def test_big_records_take_the_slow_path_off_the_loop(clean_memory_fs: None) -> None:
    """Records that do not fit beside what is buffered are appended on the executor (the
    slow path may write a batch first); one over the record limit is refused."""
    plan = ThreadsPlan()
    url, so = faulty(plan)
    mib = 1 << 20

    async def main() -> None:
        loop_thread = threading.get_ident()
        alog = await persistlog.open_async(url, nothing, storage_options=so, flush_interval=60,
                                           batch_bytes=32 * mib, rotate_bytes=None)
        first = await alog.update({"op": "put", "key": "a", "value": "a" * (20 * mib)})
        second = await alog.update({"op": "put", "key": "b", "value": "b" * (20 * mib)})
        many = await alog.update_many([{"op": "put", "key": k, "value": k * (20 * mib)} for k in "cd"])
        assert (first, second, many) == (first, first + 1, first + 3)
        before = alog.next_lsn
        with pytest.raises(ValueError):
            await alog.update({"op": "put", "key": "e", "value": "e" * (33 * mib)})
        assert alog.next_lsn == before
        await alog.close()
        assert loop_thread not in plan.threads

    run(main)
    state, _ = restore_state(url, storage_options={"target_protocol": "memory"})
    assert {k: len(v) for k, v in state.items()} == {k: 20 * mib for k in "abcd"}


def test_a_closed_log_raises_logclosederror(log_dir: str) -> None:
    async def main() -> None:
        async with await persistlog.open_async(log_dir, nothing) as alog:
            await alog.update({"op": "put", "key": "k", "value": 1})
        assert alog.closed
        for call in (
            lambda: alog.update({"op": "put", "key": "k", "value": 2}),
            lambda: alog.update_many([{"op": "put", "key": "k", "value": 2}]),
            alog.sync,
            alog.rotate,
        ):
            with pytest.raises(persistlog.LogClosedError):
                await call()
        await alog.close()  # again: nothing

    run(main)


@pytest.mark.parametrize("durability", ["flush", "fsync"])
def test_close_while_many_tasks_wait_answers_every_task(tmp_path: Any, durability: str) -> None:
    """Tasks register their waits without a lock; a close() racing them must still answer
    each: its LSN (and the record is restored) or LogClosedError, and none waits for good."""
    for round_ in range(5):
        url = str(tmp_path / f"log{round_}")
        acknowledged: dict[str, int] = {}

        async def main() -> None:
            alog = await persistlog.open_async(url, nothing, durability=durability)

            async def writer(i: int) -> None:
                n = 0
                while True:
                    try:
                        await alog.update({"op": "put", "key": f"{i}.{n}", "value": n})
                    except persistlog.LogClosedError:
                        return
                    acknowledged[f"{i}.{n}"] = n
                    n += 1

            tasks = [asyncio.create_task(writer(i)) for i in range(64)]
            await asyncio.sleep(0.05 + 0.02 * round_)
            await alog.close()
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)

        run(main)
        state, _ = restore_state(url)
        assert acknowledged, "no update was acknowledged before close"
        assert {k: state.get(k) for k in acknowledged} == acknowledged


def test_a_failed_write_raises_logfailederror_in_every_waiting_task(clean_memory_fs: None) -> None:
    plan = FaultPlan()
    url, so = faulty(plan)

    async def main() -> None:
        alog = await persistlog.open_async(url, nothing, durability="fsync", storage_options=so)
        acked = [await alog.update({"op": "put", "key": "ok", "value": i}) for i in range(3)]
        plan.fail("pipe_file", nth=plan.calls["pipe_file"] + 1, error=errno.ENOSPC, times=10**6)
        results = await asyncio.gather(
            *(alog.update({"op": "put", "key": i, "value": i}) for i in range(30)), return_exceptions=True
        )
        assert all(isinstance(r, persistlog.LogFailedError) for r in results), results
        assert len({id(r) for r in results}) == 30  # each task raised its own instance
        assert alog.failed is not None
        with pytest.raises(persistlog.LogFailedError):
            await alog.update({"op": "put", "key": "x", "value": 1})
        await alog.close()
        assert acked == sorted(acked)

    run(main)
    state, _ = restore_state(url, storage_options={"target_protocol": "memory"})
    assert state.get("ok") == 2


def test_open_async_takes_open_options_and_refuses_what_open_refuses(log_dir: str) -> None:
    async def main() -> None:
        with pytest.raises(TypeError):
            await persistlog.open_async(log_dir, nothing, no_such_option=1)
        with pytest.raises(ValueError):
            await persistlog.open_async(log_dir, nothing, durability="sometimes")
        alog = await persistlog.open_async(log_dir, nothing)
        with pytest.raises(persistlog.WriterConflict):
            await persistlog.open_async(log_dir, nothing)
        assert alog.stats()["durability"] == "buffered" and "AsyncLog" in repr(alog)
        await alog.close()

    run(main)


def test_rotate_raises_enumerateerror_and_the_log_goes_on(log_dir: str) -> None:
    async def main() -> None:
        fail = [False]

        def enumerate_all(emit: Callable[[Any], None]) -> None:
            if fail[0]:
                raise RuntimeError("boom")

        alog = await persistlog.open_async(log_dir, enumerate_all)
        fail[0] = True
        with pytest.raises(persistlog.EnumerateError) as e:
            await alog.rotate()
        assert isinstance(e.value.__cause__, RuntimeError)
        await alog.update({"op": "put", "key": "k", "value": 1}, sync=True)
        await alog.close()

    run(main)
    assert restore_state(log_dir)[0] == {"k": 1}


# -- rotation, signals, restore and follow ------------------------------------------------


@pytest.mark.slow
def test_rotations_while_tasks_update_keep_the_state(log_dir: str) -> None:
    """The recipe of README's asyncio section: the enumeration, on the rotation thread,
    takes the tasks' locks through the loop; every restore equals the live state."""

    async def main() -> dict[Any, Any]:
        app = AsyncApp(asyncio.get_running_loop())
        app.on_emit = lambda: time.sleep(0.0005)  # updates interleave with the emits
        alog = await app.open(log_dir, durability="fsync", rotate_records=150, retain=1)

        rotating = True

        async def writer(t: int) -> None:
            j = 0
            while j < 60 or rotating:
                if j % 7 == 6:
                    await app.delete(f"t{t}k{j % 5}")
                else:
                    await app.put(f"t{t}k{j % 5}", j)
                j += 1

        async def rotator() -> None:
            nonlocal rotating
            for _ in range(3):
                await asyncio.sleep(0.01)
                await alog.rotate()
            rotating = False

        await asyncio.gather(rotator(), *(writer(t) for t in range(20)))
        assert app.enumerations >= 4
        await alog.close()
        return app.data

    state = run(main)
    restored, result = restore_state(log_dir)
    assert result.complete and restored == state


def test_rotate_on_signal_installs_a_loop_handler(log_dir: str) -> None:
    async def main() -> None:
        alog = await persistlog.open_async(log_dir, nothing, rotate_on_signal=signal.SIGUSR1)
        seq = alog.seq
        os.kill(os.getpid(), signal.SIGUSR1)
        # The Log's background job makes the rotation due; the next update starts it.
        await asyncio.get_running_loop().run_in_executor(None, wait_until, lambda: alog.stats()["rotation_due"])
        await alog.update({"after": "signal"})
        assert alog.seq > seq
        await alog.close()

    previous = signal.getsignal(signal.SIGUSR1)
    run(main)
    assert signal.getsignal(signal.SIGUSR1) == previous


def test_restore_async_replays_what_restore_replays(log_dir: str) -> None:
    lg = persistlog.open(log_dir, nothing)
    for i in range(50):
        lg.update({"op": "put", "key": i % 7, "value": i})
    lg.close()
    expected, expected_result = restore_state(log_dir)

    async def main() -> tuple[dict[Any, Any], persistlog.RestoreResult, persistlog.RestoreResult]:
        state: dict[Any, Any] = {}
        result = await persistlog.restore_async(log_dir, lambda r: state.__setitem__(r["key"], r["value"]))
        batches: list[list[Any]] = []
        batched = await persistlog.restore_async(log_dir, replay_batch=batches.append)
        assert sum(map(len, batches)) == 50
        return state, result, batched

    state, result, batched = run(main)
    assert state == expected and result == expected_result and batched.records == 50


def test_async_for_follows_a_live_log_without_blocking_the_loop(log_dir: str) -> None:
    async def main() -> None:
        alog = await persistlog.open_async(log_dir, nothing, durability="flush")
        follower = persistlog.follow(log_dir, poll_interval=0.02)
        replica: dict[Any, Any] = {}
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                await asyncio.sleep(0.005)
                ticks += 1

        async def writer() -> None:
            for i in range(200):
                await alog.update({"op": "put", "key": i % 13, "value": i})
                if i % 20 == 0:
                    await asyncio.sleep(0.03)  # the follower catches up and idles meanwhile

        async def follow() -> int:
            last = 0
            async for batch in follower:
                for r in batch.records:
                    replica[r["key"]] = r["value"]
                assert batch.first_lsn == last + 1 or last == 0
                last = batch.last_lsn
                if len(replica) == 13 and replica[199 % 13] == 199:
                    return last
            raise AssertionError("the follower stopped")

        tick = asyncio.create_task(ticker())
        writing = asyncio.create_task(writer())
        last = await asyncio.wait_for(follow(), 30)
        await writing
        done.set()
        await tick
        assert follower.cursor is not None and follower.cursor.next_lsn == last + 1
        assert ticks >= 20
        follower.stop()
        async for _ in follower:  # a stopped follower yields nothing
            raise AssertionError("yielded after stop()")
        await alog.close()
        assert replica == {i % 13: i for i in range(200)}

    run(main)


def test_async_for_raises_what_iterating_raises_and_stop_ends_it(log_dir: str) -> None:
    lg = persistlog.open(log_dir, nothing)
    lg.update({"op": "put", "key": "k", "value": 1})
    lg.close()

    async def main() -> None:
        ahead = persistlog.Cursor(log=9, segment=0, offset=0, next_lsn=1000)
        with pytest.raises(persistlog.ResetRequired):
            async for _ in persistlog.follow(log_dir, cursor=ahead):
                pass
        follower = persistlog.follow(log_dir, poll_interval=0.01)
        seen: list[Any] = []

        async def follow() -> None:
            async for batch in follower:
                seen.extend(batch.records)

        task = asyncio.create_task(follow())
        await asyncio.get_running_loop().run_in_executor(None, follower.wait_caught_up, 10)
        follower.stop()  # the idle iteration ends at its next poll
        await asyncio.wait_for(task, 10)
        assert seen == [{"op": "put", "key": "k", "value": 1}]

    run(main)


@pytest.mark.slow
def test_importing_persistlog_leaves_asyncio_to_asyncio_apps() -> None:
    """The CLI and sync apps do not pay for importing asyncio (a quarter of the import)."""
    code = "import sys, persistlog; persistlog.follow; print('asyncio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

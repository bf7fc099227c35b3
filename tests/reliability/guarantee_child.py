"""A writer process running one pattern README.md teaches, as written, for the guarantee
matrix (``tests/reliability/test_guarantee_matrix.py``).

    python guarantee_child.py CONFIG_JSON

The patterns (their code is taken from README.md by ``tests/readme_code.py``):

- ``change``: the tour's ``replay``, ``enumerate_all`` and ``change(record, sync=...)``,
  one thread, no lock;
- ``update_many``: the tour's ``log.update_many(batch)`` and the loop that applies the
  batch with ``replay``;
- ``store``: ``ResourceStore`` (``store[k] = v``, ``del store[k]``, ``store.update({...})``);
- ``async``: the asyncio tour's ``enumerate_all`` and ``put`` on ``open_async``, the
  tasks of each round gathered;
- ``queue``: README's "Durable queues" block, whose calls are not functions to take from
  README, so they are written here as README shows them: ``with persistlog.LogSet(url) as
  mailboxes``, ``alice = persistlog.Queue.open_in(mailboxes, "alice", max_messages=1000,
  ttl=7 * 86400)`` (the case's options added), then ``alice.send(body)``, ``m =
  alice.receive()`` followed by ``alice.ack(m.id)``, and now and then a ``receive()``
  left unacknowledged ("delivered, never acknowledged"). A call is modelled as the
  key-value ops of a dict ``{"m<id>": body}``: a send puts its message, an ack deletes
  it, a receive alone changes nothing.

CONFIG (JSON): ``pattern``, ``url`` (the queue's: its LogSet's root), ``storage_options``,
``open`` (keyword arguments of ``persistlog.open``: durability, triggers, retain,
secondaries...), ``seed``, ``run`` (0
for the first writer on the destination, 1 for the next...), ``units`` (how many calls;
with ``stop_file``, at least so many, then until that file exists), ``sync_every`` (in
``buffered`` mode every so many calls, or rounds of the asyncio pattern, one is made
durable, with ``sync=True`` or ``sync()``), ``ending``, ``late`` (calls after a pause) and ``open_retry`` (seconds to try
again while a killed writer's lease holds the destination).

Like README's app, the child restores first (restore then open, or ResourceStore.open
and Queue.open_in, which restore).
It reports on stdout, one ``os.write`` per line (JSON), so that a line is whole or absent
whenever the process dies:

- ``{"event": "ready"}`` once the log is open;
- ``{"i": 7, "ops": [["put", "k3", 12]], "lsn": 812, "durable": false}`` once call 7
  returned (is acknowledged); ``durable``: acknowledged as durable, which in ``buffered``
  mode a ``sync=True``/``sync()`` call is, and covers every call before it;
- ``{"synced": 840}``: a ``sync()`` returned, every call acknowledged with an LSN up to
  840 is durable (the asyncio pattern, whose calls finish out of order);
- ``{"event": "frozen"}``, ``{"event": "resumed"}``, ``{"event": "failed", "error": ...}``,
  ``{"event": "closed"}``, ``{"event": "close_failed", "error": ...}``,
  ``{"event": "exiting"}``.

Endings: ``close`` (``close()``, or the ``async with`` block); ``exit`` (the script ends
without ``close()``: the interpreter's exit seals); ``kill`` (after the last call it stops
itself with SIGSTOP, so that nothing more happens before the parent's SIGKILL, which lands
right after an acknowledgement); ``interrupt`` (it keeps calling until the parent's SIGINT:
the ``KeyboardInterrupt`` propagates, the interpreter exits and seals); ``pause`` (it
rotates, so that its next calls cross no trigger, and stops itself like ``kill`` until
the parent's SIGCONT, then makes ``late`` more calls, on keys of their own, reporting the
first that fails, and closes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from itertools import count, islice
from typing import Any, TypeVar

import persistlog
from readme_code import README, readme_functions, readme_lines

#: A model operation: ``("put", key, value)`` or ``("del", key)``, as ``tests/kv_app.py``'s
#: ``replay_ops`` and ``prefix_states`` take them.
Op = tuple[Any, ...]
#: What one call logs: one record, or one batch (all or none).
Unit = list[Op]

PATTERNS = ("change", "update_many", "store", "async", "queue")
ENDINGS = ("close", "exit", "kill", "interrupt", "pause")
KEYS = 40
QUEUE_KEY = "alice"  # README's queue
QUEUE_SEND = 0.55  # of the queue's calls, sends (the rest: a receive and its ack, or a receive alone)
QUEUE_HOLD = 0.05  # receives left unacknowledged...
QUEUE_HELD = 20  # ...at most so many per writer (they wait for a restart)
QUEUE_WAITING = 40  # past so many messages not delivered, sends are fewer than receives
ROUND = 10  # tasks gathered at once by the asyncio pattern
# A child told to wait for Ctrl-C that makes this many calls was never interrupted.
MAX_CALLS = 500_000

T = TypeVar("T")
KEEP: list[Any] = []  # what the "exit" ending leaves open, as a script's globals would


def units(pattern: str, seed: int, run: int) -> Iterator[Unit]:
    """The calls of writer ``run`` (endless; the parent rebuilds them from the same
    arguments). Deletes name keys this run put, so that ``del store[k]`` finds them; a
    batch names each key once; the asyncio pattern puts ints (README's ``put(key: str,
    value: int)``), ``ROUND`` distinct keys per round."""
    rng = random.Random(f"{pattern}:{seed}:{run}")
    if pattern == "queue":
        yield from queue_units(rng, run)
        return
    live: list[str] = []
    for i in count():
        if pattern == "async":
            if i % ROUND == 0:
                keys = iter(rng.sample(range(KEYS), ROUND))
            yield [("put", f"k{next(keys)}", run * MAX_CALLS + i)]
            continue
        value = {"n": i, "run": run, "pad": "x" * rng.randrange(0, 120)}
        roll = rng.random()
        if roll < 0.15 and live:
            key = live.pop(rng.randrange(len(live)))
            yield [("del", key)]
        elif roll < 0.35 and pattern != "change":
            names = rng.sample(range(KEYS), rng.randint(2, 6))
            unit: Unit = [("put", f"k{n}", {**value, "j": j}) for j, n in enumerate(names)]
            if pattern == "update_many" and rng.random() < 0.3:
                unit.append(("del", live.pop(rng.randrange(len(live))) if live else "nothing"))
            live.extend(op[1] for op in unit if op[0] == "put" and op[1] not in live)
            yield unit
        else:
            key = f"k{rng.randrange(KEYS)}"
            if key not in live:
                live.append(key)
            yield [("put", key, value)]


def queue_units(rng: random.Random, run: int) -> Iterator[Unit]:
    """The queue's calls as a queue that starts empty makes them: ids from 1, one per
    send; a receive takes the oldest message not delivered yet (a send when there is
    none). A writer that restored messages delivers those first and its ids go on from
    the restored ones: it makes the same kinds of calls with the same bodies, and reports
    the ids it got."""
    sent = held = 0
    waiting: list[int] = []  # sent, not delivered yet, oldest first
    for i in count():
        roll = rng.random()
        # However long a writer goes on (until a follower is done lagging), the queue
        # stays under a hundred messages long, far from README's max_messages=1000.
        if roll < (QUEUE_SEND if len(waiting) < QUEUE_WAITING else 1 - QUEUE_SEND) or not waiting:
            sent += 1
            waiting.append(sent)
            yield [("put", f"m{sent}", f"{run}:{i}:" + "x" * rng.randrange(0, 120))]
        elif roll < 1 - QUEUE_HOLD or held == QUEUE_HELD:
            yield [("del", f"m{waiting.pop(0)}")]
        else:
            waiting.pop(0)
            held += 1
            yield []


def late_units(run: int, start: int, pattern: str = "") -> Iterator[Unit]:
    """The calls a paused writer makes once it runs again: keys no other call uses (the
    queue's: sends of bodies no other call sends, their ids the queue's)."""
    for i in count(start):
        yield [("put", "m?", f"late{run}-{i}")] if pattern == "queue" else [("put", f"late{run}-{i}", i)]


def record(op: Op) -> dict[str, Any]:
    """An op as the ResourceStore convention that README's ``replay`` applies."""
    if op[0] == "put":
        return {"op": "put", "key": op[1], "value": op[2]}
    return {"op": "del", "key": op[1]}


class Run:
    """The configuration of this child, its report lines and its endings."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.url: str = cfg["url"]
        self.storage_options: dict[str, Any] | None = cfg.get("storage_options")
        self.options: dict[str, Any] = dict(cfg["open"])
        if self.storage_options is not None:
            self.options["storage_options"] = self.storage_options
        if "secondaries" in self.options:  # (url, storage_options) pairs, lists in JSON
            self.options["secondaries"] = [tuple(entry) for entry in self.options["secondaries"]]
        self.buffered = self.options.get("durability", "buffered") == "buffered"
        self.ending: str = cfg["ending"]
        self.pattern: str = cfg["pattern"]
        self.max_lsn = -1

    def line(self, message: dict[str, Any]) -> None:
        os.write(1, (json.dumps(message) + "\n").encode())

    def ready(self) -> None:
        self.line({"event": "ready"})

    def calls(self) -> Iterator[tuple[int, Unit]]:
        """The calls to make before the ending: ``units`` of them (then, with a
        ``stop_file``, more until it exists), or until Ctrl-C."""
        todo = enumerate(units(self.pattern, self.cfg["seed"], self.cfg["run"]))
        stop_file = self.cfg.get("stop_file")
        if self.ending == "interrupt" or stop_file:
            for i, unit in islice(todo, MAX_CALLS):
                if stop_file and i >= self.cfg["units"] and os.path.exists(stop_file):
                    return
                yield i, unit
            raise SystemExit(f"no {'SIGINT' if self.ending == 'interrupt' else stop_file} came in {MAX_CALLS} calls")
        yield from islice(todo, self.cfg["units"])

    def opened(self, attempt: Callable[[], T]) -> T:
        """``attempt()`` (restore, then open), again while the destination is held by the
        lease of a killed writer, for ``open_retry`` seconds."""
        deadline = time.monotonic() + self.cfg.get("open_retry", 0)
        while True:
            try:
                return attempt()
            except persistlog.WriterConflict:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def late_calls(self) -> Iterator[tuple[int, Unit]]:
        start = self.cfg["units"]
        return enumerate(islice(late_units(self.cfg["run"], start, self.pattern), self.cfg.get("late", 0)), start)

    def sync_point(self, i: int) -> bool:
        every: int = self.cfg["sync_every"]
        return self.buffered and i % every == every - 1

    def acked(self, i: int, unit: Unit, lsn: int, synced: bool) -> None:
        self.max_lsn = max(self.max_lsn, lsn)
        self.line({"i": i, "ops": unit, "lsn": lsn, "durable": synced or not self.buffered})

    def freeze(self) -> None:
        """Stop the whole process here, every thread of it: a kill or a pause that comes
        right after the last acknowledgement, before a timer or a rotation moves on."""
        if self.ending in ("kill", "pause"):
            self.line({"event": "frozen"})
            os.kill(os.getpid(), signal.SIGSTOP)
            self.line({"event": "resumed"})

    def failed(self, e: BaseException, event: str = "failed") -> None:
        self.line({"event": event, "error": f"{type(e).__name__}: {e}"})

    @contextlib.contextmanager
    def closing(self) -> Iterator[None]:
        """Around closing the log: says it closed; after a pause a failure is reported,
        not raised (the next writer owns the destination by then)."""
        try:
            yield
        except Exception as e:
            if self.ending != "pause":
                raise
            self.failed(e, "close_failed")
            return
        self.line({"event": "closed"})

    def finish(self, close: Callable[[], Any]) -> None:
        """The ending, once the calls are made: ``close`` or leave the log to the exit."""
        if self.ending == "exit":
            KEEP.append(close)  # the log stays open and referenced, like a script's global
            self.line({"event": "exiting"})
            return
        with self.closing():
            close()


def drive(run: Run, do: Callable[[Unit, bool], int], close: Callable[[], Any], rotate: Callable[[], Any],
          made: Callable[[Unit], Unit] = lambda unit: unit) -> None:
    """Make the calls one after the other with ``do(unit, sync)`` (logs, applies, returns
    the LSN; ``made(unit)`` is the call as it was made), then end as configured."""
    for i, unit in run.calls():
        sync = run.sync_point(i)
        lsn = do(unit, sync)
        run.acked(i, made(unit), lsn, sync)
    if run.ending == "pause":
        rotate()
    run.freeze()
    if run.ending == "pause":
        for i, unit in run.late_calls():
            sync = run.sync_point(i)
            try:
                lsn = do(unit, sync)
            except Exception as e:  # fenced: the next writer owns the destination
                run.failed(e)
                break
            run.acked(i, made(unit), lsn, sync)
    run.finish(close)


def readme_namespace(source: str) -> dict[str, Any]:
    ns: dict[str, Any] = {"state": {}, "log": None}
    exec(source, ns)
    return ns


def readme_open(run: Run, ns: dict[str, Any]) -> persistlog.Log:
    """README's two steps: restore, then open (nothing written in between)."""
    def attempt() -> persistlog.Log:
        ns["state"].clear()
        persistlog.restore(run.url, ns["replay"], storage_options=run.storage_options)
        return persistlog.open(run.url, ns["enumerate_all"], **run.options)

    ns["log"] = log = run.opened(attempt)
    run.ready()
    return log


def change_pattern(run: Run) -> None:
    ns = readme_namespace(readme_functions("replay", "enumerate_all", "change"))
    log = readme_open(run, ns)

    def do(unit: Unit, sync: bool) -> int:
        (op,) = unit
        return int(ns["change"](record(op), sync=sync))

    drive(run, do, log.close, log.rotate)


def update_many_pattern(run: Run) -> None:
    ns = readme_namespace(readme_functions("replay", "enumerate_all"))
    # log.update_many(batch), then "for record in batch: replay(record)", as README has it.
    apply_batch = compile(readme_lines("log.update_many(batch)", "replay(record)"), str(README), "exec")
    log = readme_open(run, ns)

    def do(unit: Unit, sync: bool) -> int:
        ns["batch"] = [record(op) for op in unit]
        exec(apply_batch, ns)
        if sync:
            log.sync()
        return log.next_lsn - 1

    drive(run, do, log.close, log.rotate)


def store_pattern(run: Run) -> None:
    store = run.opened(lambda: persistlog.ResourceStore.open(run.url, **run.options))
    run.ready()

    def do(unit: Unit, sync: bool) -> int:
        if len(unit) > 1:
            store.update({op[1]: op[2] for op in unit})
        elif unit[0][0] == "put":
            store[unit[0][1]] = unit[0][2]
        else:
            del store[unit[0][1]]
        if sync:
            store.sync()
        return store.log.next_lsn - 1

    drive(run, do, store.close, store.log.rotate)


async def async_pattern(run: Run) -> None:
    ns = readme_namespace(readme_functions("replay") + readme_functions("enumerate_all", "put", inside="main"))
    deadline = time.monotonic() + run.cfg.get("open_retry", 0)
    while True:  # run.opened(), awaiting
        ns["state"].clear()
        await persistlog.restore_async(run.url, ns["replay"], storage_options=run.storage_options)
        try:
            ns["alog"] = alog = await persistlog.open_async(run.url, ns["enumerate_all"], **run.options)
            break
        except persistlog.WriterConflict:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    run.ready()

    async def rounds(calls: Iterator[tuple[int, Unit]], fenced: bool = False) -> bool:
        """Gather the calls ``ROUND`` at a time; False once a call failed (``fenced``:
        failures are reported, not raised)."""
        while batch := list(islice(calls, ROUND)):
            errors: list[BaseException] = []

            async def one(i: int, unit: Unit) -> None:
                ((_, key, value),) = unit
                try:
                    lsn = await ns["put"](key, value)
                except Exception as e:
                    if not fenced:
                        raise
                    errors.append(e)
                    return
                run.acked(i, unit, lsn, False)

            await asyncio.gather(*(one(i, unit) for i, unit in batch))
            if errors:
                run.failed(errors[0])
                return False
            if run.sync_point(batch[0][0] // ROUND):  # every so many rounds
                await alog.sync()
                run.line({"synced": run.max_lsn})
        return True

    async def body() -> None:
        await rounds(run.calls())
        if run.ending == "pause":
            await alog.rotate()
        run.freeze()
        if run.ending == "pause":
            await rounds(run.late_calls(), fenced=True)

    if run.ending == "exit":
        await body()
        run.finish(alog.close)  # kept, not called: the Log stays open
        return
    with run.closing():
        async with alog:  # close() seals, off the loop
            await body()


def run_async(run: Run) -> None:
    asyncio.run(async_pattern(run))


def queue_pattern(run: Run) -> None:
    """README's queue block, its calls as README writes them (see the module docstring)."""
    options = dict(run.options)
    storage_options = options.pop("storage_options", None)
    mailboxes = persistlog.LogSet(run.url, storage_options=storage_options)
    KEEP.append(mailboxes)  # the "exit" ending leaves it open, as a script's global would
    with contextlib.ExitStack() as stack:
        if run.ending != "exit":
            stack.enter_context(mailboxes)  # with persistlog.LogSet(...) as mailboxes:
        alice = run.opened(lambda: persistlog.Queue.open_in(mailboxes, QUEUE_KEY, max_messages=1000, ttl=7 * 86400,
                                                            **options))
        run.ready()
        last: list[Unit] = []  # the call as made: the ids the queue gave

        def do(unit: Unit, sync: bool) -> int:
            if unit and unit[0][0] == "put":
                body = unit[0][2]
                message_id = alice.send(body.encode())
                last[:] = [[("put", f"m{message_id}", body)]]
            else:
                m = alice.receive()
                if m is None:
                    raise AssertionError(f"receive() found no message for call {unit}")
                if unit:
                    if not alice.ack(m.id):
                        raise AssertionError(f"ack({m.id}) of a message just received returned False")
                    last[:] = [[("del", f"m{m.id}")]]
                else:
                    last[:] = [[]]
            if sync:
                alice.sync()
            return alice.log.next_lsn - 1

        # The close is the with block's: LogSet.close() closes the queue's log (the
        # block's own exit calls it again, which does nothing).
        drive(run, do, mailboxes.close, alice.rotate, lambda unit: last[0])


def main() -> None:
    # Python's own Ctrl-C handler, whatever the parent left (a shell's background job
    # ignores SIGINT): a script run from a terminal has it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    run = Run(json.loads(sys.argv[1]))
    body: dict[str, Callable[[Run], Any]] = {
        "change": change_pattern, "update_many": update_many_pattern, "store": store_pattern, "async": run_async,
        "queue": queue_pattern,
    }
    body[run.pattern](run)


if __name__ == "__main__":
    main()

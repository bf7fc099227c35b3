"""The guarantee matrix: the patterns README.md teaches, run as written, under small
rotation triggers, in every durability mode, on a local disk and on S3, through every way a
process ends, each checked for one thing: every acknowledged update is restored, and
nothing else changes (README, "Guarantees"; docs/DESIGN.md invariant 1).

A case is one writer child (``guarantee_child.py``: a pattern of README as written, with
``retain=1``, a trigger that rotates every hundred records or so, and 4 KiB segments)
that reports each acknowledged call, then ends:

- ``close``, ``exit`` (no ``close()``: the interpreter's exit seals) and ``interrupt``
  (SIGINT during the updates: the ``KeyboardInterrupt`` propagates, the exit seals): the
  restore is the state after every acknowledged call (after an interrupt, the call it cut
  short may be there too, whole);
- ``kill`` (SIGKILL right after the last acknowledgement): the restore is the state after a
  prefix of the calls holding every call acknowledged as durable (in ``buffered`` mode
  those a ``sync=True``/``sync()`` covered; in ``flush`` and ``fsync`` mode all);
- ``pause`` (S3: SIGSTOP past the writer's lease; the next writer restores, writes and
  closes; then SIGCONT): the next writer restores a prefix as after a kill, and every call
  the paused writer acknowledges as durable after it woke up is restored, all of its calls
  if its ``close()`` returns (a clean close makes every call durable, in any mode).

The queue (README's ``Queue`` in a ``LogSet``, whose ``with`` block closes it, after an
interrupt too) is checked the same way, its state being its messages, ``{"m<id>":
body}``: a ``send`` that returned puts its message, an ``ack`` that returned deletes it, a
``receive`` alone changes nothing (the queue's default mode is ``flush``; in ``buffered``
mode a kill may cost calls after the last ``sync()``, a suffix of them, never one from
the middle). The state is read twice: its log restored (the queue's records replayed: a
reader's view, and a secondary's), and, once the last writer is gone, README's restart
(``Queue.open_many`` of the set) drained without an ack, which must deliver that same
state, each message once, in send order.

Readers run during the writer's run and, after its clean close, must hold the restored
state: ``follower`` (README's replica: a background ``persistlog.follow`` with README's
``replay``, the queue's records replayed for the queue, and ``on_reset=state.clear``),
``follower-reset`` (the same, made to lag so that retention deletes the log it reads, then
the log its reset catches up from) and ``tail`` (``persistlog tail -f`` as a process). A
secondary must restore to the primary's state after a clean close, to a prefix after a
kill, and to the primary's state again after the next writer's clean close.

CI runs ``COVERING``: every pattern with every mode and every ending on a local disk, each
pattern on S3, the readers, the secondaries, a pause, and on S3 the two paths that once lost
acknowledged updates: an exit without ``close()`` (the seal at exit, ``_write/at_exit.py``) and a
buffered writer paused past its lease whose log the next writer's retention deleted (the
``confirm`` after a PUT, ``_write/segment_writer.py``); and the queue with a follower and
a lagging one, and on S3 in each mode, Ctrl-C included (a PUT that Ctrl-C cut short and
that landed late once failed the close, ``_write/segment_writer.py``).
``PERSISTLOG_MATRIX_FULL=1`` runs the whole cross product too
(``python -m pytest tests/reliability/test_guarantee_matrix.py``), and
``PERSISTLOG_MATRIX_JSON`` names a file for each case's figures. Every case must pass:
there is no known defect to expect.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import accumulate, islice, product
from pathlib import Path
from typing import Any

import pytest

import persistlog
from destinations import open_destination
from guarantee_child import ENDINGS, PATTERNS, QUEUE_KEY, ROUND, Unit, late_units, readme_namespace, units
from kv_app import prefix_states, replay_ops
from persistlog._format.constants import parse_segment_name
from persistlog._format.jsonify import from_jsonable
from readme_code import readme_functions
from threads import wait_until

sys.path.append(str(Path(__file__).resolve().parents[1] / "persistlog"))
from child_scripts import Proc, child_env  # noqa: E402 - how the suite runs its child processes

CHILD = Path(__file__).resolve().parent / "guarantee_child.py"
MODES = ("buffered", "flush", "fsync")
FULL = os.environ.get("PERSISTLOG_MATRIX_FULL") == "1"
FIGURES = os.environ.get("PERSISTLOG_MATRIX_JSON")

# Small triggers: every case rotates, deletes old logs (retain=1) and rolls segments often.
# The byte trigger is a few dozen records: of dicts, or of ints (the asyncio pattern).
TRIGGERS: dict[str, Callable[[str], dict[str, Any]]] = {
    "records": lambda pattern: {"rotate_records": 50, "rotate_bytes": None},
    "bytes": lambda pattern: {"rotate_records": None, "rotate_bytes": (1 if pattern == "async" else 8) * 1024},
}
COMMON = {"segment_bytes": 4096, "retain": 1}
LEASE_TTL = 2.0  # pause cases: short, so that the next writer can take over soon
SECONDARY_LEASE_TTL = 5.0  # longer than the next writer's run, shorter than a test's patience
SYNC_EVERY = 7  # buffered mode: every 7th call (the asyncio pattern: round) is made durable
SEED = 1
CALLS = {"local": 400, "s3": 200}
READER_CALLS = {"local": 800, "s3": 300}  # enough rotations for follower-reset's lags
INTERRUPT_AFTER = {"local": 250, "s3": 150}
LATE = 2 * SYNC_EVERY  # calls a paused writer makes once it runs again: no trigger crossed
RESTART_CALLS = 40
# Every writer rotates at least twice on a local disk, and once on S3 with the record
# trigger (on S3 the byte trigger counts what was PUT, a segment object at a time).
MIN_LOGS = {("local", "records"): 3, ("local", "bytes"): 3, ("s3", "records"): 2, ("s3", "bytes"): 1}


class GuaranteeBroken(AssertionError):
    """A restore (or a reader) lost an acknowledged update or holds something else: what
    the matrix checks. Any other failure is the harness's, and never an expected one."""


class ReaderStopped(Exception):
    """``persistlog tail -f`` ended on its own, before the writer's last record."""


@dataclass(frozen=True)
class Case:
    pattern: str
    mode: str
    ending: str
    dest: str = "local"  # "local" or "s3"
    trigger: str = "records"
    reader: str | None = None  # "follower", "follower-reset" or "tail"
    secondary: str | None = None  # "local" or "s3"

    @property
    def id(self) -> str:
        extra = [x for x in (self.reader, self.secondary and f"secondary-{self.secondary}") if x]
        return "-".join([self.pattern, self.mode, self.ending, self.dest, self.trigger, *extra])

    @property
    def calls(self) -> int:
        return (READER_CALLS if self.reader else CALLS)[self.dest]

    def param(self) -> Any:
        """The case as a pytest parameter (marked ``s3`` when it needs the moto server)."""
        marks = [pytest.mark.s3] if "s3" in (self.dest, self.secondary) else []
        return pytest.param(self, id=self.id, marks=marks)


def covering() -> list[Case]:
    """Every pattern x mode x ending on a local disk (the triggers alternating); each
    pattern, each mode and each ending on S3; the readers; a secondary of each kind; an
    exit and a pause of a buffered writer on S3; and the queue's own: a follower and a
    lagging one, and on S3 each mode and the endings a local disk does not show (Ctrl-C
    there once failed the close, ``_write/segment_writer.py``)."""
    cases = [Case(pattern, mode, ending, trigger="records" if n % 2 else "bytes")
             for n, (pattern, mode, ending) in enumerate(product(PATTERNS, MODES, ("close", "exit", "kill", "interrupt")))]
    return cases + [
        Case("change", "buffered", "close", "s3", "bytes"),
        Case("update_many", "buffered", "kill", "s3", "bytes"),
        Case("store", "fsync", "close", "s3"),
        Case("async", "flush", "interrupt", "s3", "bytes"),
        Case("async", "fsync", "exit", "s3"),
        Case("change", "buffered", "close", reader="follower"),
        Case("update_many", "fsync", "close", reader="tail"),
        Case("async", "flush", "close", secondary="local"),
        Case("store", "buffered", "close", reader="follower-reset"),
        Case("change", "flush", "close", "s3", reader="follower-reset"),
        Case("change", "flush", "kill", "s3"),
        Case("update_many", "buffered", "pause", "s3"),
        Case("change", "fsync", "kill", secondary="s3"),
        Case("store", "buffered", "exit", "s3"),
        Case("queue", "buffered", "close", reader="follower"),
        Case("queue", "flush", "close", reader="follower-reset"),
        Case("queue", "flush", "interrupt", "s3", "bytes"),
        Case("queue", "buffered", "exit", "s3", "bytes"),
        Case("queue", "fsync", "kill", "s3"),
        Case("queue", "buffered", "pause", "s3"),
    ]


def full() -> list[Case]:
    """The cross product of pattern, mode, ending, destination and trigger; with the
    record-count trigger, the close and the kill again with a secondary of the other kind,
    and the close with each reader (on S3 only follower-reset: an S3 follower that is not
    made to lag meets the retention defect at random)."""
    cases = []
    for pattern, mode, dest, trigger in product(PATTERNS, MODES, ("local", "s3"), TRIGGERS):
        for ending in ENDINGS:
            if ending == "pause" and dest == "local":
                continue  # a local writer's lock is an flock: a paused writer keeps it
            cases.append(Case(pattern, mode, ending, dest, trigger))
            if ending in ("close", "kill") and trigger == "records":
                cases.append(Case(pattern, mode, ending, dest, trigger, secondary="s3" if dest == "local" else "local"))
        if trigger == "records":
            readers = ("follower", "follower-reset", "tail") if dest == "local" else ("follower-reset",)
            cases += [Case(pattern, mode, "close", dest, trigger, reader=r) for r in readers]
    return cases


COVERING = covering()


# -- a writer child and what it reported ------------------------------------------------


class Child:
    """A ``guarantee_child.py`` process; its report lines are read as they come."""

    def __init__(self, cfg: dict[str, Any], logdir: Path, name: str) -> None:
        self.name = name
        self.proc = Proc(CHILD, cfg, logdir, name, stdout=subprocess.PIPE)
        self.lines: list[dict[str, Any]] = []
        self.eof = False
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stdout = self.proc.p.stdout
        assert stdout is not None
        for raw in stdout:
            line = json.loads(raw)
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self.eof = True
            self._cond.notify_all()

    def wait_for(self, what: str, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 120) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.eof or predicate(self.lines), timeout)
            if not predicate(self.lines):
                state = "ended" if self.eof else f"did not get there in {timeout}s"
                raise AssertionError(f"{self.name} {state} before {what}; stderr:\n{self.proc.stderr()}")

    def wait_event(self, event: str) -> None:
        self.wait_for(event, lambda lines: any(line.get("event") == event for line in lines))

    def wait_acks(self, n: int) -> None:
        self.wait_for(f"{n} acknowledgements", lambda lines: sum("i" in line for line in lines) >= n)

    def report(self) -> Report:
        with self._cond:
            return Report(list(self.lines))

    def signal(self, sig: int) -> None:
        self.proc.p.send_signal(sig)

    def end(self, expect: int, timeout: float = 120) -> Report:
        status = self.proc.wait(timeout)
        self._reader.join(timeout)
        assert status == expect, f"{self.name} exited with {status}, not {expect}; stderr:\n{self.proc.stderr()}"
        return self.report()

    def close(self) -> None:
        self.proc.close()
        if self.proc.p.stdout is not None:
            self.proc.p.stdout.close()


@dataclass
class Report:
    """The lines of one writer: its acknowledged calls, in the log's order."""

    lines: list[dict[str, Any]]
    acked: list[tuple[int, Unit, int, bool]] = field(init=False)

    def __post_init__(self) -> None:
        calls = [(line["i"], [tuple(op) for op in line["ops"]], line["lsn"], line["durable"])
                 for line in self.lines if "i" in line]
        self.acked = sorted(calls, key=lambda c: c[2])  # by LSN: the asyncio tasks return in any order

    def events(self) -> list[str]:
        return [line["event"] for line in self.lines if "event" in line]

    def durable(self) -> int:
        """How many of the acknowledged calls, in the log's order, are durable: those up
        to the last one acknowledged as durable or covered by a later ``sync()``."""
        synced = max((line["synced"] for line in self.lines if "synced" in line), default=-1)
        flagged = [n for n, (_, _, lsn, durable) in enumerate(self.acked) if durable or lsn <= synced]
        return flagged[-1] + 1 if flagged else 0

    def units(self) -> list[Unit]:
        return [unit for _, unit, _, _ in self.acked]

    def records(self, upto: int | None = None) -> int:
        return sum(len(unit) for unit in self.units()[:upto])


def check_reported(report: Report, pattern: str, run: int, late_from: int | None = None) -> None:
    """The calls the child reports are the ones the parent rebuilds (from ``late_from`` on,
    those of a writer woken from a pause): the model is about them."""
    last = max((i for i, _, _, _ in report.acked), default=-1)
    calls = list(islice(units(pattern, SEED, run), last + 1 if late_from is None else late_from))
    if late_from is not None:
        calls += islice(late_units(run, late_from, pattern), max(0, last + 1 - late_from))
    # The queue's first writer starts empty: its ids are those the parent rebuilds. A writer
    # that restored messages (or a paused one, woken) makes the same calls with its own ids.
    exact = pattern != "queue" or (run == 0 and late_from is None)
    for i, unit, _, _ in report.acked:
        if not exact:
            assert [op[:1] + op[2:] for op in unit] == [op[:1] + op[2:] for op in calls[i]], \
                f"call {i} logged {unit}, the parent rebuilds a call like {calls[i]}"
        else:
            assert unit == calls[i], f"call {i} logged {unit}, the parent rebuilds {calls[i]}"


# -- the model and the checks -------------------------------------------------------------

MISSING = object()


@dataclass
class Figures:
    """What one case checked, for docs/RELIABILITY.md."""

    case: str
    outcome: str = "not run"
    acked: int = 0  # acknowledged records (an update_many or a store.update counts each)
    durable: int = 0  # of them, acknowledged as durable where durability was what counted
    lost: int = 0  # of those, records a restore did not hold
    logs: int = 0  # logs the first writer started (one per rotation, and its first)


def unit_states(base: dict[str, Any], calls: list[Unit]) -> list[dict[str, Any]]:
    """The state after each prefix of whole calls (a batch is all or none): element j is
    after ``calls[:j]``."""
    states = prefix_states(base, [op for unit in calls for op in unit])
    return [states[end] for end in accumulate((len(unit) for unit in calls), initial=0)]


def with_some_of(restored: dict[str, Any], expected: dict[str, Any], pending: list[Unit]) -> bool:
    """Whether ``restored`` is ``expected`` with some of the ``pending`` calls applied, each
    whole or not at all (the calls an interrupt cut short; their keys are disjoint)."""
    touched: set[str] = set()
    for unit in pending:
        keys = {op[1] for op in unit}
        touched |= keys
        after = replay_ops(expected, unit)
        mine = {k: restored.get(k, MISSING) for k in keys}
        if mine != {k: expected.get(k, MISSING) for k in keys} and mine != {k: after.get(k, MISSING) for k in keys}:
            return False
    return all(restored.get(k, MISSING) == expected.get(k, MISSING) for k in (restored.keys() | expected.keys()) - touched)


def check_prefix(restored: dict[str, Any], base: dict[str, Any], report: Report, figures: Figures,
                 what: str = "the restore", must: int | None = None, pending: list[Unit] | None = None) -> None:
    """``restored`` is ``base`` after a prefix of the reported calls (in the log's order)
    holding the first ``must`` of them (default: every durable one), or after all of them
    and some of the ``pending`` calls an interrupt cut short."""
    calls = report.units()
    must = report.durable() if must is None else must
    states = unit_states(base, calls)
    figures.acked += report.records()
    figures.durable += report.records(must)
    if pending and must == len(calls) and with_some_of(restored, states[-1], pending):
        return
    reached = [j for j, state in enumerate(states) if state == restored]
    if reached and reached[-1] >= must:
        return
    figures.lost += report.records(must) - (report.records(reached[-1]) if reached else 0)
    holds = f"the state after {reached[-1]} of the {len(calls)} calls" if reached else "no prefix of the calls"
    raise GuaranteeBroken(f"{what} is {holds}, and {must} were acknowledged as durable (or sealed)\n"
                          f"restored: {restored}\nafter the {must}: {states[must]}")


def check_all(restored: dict[str, Any], base: dict[str, Any], report: Report, figures: Figures,
              what: str = "the restore", pending: list[Unit] | None = None) -> None:
    """After a clean end: every acknowledged call, and nothing else."""
    check_prefix(restored, base, report, figures, what, must=len(report.acked), pending=pending)


def pending_calls(report: Report, pattern: str) -> list[Unit]:
    """The calls an interrupt may have cut short: the one after the last acknowledged, or
    (the asyncio pattern) the unacknowledged ones of the round under way."""
    done = {i for i, _, _, _ in report.acked}
    if pattern != "async":
        n = len(done)
        assert done == set(range(n)), "the calls were acknowledged with a hole"
        return list(islice(units(pattern, SEED, 0), n, n + 1))
    # A round's tasks are gathered: the next round starts once every one of them returned.
    start = max(done, default=-1) // ROUND * ROUND
    if all(i in done for i in range(start, start + ROUND)):
        start += ROUND
    return [u for i, u in enumerate(islice(units(pattern, SEED, 0), start + ROUND)) if i >= start and i not in done]


# -- reading the destination ----------------------------------------------------------------


def drain(root: str, so: dict[str, Any] | None) -> dict[str, Any]:
    """README's restart of the queue (``Queue.open_many`` of its set), drained without an
    ack: ``{"m<id>": body}`` of the messages it delivers, each once, in send (id) order.
    A killed writer's S3 lease holds the queue a while yet: the open waits for it."""
    deadline = time.monotonic() + 3 * SECONDARY_LEASE_TTL
    while True:
        try:
            with persistlog.LogSet(root, storage_options=so) as mailboxes:
                queues = persistlog.Queue.open_many(mailboxes)
                assert list(queues) == [QUEUE_KEY], f"the set holds the queues {list(queues)}"
                alice = queues[QUEUE_KEY]
                delivered = []
                while (m := alice.receive()) is not None:
                    delivered.append((m.id, m.body.decode()))
                ids = [mid for mid, _ in delivered]
                if ids != sorted(set(ids)) or len(ids) != len(alice):
                    raise GuaranteeBroken(f"the queue holds {len(alice)} messages and delivers the ids {ids}")
                return {f"m{mid}": body for mid, body in delivered}
        except persistlog.WriterConflict:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def replaying(pattern: str) -> dict[str, Any]:
    """What a reader replays a pattern's log with: ``replay`` and the ``state`` it fills
    (README's, or for the queue ``queue_namespace()``)."""
    return queue_namespace() if pattern == "queue" else readme_namespace(readme_functions("replay"))


def queue_namespace() -> dict[str, Any]:
    """A queue's records as README names them, replayed into ``{"m<id>": body}``: a
    ``send`` puts its message, an ``ack`` takes out one the log holds, ``next`` changes
    no message. What a reader of a queue's log holds, checked like the other states."""
    state: dict[str, Any] = {}

    def replay(record: Any) -> None:
        key = f"m{record['id']}"
        if record["op"] == "send":
            body = record["body"].decode()
            if state.get(key, body) != body:
                raise GuaranteeBroken(f"message {record['id']} sent again with another body: {body!r}")
            state[key] = body
        elif record["op"] == "ack":
            if key not in state:
                raise GuaranteeBroken(f"the log acknowledges message {record['id']}, which it does not hold")
            del state[key]
        elif record["op"] != "next":
            raise GuaranteeBroken(f"a queue's log holds {record}")

    return {"state": state, "replay": replay}


def restore(url: str, so: dict[str, Any] | None, pattern: str) -> tuple[dict[str, Any], persistlog.RestoreResult]:
    """README's ``replay`` (or a queue's) into a fresh state; a destination that no longer
    restores is a broken guarantee too."""
    ns = replaying(pattern)
    try:
        result = persistlog.restore(url, ns["replay"], storage_options=so)
    except persistlog.CorruptLogError as e:
        raise GuaranteeBroken(f"{url} does not restore: {e}") from e
    assert result.found
    return ns["state"], result


class FollowerReader:
    """README's replica: a background follower applying README's ``replay``, resetting with
    ``on_reset=state.clear``.

    With ``lag`` it is made to lag behind retention, the same way every time: before the
    first record it applies, and before the first record after each of its first two
    resets, it waits until the writer's retention deleted every log there was (so the log
    its cursor is in goes, and then the log a reset catches up from, after it listed
    it); and before a reset that will so wait catches up, until the newest log has two
    segments (so that catching up has a segment still to open once it is gone). Two
    resets: one that the follower starts itself, on finding a log that does not continue
    the one it read, may take a file found missing for one more reset."""

    LAGS = 3

    def __init__(self, url: str, so: dict[str, Any] | None, lag: bool, pattern: str) -> None:
        self.ns = replaying(pattern)
        self.lag_failed: str | None = None
        self.lags = set(range(self.LAGS)) if lag else set()  # the resets after which to lag
        self._dest = open_destination(url, **(so or {}))
        replay, on_reset = self.ns["replay"], self.ns["state"].clear
        if lag:
            def replay(record: Any, apply: Callable[[Any], Any] = self.ns["replay"]) -> None:
                if self.follower.resets in self.lags:
                    self._outlive()
                    self.lags.discard(self.follower.resets)
                apply(record)

            def on_reset(clear: Callable[[], None] = self.ns["state"].clear) -> None:
                clear()
                if self.follower.resets in self.lags:
                    self._wait("the newest log to have two segments", lambda: max(self._logs().values()) >= 2)

        self.follower = persistlog.follow(url, replay, on_reset=on_reset, storage_options=so)
        self.follower.start()

    def _logs(self) -> dict[int, int]:
        """How many segments each log at the destination has."""
        logs: dict[int, int] = {}
        for name in self._dest.list():
            parsed = parse_segment_name(name)
            if parsed is not None:
                logs[parsed[0]] = logs.get(parsed[0], 0) + 1
        return logs

    def _outlive(self) -> None:
        there = set(self._logs())
        self._wait(f"retention to delete logs {sorted(there)}", lambda: not there & set(self._logs()))

    def _wait(self, what: str, condition: Callable[[], bool]) -> None:
        try:
            wait_until(condition, timeout=60, describe=what)
        except AssertionError as e:
            self.lag_failed = str(e)

    def lagged(self) -> bool:
        """Whether the follower is done lagging (or stopped)."""
        return not self.lags or self.follower.error is not None

    def state(self, result: persistlog.RestoreResult) -> dict[str, Any]:
        f = self.follower
        wait_until(lambda: f.error is not None or (f.cursor is not None and f.cursor.next_lsn >= result.next_lsn),
                   timeout=60, describe=lambda: repr(f))
        assert self.lag_failed is None, self.lag_failed
        assert f.wait_caught_up(30)
        f.stop()
        return dict(self.ns["state"])

    def close(self) -> None:
        try:
            self.follower.stop(10)
        except Exception:  # noqa: BLE001 - reported by state() already, or another failure is on its way
            pass
        self._dest.close()


class TailReader:
    """``persistlog tail -f URL --json`` as a process; its lines replayed in order (a jump
    in the LSNs is a reset: the lines start again from the newest complete log)."""

    def __init__(self, url: str, so: dict[str, Any] | None, logdir: Path, pattern: str) -> None:
        self.pattern = pattern
        options = [f"-o{key}={json.dumps(value)}" for key, value in _flat(so or {})]
        self.out, self.err = logdir / "tail.out", logdir / "tail.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "persistlog", "tail", "-f", url, "--json", "--interval", "0.05", *options],
                stdout=out, stderr=err, env=child_env(),
            )

    def _rows(self) -> list[dict[str, Any]]:
        lines = self.out.read_text().splitlines(keepends=True)
        return [json.loads(line) for line in lines if line.endswith("\n")]

    def state(self, result: persistlog.RestoreResult) -> dict[str, Any]:
        def printed() -> bool:
            if self.proc.poll() is not None:
                raise ReaderStopped(f"tail -f ended with {self.proc.returncode}: {self.err.read_text()[-2000:]}")
            return any(row.get("lsn") == result.last_lsn for row in self._rows())

        wait_until(printed, timeout=60, describe="tail -f printing the last record")
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(30) == 130, self.err.read_text()[-2000:]
        ns = replaying(self.pattern)
        last = None
        for row in self._rows():
            if last is not None and row["lsn"] != last + 1:
                ns["state"].clear()  # a reset: the newest complete log from its start
            ns["replay"](from_jsonable(row["record"]))  # (bytes are {"$bytes": base64} in JSON)
            last = row["lsn"]
        return dict(ns["state"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _flat(options: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """The ``-o KEY=VALUE`` pairs of ``storage_options``, nested keys dotted."""
    for key, value in options.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


# -- one case -------------------------------------------------------------------------------


@dataclass
class Site:
    """Where a case writes: the primary, and its secondary if any (url, storage_options);
    ``root`` is where the writer opens (the queue's: its LogSet), ``url`` its log."""

    url: str
    so: dict[str, Any] | None
    secondary: tuple[str, dict[str, Any] | None] | None
    root: str = ""


class Matrix:
    """One case: the writer children, the readers, the checks."""

    def __init__(self, case: Case, tmp_path: Path, request: pytest.FixtureRequest, figures: Figures) -> None:
        self.case = case
        self.tmp_path = tmp_path
        self.figures = figures
        self.children: list[Child] = []
        self.readers: list[FollowerReader | TailReader] = []

        def make(kind: str, name: str) -> tuple[str, dict[str, Any] | None]:
            if kind == "local":
                return str(tmp_path / name), None
            return f"s3://{request.getfixturevalue('s3_bucket')}/{name}", request.getfixturevalue("s3_storage_options")

        root, so = make(case.dest, "primary")
        url = root
        if case.pattern == "queue":  # README's set of mailboxes, made here to learn where the log goes
            with persistlog.LogSet(root, storage_options=so) as mailboxes:
                url = mailboxes.url(QUEUE_KEY)
        self.site = Site(url, so, make(case.secondary, "secondary") if case.secondary else None, root)

    def child(self, run: int, ending: str, calls: int, **extra: Any) -> Child:
        case, site = self.case, self.site
        options: dict[str, Any] = {"durability": case.mode, **TRIGGERS[case.trigger](case.pattern), **COMMON}
        if case.ending == "pause" or (case.pattern == "queue" and case.ending == "kill"):
            options["lease_ttl"] = LEASE_TTL  # (a queue is drained once killed: its open waits for the lease)
        if site.secondary is not None:
            options["secondaries"] = [list(site.secondary)]
            options["lease_ttl"] = SECONDARY_LEASE_TTL
        cfg = {"pattern": case.pattern, "url": site.root, "storage_options": site.so, "open": options,
               "seed": SEED, "run": run, "units": calls, "sync_every": SYNC_EVERY, "ending": ending, "late": LATE,
               **extra}
        c = Child(cfg, self.tmp_path, f"writer{run}")
        self.children.append(c)
        return c

    def restore(self) -> tuple[dict[str, Any], persistlog.RestoreResult]:
        return restore(self.site.url, self.site.so, self.case.pattern)

    def drained(self, expected: dict[str, Any]) -> None:
        """A queue, once its last writer is gone: what README's restart delivers is the
        state its log restores (checked against the calls already)."""
        if self.case.pattern == "queue" and drain(self.site.root, self.site.so) != expected:
            raise GuaranteeBroken("the queue, opened again, delivers other messages than its log restores")

    def run(self) -> None:
        case = self.case
        stop = self.tmp_path / "stop"  # a lagging follower's writer goes on until it is done lagging
        try:
            writer = self.child(0, case.ending, case.calls, stop_file=str(stop) if case.reader == "follower-reset" else None)
            writer.wait_event("ready")
            if case.reader == "tail":
                self.readers.append(TailReader(self.site.url, self.site.so, self.tmp_path, case.pattern))
            elif case.reader is not None:
                follower = FollowerReader(self.site.url, self.site.so, case.reader == "follower-reset", case.pattern)
                self.readers.append(follower)
                if follower.lags:
                    try:
                        wait_until(follower.lagged, timeout=90)
                    except AssertionError:
                        pass  # fewer resets than lags (a follower that needs fewer): nothing to wait for
                    stop.touch()
            if case.ending == "interrupt":
                writer.wait_acks(INTERRUPT_AFTER[case.dest])
                writer.signal(signal.SIGINT)
            elif case.ending in ("kill", "pause"):
                writer.wait_event("frozen")
            if case.ending == "pause":
                self.pause(writer)
            elif case.ending == "kill":
                writer.signal(signal.SIGKILL)
                self.ended(writer.end(-signal.SIGKILL))
            else:
                self.ended(writer.end(-signal.SIGINT if case.ending == "interrupt" else 0))
        finally:
            for reader in self.readers:
                reader.close()
            for c in self.children:
                c.close()

    def ended(self, report: Report) -> None:
        """The first writer is gone: check the restore, the readers, the secondary."""
        case = self.case
        check_reported(report, case.pattern, 0)
        restored, result = self.restore()
        self.figures.logs = max(result.logs)
        assert self.figures.logs >= MIN_LOGS[case.dest, case.trigger], f"the writer rotated {self.figures.logs - 1} times only"
        if case.ending == "kill":
            check_prefix(restored, {}, report, self.figures)
        else:
            assert case.ending != "close" or "closed" in report.events()
            pending = pending_calls(report, case.pattern) if case.ending == "interrupt" else None
            check_all(restored, {}, report, self.figures, pending=pending)
            for reader in self.readers:
                if reader.state(result) != restored:
                    raise GuaranteeBroken(f"the {case.reader}'s state differs from the restore")
        if self.site.secondary is not None:
            restored = self.secondary(restored, result, report)
        elif case.pattern == "store" and case.ending != "kill":
            # What the app gets back: ResourceStore.open restores by itself.
            store = persistlog.ResourceStore.open(self.site.url, storage_options=self.site.so)
            try:
                if store.to_dict() != restored:
                    raise GuaranteeBroken("ResourceStore.open restores another state than restore()")
            finally:
                store.close()
        self.drained(restored)

    def secondary(self, restored: dict[str, Any], result: persistlog.RestoreResult, report: Report) -> dict[str, Any]:
        """After a clean end the secondary holds the primary's state; after a kill a prefix,
        and once the next writer (same secondary) closed cleanly, the primary's state.
        Returns the primary's last state."""
        assert self.site.secondary is not None
        surl, sso = self.site.secondary
        sstate, sresult = restore(surl, sso, self.case.pattern)
        if self.case.ending != "kill":
            if (sstate, sresult.last_lsn) != (restored, result.last_lsn):
                raise GuaranteeBroken(f"the secondary reaches LSN {sresult.last_lsn}, the primary {result.last_lsn}")
            return restored
        check_prefix(sstate, {}, report, Figures(self.case.id), "the secondary's restore", must=0)
        # An S3 primary is leased by the killed writer for a while yet: the next one waits.
        nxt = self.child(1, "close", RESTART_CALLS, open_retry=3 * SECONDARY_LEASE_TTL).end(0)
        check_reported(nxt, self.case.pattern, 1)
        after, aresult = self.restore()
        check_all(after, restored, nxt, self.figures, "the restore after the next writer")
        sstate, sresult = restore(surl, sso, self.case.pattern)
        if (sstate, sresult.last_lsn) != (after, aresult.last_lsn):
            raise GuaranteeBroken(f"after the next writer's clean close the secondary reaches LSN "
                                  f"{sresult.last_lsn}, the primary {aresult.last_lsn}")
        return after

    def pause(self, writer: Child) -> None:
        """The writer is stopped past its lease; the next one restores (a prefix holding
        every durable call), writes and closes; then the first runs again, and every call
        it acknowledges as durable from then on must be restored, the rest unchanged."""
        case, figures = self.case, self.figures
        time.sleep(LEASE_TTL * 1.5 + 0.5)
        base, result = self.restore()
        figures.logs = max(result.logs)
        check_prefix(base, {}, writer.report(), figures, "the next writer's restore")
        nxt = self.child(1, "close", RESTART_CALLS).end(0)
        check_reported(nxt, case.pattern, 1)
        expected, _ = self.restore()
        check_all(expected, base, nxt, figures, "the next writer's restore")
        writer.signal(signal.SIGCONT)
        report = writer.end(0)
        check_reported(report, case.pattern, 0, late_from=case.calls)
        late = [(unit, durable) for i, unit, _, durable in report.acked if i >= case.calls]
        closed = "closed" in report.events()
        must = [unit for unit, durable in late if durable or closed]
        final, _ = self.restore()
        missing = [unit for unit in must if replay_ops(final, unit) != final]
        figures.acked += sum(len(unit) for unit, _ in late)
        figures.durable += sum(len(unit) for unit in must)
        figures.lost += sum(len(unit) for unit in missing)
        # Its late calls put keys (the queue's: bodies) that no other call puts.
        others = {k: v for k, v in final.items() if not k.startswith("late") and not str(v).startswith("late")}
        if missing or others != expected:
            raise GuaranteeBroken(
                f"the paused writer acknowledged {len(late)} calls after it woke up, {len(must)} as durable "
                f"({report.events()[-1]}); {len(missing)} of them are not restored, and the rest of the state "
                f"{'is' if others == expected else 'is not'} the next writer's")
        self.drained(final)


# -- the tests ----------------------------------------------------------------------------

_FIGURES: list[Figures] = []


@pytest.fixture(scope="module", autouse=True)
def _write_figures() -> Iterator[None]:
    yield
    if FIGURES:
        Path(FIGURES).write_text(json.dumps([asdict(f) for f in _FIGURES], indent=1))


def _run(case: Case, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    figures = Figures(case.id)
    _FIGURES.append(figures)
    try:
        Matrix(case, tmp_path, request, figures).run()
    except BaseException as e:
        figures.outcome = f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        raise
    figures.outcome = "passed"


@pytest.mark.slow
@pytest.mark.parametrize("case", [c.param() for c in COVERING])
def test_guarantee(case: Case, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    _run(case, tmp_path, request)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c.param() for c in full() if c not in COVERING] if FULL else [])
def test_guarantee_full(case: Case, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    _run(case, tmp_path, request)

"""Crash safety with real processes killed by SIGKILL (docs/DESIGN.md invariant 1).

One destination directory lives through every round: a child process (``crash_child.py``)
restores it, opens it with ``durability="fsync"``, updates from several threads, rotates and
reopens often, and reports every change it is about to make and every acknowledgement on a
pipe. The parent kills it at a random moment (during start-up, in the middle of updates,
during a slow enumeration, while closing and sealing), restores the directory itself and
checks that every acknowledged change is there and that each thread's changes form a prefix
of what it attempted: no holes, no reordering, nothing invented. The next child starts from
what the crash left.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from child_scripts import child_env
from kv_app import restore_state

HELPERS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/persistlog
CHILD = os.path.join(HELPERS, "crash_child.py")
ASYNC_CHILD = os.path.join(HELPERS, "crash_child_async.py")
ROUNDS = 60
ASYNC_ROUNDS = 30
MODES = ["start", "acks", "acks", "enum", "close"]


@dataclass
class Round:
    lines: list[str] = field(default_factory=list)
    seen: threading.Condition = field(default_factory=threading.Condition)

    def count(self, prefix: str) -> int:
        return sum(1 for line in self.lines if line.startswith(prefix))


def run_child(url: str, seed: int, threads: int, mode: str, rng: random.Random, child: str = CHILD) -> Round:
    rnd = Round()
    proc = subprocess.Popen(
        [sys.executable, child, url, str(seed), str(threads), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(CHILD))),
        env=child_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None

    def reader() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            with rnd.seen:
                rnd.lines.append(raw.decode().rstrip("\n"))
                rnd.seen.notify_all()

    t = threading.Thread(target=reader, daemon=True)
    t.start()

    def wait_for(pred: Any, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        with rnd.seen:
            while not pred() and proc.poll() is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                rnd.seen.wait(left)

    try:
        if mode == "start":
            time.sleep(rng.uniform(0.0, 0.25))
        elif mode == "acks":
            want = rng.randrange(1, 80)
            wait_for(lambda: rnd.count("A ") >= want)
        elif mode == "enum":
            # Skip the open's enumeration sometimes: kill during a rotation's.
            nth = rng.choice([1, 2, 2, 3])
            wait_for(lambda: rnd.count("E+") >= nth)
            time.sleep(rng.uniform(0.0, 0.004))
        elif mode == "close":
            nth = rng.randrange(1, 4)
            wait_for(lambda: rnd.count("C+") >= nth)
            time.sleep(rng.uniform(0.0, 0.001))
        assert proc.poll() is None, f"child exited early:\n{proc.stderr.read().decode()}"
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        t.join(10)
    err = proc.stderr.read().decode()
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, f"child ended with {proc.returncode}:\n{err}"
    errors = [line for line in rnd.lines if line.startswith("X ")]
    assert not errors, f"child failed: {errors}\n{err}"
    return rnd


def check_round(base: dict[str, Any], rnd: Round, state: dict[str, Any], last_lsn: int) -> None:
    """Each thread's changes present in ``state`` form a prefix of what it attempted,
    holding every acknowledged one; nothing else changed."""
    intents: dict[int, list[tuple[str, str, str]]] = {}
    acks: dict[int, list[int]] = {}
    for line in rnd.lines:
        parts = line.split(" ")
        if parts[0] == "I":
            t, j = int(parts[1]), int(parts[2])
            assert j == len(intents.setdefault(t, [])), line
            intents[t].append((parts[3], parts[4], parts[5]))
        elif parts[0] == "A":
            t, j, lsn = int(parts[1]), int(parts[2]), int(parts[3])
            assert j == len(acks.setdefault(t, [])), line
            acks[t].append(lsn)
            assert lsn <= last_lsn, f"acknowledged LSN {lsn} beyond the restored {last_lsn}"
    for key in set(base) | set(state):
        if int(key[1: key.index("k")]) not in intents:
            assert state.get(key) == base.get(key), key
    for t, ops in intents.items():
        mine = lambda d: {k: v for k, v in d.items() if k.startswith(f"t{t}k")}  # noqa: E731
        got = mine(state)
        model = mine(base)
        candidates = []
        acked = len(acks.get(t, []))
        assert acked <= len(ops) <= acked + 1
        for k, (op, key, value) in enumerate(ops, start=1):
            if op == "put":
                model[key] = value
            else:
                model.pop(key, None)
            if k >= acked:
                candidates.append(dict(model))
        if acked == 0:
            candidates.insert(0, mine(base))
        assert got in candidates, (
            f"thread {t}: restored {got} is not its state after {acked}..{len(ops)} of its "
            f"changes {ops}"
        )


def kill_rounds(url: str, rounds: int, workers: tuple[int, int], child: str = CHILD) -> dict[str, int]:
    """``rounds`` children (``workers`` threads or tasks each) killed at random moments,
    each round checked against what its child reported."""
    seed = os.environ.get("PERSISTLOG_CRASH_SEED", "persistlog")
    rng = random.Random(seed if child == CHILD else f"{seed} {os.path.basename(child)}")
    state: dict[str, Any] = {}
    stats = {"mid_enumeration": 0, "mid_close": 0, "acked": 0, "torn": 0, "opened": 0}
    started = time.monotonic()
    for i in range(rounds):
        mode = MODES[i % len(MODES)]
        threads = rng.randrange(*workers)
        rnd = run_child(url, rng.randrange(1 << 30), threads, mode, rng, child)
        restored, result = restore_state(url)
        if any(line.startswith("O ") for line in rnd.lines):
            stats["opened"] += 1
            assert result.found and result.complete
        check_round(state, rnd, restored, result.last_lsn)
        stats["acked"] += rnd.count("A ")
        stats["torn"] += len(result.torn_tails)
        events = [line for line in rnd.lines if line[:2] in ("E+", "E-", "C+", "C-")]
        if events and events[-1] == "E+":
            stats["mid_enumeration"] += 1
        if events and events[-1] == "C+":
            stats["mid_close"] += 1
        state = restored
    elapsed = time.monotonic() - started
    print(f"{rounds} kills of {os.path.basename(child)} in {elapsed:.1f}s: {stats}")
    return stats


@pytest.mark.slow
def test_sigkill_at_random_moments(tmp_path: Any) -> None:
    stats = kill_rounds(str(tmp_path / "log"), ROUNDS, (2, 5))
    # The kills landed where they were aimed often enough to mean something.
    assert stats["opened"] >= ROUNDS // 2
    assert stats["acked"] >= 500
    assert stats["mid_enumeration"] >= 3, stats  # typically about 20
    assert stats["mid_close"] >= 1, stats  # typically 4 to 9


@pytest.mark.slow
def test_sigkill_asyncio_app_at_random_moments(tmp_path: Any) -> None:
    """The same kills and checks for an asyncio app (``crash_child_async.py``): tasks on
    one loop awaiting ``AsyncLog.update`` in fsync mode, sharing each fsync."""
    stats = kill_rounds(str(tmp_path / "log"), ASYNC_ROUNDS, (4, 10), ASYNC_CHILD)
    assert stats["opened"] >= ASYNC_ROUNDS // 2
    assert stats["acked"] >= 250
    assert stats["mid_enumeration"] >= 2, stats
    assert stats["mid_close"] >= 1, stats


@pytest.mark.slow
@pytest.mark.parametrize("where", ["first enumeration", "rotation enumeration"])
def test_sigkill_during_enumeration_keeps_the_last_complete_log(tmp_path: Any, where: str) -> None:
    """Killed while enumerating: restore replays the last complete log and the incomplete
    one after it; killed during the very first enumeration: it replays what there is and
    says the state is not from a complete log."""
    url = str(tmp_path / "log")
    rng = random.Random(where)
    if where == "rotation enumeration":
        rnd = run_child(url, 1, 2, "acks", rng)  # leaves complete logs and some state
        base, result = restore_state(url)
        assert result.complete and base
        nth = 2
    else:
        base, nth = {}, 1
    code = (
        "import sys, time, persistlog\n"
        "n = [0]\n"
        "state = {}\n"
        "def enum(emit):\n"
        "    n[0] += 1\n"
        "    emit({'op': 'put', 'key': 't9k0', 'value': 'snap'})\n"
        "    if n[0] == %d:\n"
        "        print('E+', flush=True); time.sleep(60)\n"
        "    for k, v in state.items():\n"
        "        emit({'op': 'put', 'key': k, 'value': v})\n"
        "def apply(r):\n"
        "    if r['op'] == 'put':\n"
        "        state[r['key']] = r['value']\n"
        "    else:\n"
        "        state.pop(r['key'], None)\n"
        "persistlog.restore(sys.argv[1], apply)\n"
        "lg = persistlog.open(sys.argv[1], enum, durability='fsync')\n"
        "lg.update({'op': 'put', 'key': 't9k1', 'value': 'x'})\n"
        "lg.rotate()\n" % nth
    )
    proc = subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    err = proc.stderr.read().decode()
    proc.stdout.close()
    proc.stderr.close()
    assert line == b"E+\n", err
    state, result = restore_state(url)
    assert result.found
    if where == "first enumeration":
        assert not result.complete
        assert state in ({}, {"t9k0": "snap"})  # what of the snapshot reached the OS
    else:
        assert result.complete
        # The last complete log holds a snapshot of base plus t9k0, then the update t9k1,
        # then the incomplete log's partial enumeration.
        assert state == {**base, "t9k0": "snap", "t9k1": "x"}
    # A writer opens on it and completes a new log.
    code2 = (
        "import sys, persistlog\n"
        "lg = persistlog.open(sys.argv[1], lambda emit: emit({'op': 'put', 'key': 'z', 'value': 1}),\n"
        "                     discard_existing=True)\n"
        "lg.close()\n"
    )
    subprocess.run([sys.executable, "-c", code2, url], check=True)
    state, result = restore_state(url)
    assert result.complete and state == {"z": 1}

"""Prefix durability (docs/DESIGN.md invariant 1) as a hypothesis state machine.

An app keeps a dict and logs every change through a real Log on a temporary directory.
Rules: put/delete (optionally ``sync=True``), ``update_many``, ``rotate()``, ``sync()``,
close + reopen, a crash (the Log abandoned without closing, as a killed process leaves it),
a crash followed by a torn write (the newest segment truncated anywhere past its durable
size, sometimes followed by zeros, as a power loss leaves it), and a read-only restore while
the Log is open. After every restore the restored dict must equal the model at some prefix of
the update sequence, and that prefix must contain every update acknowledged as durable (and,
after a process crash, every update the mode had handed to the OS).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)
from batches import batch_offsets
from hypothesis_profiles import active_profile
from kv_app import App, prefix_states, restore_state
from log_files import (
    crash,
    creation_size,
    durable_floor,
    log_seqs,
    segment_files,
    segment_sizes,
    truncate,
)

import persistlog

KEYS = st.sampled_from(["a", "b", "c", "d", "e", 1, 2, b"k"])
VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.text(max_size=12),
    st.binary(max_size=40),
    st.lists(st.integers(0, 9), max_size=4),
    st.none(),
)


class PrefixDurability(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="pl-stateful-")
        self.url = os.path.join(self.root, "log")
        self.app: App | None = None
        # The model: the state the last restore confirmed, and every change since.
        self.base: dict[Any, Any] = {}
        self.ops: list[tuple[Any, ...]] = []
        self.durable = 0  # ops[:durable] were acknowledged durable
        self.in_os = 0  # ops[:in_os] were acknowledged as handed to the OS
        self.durable_sizes: dict[str, int] = {}
        self.restores = 0

    # -- opening ------------------------------------------------------------------------

    @initialize(
        durability=st.sampled_from(["buffered", "flush", "fsync"]),
        compression=st.sampled_from([None, None, "gzip", "zstd"]),
        rotate_records=st.one_of(st.none(), st.integers(3, 40)),
        batch_bytes=st.sampled_from([1, 60, 1024 * 1024]),
        retain=st.integers(1, 3),
    )
    def start(self, durability: str, compression: str | None, rotate_records: int | None,
              batch_bytes: int, retain: int) -> None:
        self.options = dict(
            durability=durability,
            compression=compression,
            rotate_records=rotate_records,
            batch_bytes=batch_bytes,
            segment_bytes=4096,
            retain=retain,
        )
        self._open({})

    def _open(self, state: dict[Any, Any]) -> None:
        self.app = App(state)
        self.app.open(self.url, **self.options)
        # Opening returns once the first log is complete: everything is durable.
        self.base, self.ops = dict(state), []
        self._all_durable()

    def _all_durable(self) -> None:
        self.durable = self.in_os = len(self.ops)
        self.durable_sizes = segment_sizes(self.url)

    def _acked(self, sync: bool) -> None:
        mode = self.options["durability"]
        if sync or mode == "fsync":
            self._all_durable()
        elif mode == "flush":
            self.in_os = len(self.ops)

    @property
    def log(self) -> persistlog.Log:
        assert self.app is not None and self.app.log is not None
        return self.app.log

    # -- updates ------------------------------------------------------------------------

    @rule(key=KEYS, value=VALUES, sync=st.booleans())
    def put(self, key: Any, value: Any, sync: bool) -> None:
        assert self.app is not None
        self.app.put(key, value, sync=sync)
        self.ops.append(("put", key, value))
        self._acked(sync)

    @rule(key=KEYS, sync=st.booleans())
    def delete(self, key: Any, sync: bool) -> None:
        assert self.app is not None
        self.app.delete(key, sync=sync)
        self.ops.append(("del", key))
        self._acked(sync)

    @rule(changes=st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=5), sync=st.booleans())
    def put_many(self, changes: list[tuple[Any, Any]], sync: bool) -> None:
        assert self.app is not None
        before = self.log.next_lsn
        last = self.app.put_many(changes, sync=sync)
        # A background rotation may take LSNs for snapshot records meanwhile.
        assert before + len(changes) - 1 <= last < self.log.next_lsn
        for k, v in changes:
            self.ops.append(("put", k, v))
        self._acked(sync)

    @rule()
    def sync(self) -> None:
        self.log.sync()
        self._all_durable()

    @rule()
    def rotate(self) -> None:
        seq = self.log.rotate()
        assert seq == self.log.seq
        self._all_durable()

    @rule()
    def rotate_with_failing_enumeration(self) -> None:
        """The new log stays incomplete; writing goes on in it and restore replays it after
        the last complete one."""
        assert self.app is not None
        self.app.fail_enumerate = RuntimeError("enumeration failed")
        try:
            with pytest.raises(persistlog.EnumerateError):
                self.log.rotate()
        finally:
            self.app.fail_enumerate = None
        self._all_durable()  # the switch synced the old log; the new one's header is durable

    # -- restarts -----------------------------------------------------------------------

    @rule()
    def close_and_reopen(self) -> None:
        self.log.close()
        assert self.app is not None
        expected = dict(self.app.data)
        state, result = self._restore()
        assert state == expected
        assert result.complete and not result.torn_tails
        self._open(state)

    @rule(
        tear=st.sampled_from(["none", "none", "truncate", "truncate+zeros"]),
        where=st.floats(0, 1),
        zeros=st.integers(1, 100),
    )
    def crash_and_restart(self, tear: str, where: float, zeros: int) -> None:
        crash(self.log)
        newest = segment_files(self.url)[-1]
        name = os.path.basename(newest)
        size = os.path.getsize(newest)
        cut = size
        if tear != "none":
            durable = max(self.durable_sizes.get(name, 0), durable_floor(newest))
            cut = durable + int(where * (size - durable))
            ends = {o + s for o, s, _ in batch_offsets(newest)} | {creation_size(newest)}
            truncate(newest, cut)
            if tear == "truncate+zeros":
                with open(newest, "ab") as f:
                    f.write(b"\0" * zeros)
        event(f"crash: {tear}")
        state, result = self._restore()
        lowest = self.in_os if tear == "none" else self.durable
        self._check_prefix(state, lowest)
        if tear == "none":
            assert not result.torn_tails, result.torn_tails
        else:
            torn = tear == "truncate+zeros" or cut not in ends
            assert bool(result.torn_tails) == torn, (cut, sorted(ends), result.torn_tails)
            if torn:
                tail = result.torn_tails[-1]
                assert tail.log == log_seqs(self.url)[-1] and tail.segment == name
                assert tail.offset == max(e for e in ends if e <= cut)
        self._open(state)

    @rule()
    def restore_while_open(self) -> None:
        """A reader beside the live writer sees a prefix holding everything in the OS."""
        for attempt in range(5):
            try:
                state, result = self._restore()
                break
            except persistlog.DestinationError:
                # Retention of the writer deleted a file under the reader: try again.
                if attempt == 4:
                    raise
        self._check_prefix(state, self.in_os)

    # -- checks -------------------------------------------------------------------------

    def _restore(self) -> tuple[dict[Any, Any], persistlog.RestoreResult]:
        state, result = restore_state(self.url)
        self.restores += 1
        assert result.found and result.complete
        return state, result

    def _check_prefix(self, state: dict[Any, Any], lowest: int) -> None:
        states = prefix_states(self.base, self.ops)
        ok = [k for k in range(lowest, len(self.ops) + 1) if states[k] == state]
        assert ok, (
            f"restored {state!r} is no prefix of {len(self.ops)} updates holding the first "
            f"{lowest} (base {self.base!r}, ops {self.ops!r})"
        )

    @invariant()
    def writer_healthy(self) -> None:
        if self.app is not None and self.app.log is not None:
            stats = self.log.stats()
            assert not stats["failed"], stats["last_error"]

    def teardown(self) -> None:
        try:
            if self.app is not None and self.app.log is not None and not self.log.closed:
                self.log.close()
                state, _ = self._restore()
                assert state == self.app.data
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


PrefixDurability.TestCase.settings = active_profile(max_examples=60, stateful_step_count=50)
TestPrefixDurability = PrefixDurability.TestCase
# Every step restores from the files a crash would leave: over a minute on the shared machine.
TestPrefixDurability.pytestmark = [pytest.mark.slow]

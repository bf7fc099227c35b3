"""A failed write to the primary fails the Log for good, and failed opens never leave a
directory that the next open cannot use."""

from __future__ import annotations

from typing import Any

import pytest
from kv_app import App, prefix_states, restore_state
from log_files import fill_disk, is_complete_log, log_seqs

import persistlog


# -- failures ---------------------------------------------------------------------------


def test_primary_write_failure_fails_the_log_for_good(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, durability="flush")
    app.put("b", 2)
    ops: list[tuple[Any, ...]] = []
    fill_disk(lg)
    with pytest.raises(persistlog.LogFailedError) as info:
        app.put("c", 3)
    ops.append(("put", "c", 3))
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == 28
    for call in (
        lambda: lg.update({"op": "put", "key": "d", "value": 4}),
        lambda: lg.update({"op": "put", "key": "d", "value": 4}, sync=True),
        lambda: lg.update_many([{"op": "put", "key": "d", "value": 4}]),
        lg.sync,
        lg.rotate,
        lambda: lg.rotate(wait=False),
    ):
        with pytest.raises(persistlog.LogFailedError):
            call()
    stats = lg.stats()
    assert stats["failed"] and "No space left" in stats["last_error"]
    assert stats["destinations"][0]["healthy"] is False
    # Lets go of the destination without pretending to seal: "b" was written, not synced.
    with pytest.raises(persistlog.LogFailedError, match="records 2..3 it accepted are not known to be durable"):
        lg.close()
    with pytest.raises(persistlog.LogFailedError):
        lg.update({"op": "put", "key": "e", "value": 5})
    state, result = restore_state(log_dir)
    base = {"a": 1, "b": 2}
    assert state in prefix_states(base, ops)  # "c" may or may not have reached the disk
    assert state.get("b") == 2
    App(state).open(log_dir).close()  # the directory is not wedged


def test_repeated_failed_opens_never_wedge_a_directory(log_dir: str) -> None:
    app = App({"a": 1})
    app.open(log_dir).close()
    for i in range(8):
        bad = App({"a": 1})
        bad.fail_enumerate = RuntimeError(f"attempt {i}")
        with pytest.raises(persistlog.EnumerateError):
            bad.open(log_dir, retain=1)
    with pytest.raises(ValueError):
        persistlog.open(log_dir, lambda emit: None, durability="sometimes")
    with pytest.raises(TypeError):
        persistlog.open(log_dir, "not callable")  # type: ignore[arg-type]
    holder = App({"a": 1})
    lg = holder.open(log_dir)
    with pytest.raises(persistlog.WriterConflict):
        App({}).open(log_dir)
    lg.close()
    state, result = restore_state(log_dir)
    assert state == {"a": 1} and result.complete
    good = App(state)
    lg = good.open(log_dir, retain=1)
    good.put("b", 2)
    lg.close()
    assert restore_state(log_dir)[0] == {"a": 1, "b": 2}
    assert len([s for s in log_seqs(log_dir) if is_complete_log(log_dir, s)]) == 1

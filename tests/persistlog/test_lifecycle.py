"""The Log's lifecycle on ordinary paths: calls that would wait for themselves."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import persistlog


# -- calls from inside enumerate_all --------------------------------------------------------


@pytest.mark.parametrize("call", ["rotate", "close", "add_destination"])
def test_waiting_calls_from_inside_enumerate_all_raise_at_once(log_dir: str, tmp_path: Any, call: str) -> None:
    """rotate(), close() and add_destination() wait for the rotation; from the rotation
    thread itself they would wait forever, so they raise RuntimeError at once."""
    seen: list[BaseException | str] = []
    lg: persistlog.Log | None = None
    calls: dict[str, Callable[[persistlog.Log], Any]] = {
        "rotate": lambda lg: lg.rotate(),
        "close": lambda lg: lg.close(),
        "add_destination": lambda lg: lg.add_destination(str(tmp_path / "second")),
    }

    def enumerate_all(emit: Callable[[Any], None]) -> None:
        emit({"op": "put", "key": "a", "value": 1})
        if lg is not None and not seen:
            try:
                calls[call](lg)
            except BaseException as e:  # noqa: BLE001 - recorded for the test to check
                seen.append(e)
            else:
                seen.append("returned")

    lg = persistlog.open(log_dir, enumerate_all)
    rotating = threading.Thread(target=lg.rotate, daemon=True)
    rotating.start()
    rotating.join(20)
    assert not rotating.is_alive(), f"{call}() from inside enumerate_all hung"
    assert len(seen) == 1 and isinstance(seen[0], RuntimeError), seen
    assert "enumerate_all" in str(seen[0])
    # The log is unharmed: it rotates again, and goes on.
    assert lg.rotate() == lg.seq
    lg.update({"op": "put", "key": "b", "value": 2})
    lg.close()
    records: list[Any] = []
    persistlog.restore(log_dir, records.append)
    assert records == [{"op": "put", "key": "a", "value": 1}, {"op": "put", "key": "b", "value": 2}]

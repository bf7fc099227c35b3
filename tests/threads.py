"""Threads in tests: run several side by side, and wait for what another one does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0,
               describe: Callable[[], str] | str = "condition") -> Any:
    """Poll ``predicate`` until it is truthy (returning its value) or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            text = describe() if callable(describe) else describe
            raise AssertionError(f"timed out after {timeout}s waiting for: {text}")
        time.sleep(0.005)


def run_threads(target: Callable[[int], None], n: int, timeout: float = 60.0) -> list[BaseException]:
    """Call ``target(i)`` for ``i`` in ``range(n)``, each on its own thread, all released at
    once; wait for them all and return what they raised."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        barrier.wait()
        try:
            target(i)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads still running after {timeout}s: {stuck}"
    return errors

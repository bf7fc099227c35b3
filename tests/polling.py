"""Waiting for something another thread or process does, with a deadline."""

from __future__ import annotations

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

"""A Ctrl-C at each point where CPython could run its handler on the app's thread.

CPython runs a signal handler, and so raises Ctrl-C's ``KeyboardInterrupt``, where it
checks for one: as a Python function starts, and right after a C function returns (the
exception then comes from that call). :class:`PointInterrupter`, a ``sys.setprofile`` hook,
counts those points in the given source files and raises at the n-th;
:func:`every_point` runs a workload once per point.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any


class PointInterrupter:
    """Raise ``KeyboardInterrupt`` at the ``nth`` point (None: never) in code whose file
    name starts with one of ``files``, on the thread that enters it (``with``)."""

    def __init__(self, files: tuple[str, ...], nth: int | None) -> None:
        self.files = files
        self.nth = nth
        self.points = 0
        self.where = ""  # the point interrupted: "function:line[ after the C call]"

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        # Not in a __del__, nor in a generator expression (which any() and all() leave
        # suspended, closed as it is collected): CPython reports an exception raised
        # there instead of raising it. A Ctrl-C there is lost; nothing else is.
        if event in ("call", "c_return") and code.co_filename.startswith(self.files) \
                and code.co_name not in ("__del__", "<genexpr>"):
            self.points += 1
            if self.points == self.nth:
                after = "" if event == "call" else f" after {getattr(arg, '__qualname__', arg)}"
                self.where = f"{code.co_qualname}:{frame.f_lineno}{after}"
                raise KeyboardInterrupt(self.where)

    def __enter__(self) -> PointInterrupter:
        sys.setprofile(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        sys.setprofile(None)


class Retrier:
    """Calls retried as an app would after a Ctrl-C: the interruptions, and the slowest
    call with its retries (a call that waited for a timeout shows here)."""

    def __init__(self) -> None:
        self.interrupts = 0
        self.slowest = 0.0

    def __call__(self, call: Callable[[], Any]) -> Any:
        began = time.monotonic()
        try:
            while True:
                try:
                    return call()
                except KeyboardInterrupt:
                    self.interrupts += 1
        finally:
            self.slowest = max(self.slowest, time.monotonic() - began)


def every_point(run: Callable[[int | None], tuple[int, int, str]], stride: int = 1) -> None:
    """``run(nth)`` (returning points passed, interruptions, the point interrupted) once
    with no interruption, then for every ``stride``-th point of that run: each run is
    interrupted once, but a run may pass a few points fewer (a worker thread quicker or
    slower: a held writer polls, a rotation's job runs before or after a write), so the
    last ones may not come: at most 1 in 8 (a store's buffered run of 570 points passed up
    to 31 fewer)."""
    points, interrupts, _ = run(None)
    assert points >= 300 and interrupts == 0, points
    missed = 0
    for nth in range(1, points + 1, stride):
        passed, interrupts, point = run(nth)
        if interrupts == 0:
            assert passed < nth, (nth, passed)
            missed += 1
        else:
            assert interrupts == 1, (nth, point)
    assert missed <= points // stride // 8, (missed, points)

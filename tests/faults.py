"""Fault injection for fsspec: a filesystem that wraps another and fails on command.

Importing this module registers the protocol ``faulty``, so any code that builds
filesystems from URLs can be pointed at it::

    plan = FaultPlan().fail("pipe_file", nth=2, error=errno.ENOSPC)
    dest = open_destination("faulty://bucket/log", target_protocol="memory", faults=plan)

Operations are named after the fsspec methods the wrapper forwards (``ls``, ``info``,
``cat_file``, ``pipe_file``, ``rm_file``, ``makedirs``, ``exists``, ``isdir``, ``open``).
Each rule fires on the ``nth`` call of its operation (counted per plan) and for ``times``
consecutive calls. A fault can:

* raise a permanent ``OSError`` (``errno.EIO``, ``errno.ENOSPC``…) before the call;
* raise a transient error (``ConnectionResetError`` by default, like a dropped connection);
* raise *after* the call went through (``after=True``), like a response lost on the wire;
* delay the call (``delay(op, seconds)``);
* run something else first (``call_before(op, hook)``), at that exact point: another
  process deleting or writing files between two calls of a reader; or just after the
  call (``call_after``) (``path=``: the ``nth`` call of ``op`` on a path that contains
  it).

Instances are never cached by fsspec, so each plan gets its own wrapper; the target
filesystem is built with ``fsspec.filesystem(target_protocol, **target_options)`` (for
``memory`` that is the process-global store).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import fsspec
from fsspec.spec import AbstractFileSystem

PROTOCOL = "faulty"


@dataclass
class Fault:
    """One rule of a :class:`FaultPlan`."""

    op: str
    nth: int
    times: int
    make_error: Callable[[str], BaseException] | None
    delay: float = 0.0
    after: bool = False
    hook: Callable[[], None] | None = None
    #: The hook runs after the call went through rather than before it.
    hook_after: bool = False
    #: Only calls on a path containing this, counted apart (None: every call of ``op``).
    path: str | None = None
    seen: int = 0

    def matches(self, op: str, count: int, path: str = "") -> bool:
        if op != self.op:
            return False
        if self.path is not None:
            if self.path not in path:
                return False
            self.seen += 1
            count = self.seen
        return self.nth <= count < self.nth + self.times


class FaultPlan:
    """Which calls fail, and how; also counts every call by operation."""

    def __init__(self) -> None:
        self.rules: list[Fault] = []
        self.calls: Counter[str] = Counter()
        self.fired: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        # The path of the call being run, per thread (set by the filesystem: run() keeps
        # its signature for plans that override it).
        self._call = threading.local()

    def __repr__(self) -> str:
        return f"FaultPlan({len(self.rules)} rules, calls={dict(self.calls)})"

    def fail(
        self,
        op: str,
        nth: int = 1,
        error: int | BaseException | type[BaseException] = errno.EIO,
        times: int = 1,
        after: bool = False,
    ) -> FaultPlan:
        """Fail calls ``nth…nth+times-1`` of ``op`` with ``error`` (errno, class or instance)."""
        self.rules.append(Fault(op, nth, times, _error_factory(error), after=after))
        return self

    def transient(
        self,
        op: str,
        nth: int = 1,
        times: int = 1,
        after: bool = False,
        error: type[BaseException] = ConnectionResetError,
    ) -> FaultPlan:
        """Fail with a retryable error (a dropped connection by default)."""
        return self.fail(op, nth, error, times, after)

    def delay(self, op: str, seconds: float, nth: int = 1, times: int = 1) -> FaultPlan:
        """Sleep ``seconds`` before the matching calls, then let them through."""
        self.rules.append(Fault(op, nth, times, None, delay=seconds))
        return self

    def call_before(self, op: str, hook: Callable[[], None], nth: int = 1, path: str | None = None) -> FaultPlan:
        """Run ``hook`` just before call ``nth`` of ``op`` (of those on a path containing
        ``path``, if given), then let the call through."""
        self.rules.append(Fault(op, nth, 1, None, hook=hook, path=path))
        return self

    def call_after(self, op: str, hook: Callable[[], None], nth: int = 1, path: str | None = None) -> FaultPlan:
        """Run ``hook`` just after call ``nth`` of ``op`` (as :meth:`call_before`) went through."""
        self.rules.append(Fault(op, nth, 1, None, hook=hook, hook_after=True, path=path))
        return self

    def run_on(self, op: str, call: Callable[[], Any], path: str) -> Any:
        """:meth:`run` for a call on ``path`` (which ``path=`` rules match)."""
        self._call.path = path
        try:
            return self.run(op, call)
        finally:
            self._call.path = ""

    def run(self, op: str, call: Callable[[], Any]) -> Any:
        """Apply the plan to one call of ``op``."""
        path = getattr(self._call, "path", "")
        with self._lock:
            self.calls[op] += 1
            count = self.calls[op]
            rules = [r for r in self.rules if r.matches(op, count, path)]
            if rules:
                self.fired.append((op, count))
        for rule in rules:
            if rule.delay:
                time.sleep(rule.delay)
            if rule.hook is not None and not rule.hook_after:
                rule.hook()
        for rule in rules:
            if rule.make_error is not None and not rule.after:
                raise rule.make_error(f"injected fault: {op} call {count}")
        result = call()
        for rule in rules:
            if rule.hook is not None and rule.hook_after:
                rule.hook()
        for rule in rules:
            if rule.make_error is not None and rule.after:
                raise rule.make_error(f"injected fault after {op} call {count} went through")
        return result


def _error_factory(
    error: int | BaseException | type[BaseException],
) -> Callable[[str], BaseException]:
    if isinstance(error, int):
        return lambda message: OSError(error, f"{os.strerror(error)} ({message})")
    if isinstance(error, BaseException):
        return lambda message: error
    return lambda message: error(message)


class FaultyFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """Forwards to ``fsspec.filesystem(target_protocol, **target_options)`` through a plan."""

    protocol = PROTOCOL
    cachable = False  # each plan is its own instance

    def __init__(
        self,
        target_protocol: str = "memory",
        target_options: dict[str, Any] | None = None,
        faults: FaultPlan | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.target = fsspec.filesystem(target_protocol, **(target_options or {}))
        self.faults = faults if faults is not None else FaultPlan()

    def _target_path(self, path: str) -> str:
        return str(self.target._strip_protocol(self._strip_protocol(path)))

    def _run(self, op: str, call: Callable[[], Any], path: str = "") -> Any:
        return self.faults.run_on(op, call, path)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        return self._run(
            "ls", lambda: self.target.ls(self._target_path(path), detail=detail, **kwargs), path
        )

    def info(self, path: str, **kwargs: Any) -> Any:
        return self._run("info", lambda: self.target.info(self._target_path(path), **kwargs))

    def exists(self, path: str, **kwargs: Any) -> bool:
        return bool(
            self._run("exists", lambda: self.target.exists(self._target_path(path), **kwargs))
        )

    def isdir(self, path: str) -> bool:
        return bool(self._run("isdir", lambda: self.target.isdir(self._target_path(path))))

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> Any:
        return self._run(
            "cat_file",
            lambda: self.target.cat_file(self._target_path(path), start=start, end=end, **kwargs),
            path,
        )

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        self._run(
            "pipe_file",
            lambda: self.target.pipe_file(self._target_path(path), value, mode=mode, **kwargs),
        )

    def rm_file(self, path: str) -> None:
        self._run("rm_file", lambda: self.target.rm_file(self._target_path(path)))

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self._run(
            "makedirs", lambda: self.target.makedirs(self._target_path(path), exist_ok=exist_ok)
        )

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        self._run(
            "mkdir",
            lambda: self.target.mkdir(
                self._target_path(path), create_parents=create_parents, **kwargs
            ),
        )

    def invalidate_cache(self, path: str | None = None) -> None:
        self.target.invalidate_cache(None if path is None else self._target_path(path))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        return self._run("open", lambda: self.target.open(self._target_path(path), mode, **kwargs))


fsspec.register_implementation(PROTOCOL, FaultyFileSystem, clobber=True)

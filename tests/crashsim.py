"""Crash simulation at the Destination level: failpoints, injected faults and power loss.

``LocalDestination`` calls ``os`` directly, so an fsspec wrapper (``tests/faults.py``)
cannot reach it. This module wraps a real destination instead: a :class:`CrashSimDestination`
forwards every call to a real ``LocalDestination`` (or ``ObjectStoreDestination``) and, around
each call that changes storage, passes a named **failpoint**::

    before:append.write segment     after:append.write segment
    before:append.flush segment     after:append.flush segment
    before:append.sync segment      after:append.sync segment
    before:create segment           mid:create segment        after:create segment
    before:replace CURRENT          mid:replace CURRENT       after:replace CURRENT
    before:delete segment           mid:delete segment        after:delete segment
    before:put segment              after:put segment         (object stores: one PUT)
    before:lock LOCK                after:lock LOCK
    before:list   before:read CURRENT   ...  (only with ``CrashSim(read_points=True)``)

The word after the operation is the *kind* of file (``segment``, ``CURRENT``, ``LEASE``,
``LOCK`` or ``other``). ``mid:`` points exist for the operations that end with a directory
fsync locally: the new name (or the removal) is visible but not yet durable. Every
destination carries a *label* (``primary`` by default) and failpoints are counted per
``(label, point)``; ``sim.points`` lists every ``(label, point, occurrence)`` seen so far,
which is how a test enumerates the crash points of a workload.

A :class:`CrashSim` is one simulated machine: every destination built with its options
shares its failpoint rules, its model of what is durable, and its fate. Rules fire on the
``nth`` time they match (for ``times`` matches):

* ``crash_at(point)`` raises :class:`SimulatedCrash` (a ``BaseException``) and *freezes* the
  machine: the process is dead, so the user-space buffers of open append files are dropped,
  their descriptors closed, local flocks released (the OS does that), and every later call
  through any of its destinations raises :class:`SimulatedCrash` too;
* ``fail_at(point, errno.ENOSPC)`` raises an ``OSError`` (before the call for ``before:``
  points, after it went through for ``after:`` points);
* ``short_write(keep=n)`` lets the first ``n`` bytes of an append reach the OS and raises
  ``ENOSPC``; ``fsync_fails()`` raises ``EIO`` from a sync *and drops the dirty pages*
  (Linux "fsyncgate": a later fsync reports success, but what the failed one covered never
  reaches the disk); ``delay_at(point, seconds)`` is slow I/O; ``on(point, fn)`` calls ``fn``.

After a crash, :meth:`CrashSim.power_loss` rewrites every local file to what would survive
a power cut: appended bytes past the last successful sync are lost (``mode="drop"``), turn to
zeros (``"zeros"``: the size reached the disk, the data did not) or survive up to a random
cut (``"partial"``); names whose directory entry was never made durable disappear; unlinks
and renames that were not followed by a directory fsync are undone. Without ``power_loss``
the state is that of a process crash (SIGKILL): what reached the OS stays. Object stores
lose nothing: a PUT that returned is durable, one that did not never happened.

Usage::

    sim = CrashSim()
    sim.crash_at("before:append.sync segment", nth=3)
    url, options = sim.local(path)              # "crashsim:///path", {"sim": sim, ...}
    lg = persistlog.open(url, dump, storage_options=options, durability="fsync")
    ...                                         # SimulatedCrash (or LogFailedError) surfaces
    sim.abandon(lg)                             # stop the dead Log's threads
    sim.power_loss("drop")
    persistlog.restore(path, apply)             # read back through the plain driver

The module registers the destination protocol ``crashsim`` on import.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import destinations
from destinations import AppendFile, Destination, WriterLock, open_destination
from persistlog._write import at_exit as persistlog_exit

PROTOCOL = "crashsim"

PHASES = ("before", "mid", "after")


class SimulatedCrash(BaseException):
    """The simulated process died here. A ``BaseException`` so that no ``except Exception``
    in the code under test can swallow it and carry on as if the step had happened."""


def kind_of(name: str) -> str:
    """The kind of a destination file name used in failpoint names."""
    if name.endswith(".plog") and len(name) == 36 and name[20] == "-":
        return "segment"
    if name in ("CURRENT", "LEASE", "LOCK"):
        return name
    return "other"


@dataclass
class Rule:
    pattern: str
    label: str | None
    nth: int
    times: int
    action: str  # crash | error | short | fsyncgate | delay | call
    arg: Any = None
    matched: int = 0
    fired: int = 0

    def matches(self, label: str, point: str) -> bool:
        if self.label is not None and self.label != label:
            return False
        return point == self.pattern or fnmatch.fnmatchcase(point, self.pattern)


@dataclass
class _FileModel:
    """What of one local file would survive a power cut."""

    durable_exists: bool = True
    synced_len: int = 0
    holes: list[tuple[int, int]] = field(default_factory=list)
    # The bytes that survive when they are no longer those of the file on disk (an
    # unlink or rename that is not durable yet): restored as they are.
    saved: bytes | None = None


class CrashSim:
    """One simulated machine: failpoint rules, the durability model and the crash switch."""

    def __init__(self, *, record: bool = True, seed: int | None = None, read_points: bool = False) -> None:
        self.rules: list[Rule] = []
        self.record = record
        #: Also pass ``before:/after:list`` and ``before:/after:read <kind>`` failpoints (off by
        #: default: reads change nothing, so crash matrices leave them out). Useful to stop a
        #: reader at an exact step with :meth:`on`.
        self.read_points = read_points
        #: Every (label, point, occurrence) passed, in order.
        self.points: list[tuple[str, str, int]] = []
        self.counts: Counter[tuple[str, str]] = Counter()
        self.frozen = False
        #: (label, point, occurrence) where the crash happened.
        self.crashed_at: tuple[str, str, int] | None = None
        self.rng = random.Random(seed)
        self._mutex = threading.RLock()
        self._files: dict[str, _FileModel] = {}
        self._appends: list[_SimAppendFile] = []
        self._locks: list[WriterLock] = []
        self.power_losses = 0

    # -- building destinations ----------------------------------------------------------

    def local(self, path: str | os.PathLike[str], label: str = "primary") -> tuple[str, dict[str, Any]]:
        """``(url, storage_options)`` of a crashsim destination over the local ``path``."""
        path = os.path.abspath(os.fspath(path))
        return f"{PROTOCOL}://{path}", {"sim": self, "label": label}

    def remote(
        self, target: str, target_options: dict[str, Any] | None = None, label: str = "primary"
    ) -> tuple[str, dict[str, Any]]:
        """``(url, storage_options)`` of a crashsim destination over the object store ``target``."""
        rest = target.split("://", 1)[-1]
        url = f"{PROTOCOL}://{label}/{rest}"
        return url, {"sim": self, "label": label, "target": target, "target_options": dict(target_options or {})}

    # -- rules --------------------------------------------------------------------------

    def _add(self, pattern: str, action: str, arg: Any = None, *, nth: int = 1, times: int = 1,
             label: str | None = None) -> CrashSim:
        phase = pattern.split(":", 1)[0]
        if phase not in PHASES and phase != "*":
            raise ValueError(f"failpoint {pattern!r} must start with one of {PHASES}")
        with self._mutex:
            self.rules.append(Rule(pattern, label, nth, times, action, arg))
        return self

    def crash_at(self, point: str, nth: int = 1, label: str | None = None) -> CrashSim:
        """Die at the ``nth`` failpoint matching ``point`` (exact name or fnmatch pattern)."""
        return self._add(point, "crash", nth=nth, label=label)

    def fail_at(self, point: str, error: int | BaseException = errno.EIO, nth: int = 1, times: int = 1,
                label: str | None = None) -> CrashSim:
        """Raise ``OSError(error)`` (or ``error`` itself) at the matching failpoints."""
        return self._add(point, "error", error, nth=nth, times=times, label=label)

    def short_write(self, keep: int, nth: int = 1, label: str | None = None,
                    kind: str = "segment") -> CrashSim:
        """The ``nth`` append writes only ``keep`` bytes, then fails with ``ENOSPC``."""
        return self._add(f"before:append.write {kind}", "short", keep, nth=nth, label=label)

    def fsync_fails(self, nth: int = 1, label: str | None = None, kind: str = "segment") -> CrashSim:
        """The ``nth`` sync fails with ``EIO`` and what it should have made durable is lost."""
        return self._add(f"before:append.sync {kind}", "fsyncgate", nth=nth, label=label)

    def delay_at(self, point: str, seconds: float, nth: int = 1, times: int = 1 << 30,
                 label: str | None = None) -> CrashSim:
        """Sleep before the matching calls (slow I/O)."""
        return self._add(point, "delay", seconds, nth=nth, times=times, label=label)

    def on(self, point: str, fn: Callable[[str, str], None], nth: int = 1, times: int = 1,
           label: str | None = None) -> CrashSim:
        """Call ``fn(label, point)`` at the matching failpoints."""
        return self._add(point, "call", fn, nth=nth, times=times, label=label)

    # -- the failpoint ------------------------------------------------------------------

    def check_alive(self) -> None:
        if self.frozen:
            raise SimulatedCrash(f"the process died earlier (at {self.crashed_at})")

    def hit(self, label: str, point: str) -> list[Rule]:
        """Pass the failpoint ``point``; returns the rules the caller must act on itself
        (``short``, ``fsyncgate``, ``error`` at ``after:``). Crashes and ``before:``
        errors are raised from here."""
        with self._mutex:
            self.check_alive()
            self.counts[(label, point)] += 1
            occurrence = self.counts[(label, point)]
            if self.record:
                self.points.append((label, point, occurrence))
            due: list[Rule] = []
            for rule in self.rules:
                if rule.matches(label, point):
                    rule.matched += 1
                    if rule.nth <= rule.matched < rule.nth + rule.times:
                        rule.fired += 1
                        due.append(rule)
            for rule in due:
                if rule.action == "crash":
                    self._freeze_locked((label, point, occurrence))
                    raise SimulatedCrash(f"simulated crash at {point} #{occurrence} ({label})")
        rest: list[Rule] = []
        for rule in due:
            if rule.action == "delay":
                time.sleep(rule.arg)
            elif rule.action == "call":
                rule.arg(label, point)
            elif rule.action == "error" and not point.startswith("after:"):
                raise _as_error(rule.arg, f"injected at {point} #{occurrence} ({label})")
            else:
                rest.append(rule)
        if due:
            self.check_alive()  # the process may have died while this thread slept or waited
        return rest

    def _after(self, label: str, point: str) -> None:
        for rule in self.hit(label, point):
            if rule.action == "error":
                raise _as_error(rule.arg, f"injected after {point} went through ({label})")

    # -- death ----------------------------------------------------------------------------

    def crash(self) -> None:
        """Kill the simulated process now (if no failpoint did already)."""
        with self._mutex:
            if not self.frozen:
                self._freeze_locked(None)

    def _freeze_locked(self, where: tuple[str, str, int] | None) -> None:
        self.frozen = True
        self.crashed_at = where
        # The process is gone: user-space buffers with it, descriptors and flocks closed.
        for f in self._appends:
            f._die()
        self._appends.clear()
        for lk in self._locks:
            with contextlib.suppress(Exception):
                lk.release()
        self._locks.clear()

    def abandon(self, lg: Any) -> None:
        """Stop a Log whose process died: its threads hit the frozen machine and end."""
        self.crash()
        with quiet_crash_threads():
            try:
                lg.close()
            except BaseException:  # noqa: BLE001 - the dead process raises whatever it raises
                pass
        # A dead process seals nothing at its exit: the close above was its last act.
        lg._close_done = True
        persistlog_exit.forget(lg)

    # -- the durability model -------------------------------------------------------------

    def _model(self, path: str) -> _FileModel | None:
        return self._files.get(path)

    def _durable_bytes(self, path: str) -> bytes | None:
        """What of ``path`` survives a power cut right now (None: nothing)."""
        m = self._files.get(path)
        if m is None:
            try:
                with open(path, "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return None
        if not m.durable_exists:
            return None
        if m.saved is not None:
            return m.saved
        try:
            with open(path, "rb") as f:
                data = bytearray(f.read(m.synced_len))
        except FileNotFoundError:
            return None
        for a, b in m.holes:
            for i in range(a, min(b, len(data))):
                data[i] = 0
        return bytes(data)

    def _created(self, path: str, size: int, durable: bool) -> None:
        with self._mutex:
            self._files[path] = _FileModel(durable_exists=durable, synced_len=size)

    def power_loss(self, mode: str = "drop") -> dict[str, str]:
        """Rewrite every local file to what survives a power cut; returns what changed.

        Needs a dead process (call after a crash, or it crashes first).
        """
        if mode not in ("drop", "zeros", "partial", "keep"):
            raise ValueError(f"unknown power-loss mode {mode!r}")
        self.crash()
        changed: dict[str, str] = {}
        with self._mutex:
            self.power_losses += 1
            for path, m in sorted(self._files.items()):
                exists = os.path.exists(path)
                if not m.durable_exists:
                    if exists:
                        os.unlink(path)
                        changed[path] = "removed"
                    continue
                if m.saved is not None:
                    _write_file(path, m.saved)
                    changed[path] = "restored"
                    continue
                if not exists:
                    changed[path] = "gone"  # deleted durably after the model was made
                    continue
                with open(path, "rb") as f:
                    disk = f.read()
                durable = bytearray(disk[: m.synced_len])
                for a, b in m.holes:
                    for i in range(a, min(b, len(durable))):
                        durable[i] = 0
                tail = disk[m.synced_len:]
                if mode == "drop":
                    kept = b""
                elif mode == "zeros":
                    kept = bytes(len(tail))
                elif mode == "partial":
                    kept = tail[: self.rng.randint(0, len(tail))] if tail else b""
                else:
                    kept = tail
                new = bytes(durable) + kept
                if new != disk:
                    _write_file(path, new)
                    changed[path] = f"{len(disk)} -> {len(new)} bytes ({mode})"
        return changed


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _as_error(error: int | BaseException, message: str) -> BaseException:
    if isinstance(error, int):
        return OSError(error, f"{os.strerror(error)} ({message})")
    return error


@contextlib.contextmanager
def quiet_crash_threads() -> Iterator[None]:
    """Threads of a dead simulated process end with :class:`SimulatedCrash`; do not report
    those as unhandled thread exceptions (anything else still is)."""
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not None and issubclass(args.exc_type, SimulatedCrash):
            return
        previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        if threading.excepthook is hook:
            threading.excepthook = previous


# -- the wrapper ------------------------------------------------------------------------------


class CrashSimDestination(Destination):
    """A real destination behind failpoints; see the module docstring.

    ``storage_options``: ``sim`` (the :class:`CrashSim`; a fresh one if omitted), ``label``,
    ``target`` (URL of the real destination; default: the local path of this URL) and
    ``target_options`` (its storage options).
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        opts = dict(storage_options or {})
        self.sim: CrashSim = opts.pop("sim", None) or CrashSim()
        self.label: str = opts.pop("label", "primary")
        target = opts.pop("target", None)
        target_options = opts.pop("target_options", None) or {}
        if opts:
            raise TypeError(f"unknown crashsim options {sorted(opts)}")
        if target is None:
            rest = url.split("://", 1)[1]
            if not rest.startswith("/"):
                raise ValueError(f"crashsim URL without a target must name an absolute path: {url!r}")
            target = rest
        self.inner: Destination = open_destination(target, **target_options)
        self.appendable = self.inner.appendable
        self.default_flush_interval = self.inner.default_flush_interval
        self._local = self.inner.appendable
        self._dir = getattr(self.inner, "path", None)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.url, self.storage_options))

    # -- helpers ------------------------------------------------------------------------

    def _path(self, name: str) -> str | None:
        return os.path.join(self._dir, name) if self._dir is not None else None

    def _point(self, phase: str, op: str, name: str) -> None:
        point = f"{phase}:{op} {kind_of(name)}" if name else f"{phase}:{op}"
        if phase == "after":
            self.sim._after(self.label, point)
            return
        for rule in self.sim.hit(self.label, point):
            raise _as_error(rule.arg if rule.action == "error" else errno.EIO, f"injected at {point}")

    # -- reads: no failpoints, but a dead process reads nothing ------------------------------

    def ensure(self) -> None:
        self.sim.check_alive()
        self.inner.ensure()

    def exists(self) -> bool:
        self.sim.check_alive()
        return self.inner.exists()

    def list(self, start_after: str | None = None) -> list[str]:
        self.sim.check_alive()
        if not self.sim.read_points:
            return self.inner.list(start_after)
        self._point("before", "list", "")
        names = self.inner.list(start_after)
        self._point("after", "list", "")
        return names

    def read(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        self.sim.check_alive()
        if not self.sim.read_points:
            return self.inner.read(name, offset, length)
        self._point("before", "read", name)
        data = self.inner.read(name, offset, length)
        self._point("after", "read", name)
        return data

    def size(self, name: str) -> int:
        self.sim.check_alive()
        return self.inner.size(name)

    # -- writes -------------------------------------------------------------------------

    def create(self, name: str, data: bytes) -> None:
        op = "create" if self._local else "put"
        self._point("before", op, name)
        self.inner.create(name, data)
        path = self._path(name)
        if path is not None:
            # Temp file fsynced and linked; the directory fsync makes the name durable.
            self.sim._created(path, len(data), durable=False)
            self._point("mid", op, name)
            self.sim._created(path, len(data), durable=True)
        self._point("after", op, name)

    def replace(self, name: str, data: bytes) -> None:
        self._replace(name, data, durable=True)

    def replace_hint(self, name: str, data: bytes) -> None:
        self._replace(name, data, durable=False)

    def _replace(self, name: str, data: bytes, durable: bool) -> None:
        self._point("before", "replace", name)
        write = self.inner.replace if durable else self.inner.replace_hint
        path = self._path(name)
        if path is None:
            write(name, data)
        else:
            with self.sim._mutex:
                old = self.sim._durable_bytes(path)
            write(name, data)
            with self.sim._mutex:
                self.sim._files[path] = _FileModel(durable_exists=old is not None, saved=old)
            self._point("mid", "replace", name)
            if durable:  # a hint is never synced: a power cut brings back the old bytes
                self.sim._created(path, len(data), durable=True)
        self._point("after", "replace", name)

    def delete(self, name: str) -> None:
        self._point("before", "delete", name)
        path = self._path(name)
        if path is None:
            self.inner.delete(name)
        else:
            with self.sim._mutex:
                old = self.sim._durable_bytes(path)
            self.inner.delete(name)
            with self.sim._mutex:
                self.sim._files[path] = _FileModel(durable_exists=old is not None, saved=old)
            self._point("mid", "delete", name)
            with self.sim._mutex:
                self.sim._files[path] = _FileModel(durable_exists=False)
        self._point("after", "delete", name)

    def open_append(self, name: str) -> AppendFile:
        self.sim.check_alive()
        inner = self.inner.open_append(name)
        path = self._path(name)
        assert path is not None
        with self.sim._mutex:
            if path not in self.sim._files:
                # A file this machine did not create: what is on disk counts as durable.
                self.sim._files[path] = _FileModel(synced_len=os.path.getsize(path))
            f = _SimAppendFile(self, name, path, inner)
            self.sim._appends.append(f)
        return f

    def lock(self, owner: str, ttl: float = 30.0) -> WriterLock:
        kind = "LOCK" if self._local else "LEASE"
        self._point("before", "lock", kind)
        inner = self.inner.lock(owner, ttl)
        with self.sim._mutex:
            if self._local:
                self.sim._locks.append(inner)
        self._point("after", "lock", kind)
        return _SimLock(self.sim, inner)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.inner.close()


class _SimLock(WriterLock):
    """A dead process neither renews nor releases: both become no-ops after the crash."""

    def __init__(self, sim: CrashSim, inner: WriterLock) -> None:
        self.sim = sim
        self.inner = inner

    def renew(self) -> None:
        if not self.sim.frozen:
            self.inner.renew()

    def release(self) -> None:
        if not self.sim.frozen:
            self.inner.release()


class _SimAppendFile(AppendFile):
    def __init__(self, dest: CrashSimDestination, name: str, path: str, inner: AppendFile) -> None:
        self.dest = dest
        self.sim = dest.sim
        self.name = name
        self.path = path
        self.inner = inner
        self._dead = False

    def __repr__(self) -> str:
        return f"_SimAppendFile({self.path!r})"

    def _die(self) -> None:
        """The process died: drop what is still in user space, close the descriptor."""
        self._dead = True
        inner = self.inner
        lock = getattr(inner, "_lock", None)
        buf = getattr(inner, "_buffer", None)
        if lock is None or buf is None:
            return
        with lock:
            buf.clear()
            if not inner._closed:  # type: ignore[attr-defined]
                inner._closed = True  # type: ignore[attr-defined]
                with contextlib.suppress(OSError):
                    inner._file.close()  # type: ignore[attr-defined]  # its descriptor, unflushed

    def write(self, data: bytes) -> None:
        point = "before:append.write segment" if kind_of(self.name) == "segment" else f"before:append.write {kind_of(self.name)}"
        for rule in self.sim.hit(self.dest.label, point):
            if rule.action == "short":
                keep = max(0, min(int(rule.arg), len(data) - 1))
                self.inner.write(bytes(data[:keep]))
                self.inner.flush()
                raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected short write: "
                              f"{keep} of {len(data)} bytes reached {self.path})")
            raise _as_error(rule.arg if rule.action == "error" else errno.EIO, f"injected at {point}")
        self.inner.write(data)
        self.dest._point("after", "append.write", self.name)

    def flush(self) -> None:
        self.dest._point("before", "append.flush", self.name)
        self.inner.flush()
        self.dest._point("after", "append.flush", self.name)

    def sync(self) -> None:
        point = f"before:append.sync {kind_of(self.name)}"
        for rule in self.sim.hit(self.dest.label, point):
            if rule.action == "fsyncgate":
                # The kernel wrote back (or dropped) the dirty pages and reports EIO; they
                # are marked clean, so a later fsync will not retry them.
                self.inner.flush()
                size = self.inner.size
                with self.sim._mutex:
                    m = self.sim._files[self.path]
                    if size > m.synced_len:
                        m.holes.append((m.synced_len, size))
                raise OSError(errno.EIO, f"{os.strerror(errno.EIO)} (injected fsync failure on {self.path})")
            raise _as_error(rule.arg if rule.action == "error" else errno.EIO, f"injected at {point}")
        self.inner.sync()
        size = self.inner.size
        with self.sim._mutex:
            m = self.sim._files[self.path]
            m.synced_len = max(m.synced_len, size)
        self.dest._point("after", "append.sync", self.name)

    def truncate(self, size: int) -> None:
        self.sim.check_alive()
        self.inner.truncate(size)
        with self.sim._mutex:
            m = self.sim._files.get(self.path)
            if m is not None:
                m.synced_len = min(m.synced_len, size)

    @property
    def size(self) -> int:
        self.sim.check_alive()
        return self.inner.size

    def close(self) -> None:
        self.sim.check_alive()
        self.inner.close()
        with self.sim._mutex:
            if self in self.sim._appends:
                self.sim._appends.remove(self)


destinations.register(PROTOCOL, "crashsim:CrashSimDestination", clobber=True)

__all__ = ["CrashSim", "CrashSimDestination", "SimulatedCrash", "kind_of", "quiet_crash_threads"]

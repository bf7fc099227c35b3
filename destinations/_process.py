"""Who a process is, beyond its pid, and whether a recorded process still runs.

A pid alone names a process only while it lives: once it exits, the kernel hands the number
to the next process. A process is named here by three things, read from ``/proc``:

* ``host``: the host name, as every owner record holds it;
* ``boot_id``: ``/proc/sys/kernel/random/boot_id``, new at every boot of the kernel;
* ``start``: the process's start time in clock ticks since boot (field 22 of
  ``/proc/<pid>/stat``), which no two processes of one boot share under the same pid.

A recorded process runs when, on this host and this boot, ``/proc/<pid>/stat`` exists,
shows the same start time and a state other than zombie or dead. A stopped process
(SIGSTOP, ``T``) runs: it may resume and write. Without ``/proc`` (not Linux) the start time
and boot id are None, and liveness falls back to whether the pid exists.
"""

from __future__ import annotations

import functools
import os
import socket

_BOOT_ID = "/proc/sys/kernel/random/boot_id"

# States of /proc/<pid>/stat for a process that will never run again.
_GONE_STATES = frozenset("ZXx")


@functools.lru_cache(maxsize=1)
def boot_id() -> str | None:
    """This boot's id, or None without ``/proc``."""
    try:
        with open(_BOOT_ID, encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in ticks) of ``pid``; None when it does not exist or has no
    readable ``/proc`` entry."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold ") ": fields after
    # it start past the last one.
    fields = raw[raw.rfind(b")") + 2:].split()
    try:
        return fields[0].decode("ascii", "replace"), int(fields[19])
    except (IndexError, ValueError):
        return None


# (pid, start time) of this process, read once per pid (a forked child reads its own).
_own_start: tuple[int, int | None] | None = None


def identity() -> dict[str, object]:
    """This process as an owner record holds it: ``boot_id`` and ``start`` (None without
    ``/proc``). The start time is read once per process: a process opening thousands of
    logs takes thousands of locks."""
    global _own_start
    pid = os.getpid()
    own = _own_start
    if own is None or own[0] != pid:
        st = _stat(pid)
        own = _own_start = (pid, st[1] if st else None)
    return {"boot_id": boot_id(), "start": own[1]}


def process_running(
    host: str | None, pid: int | None, start: int | None = None, boot: str | None = None
) -> bool | None:
    """Whether the process recorded as (``host``, ``pid``, ``start``, ``boot``) still runs.

    None when this host cannot tell (the record names another host, or no pid). A record
    of this host from an earlier boot is not running; one without start time or boot id
    (written by an older version) runs while its pid exists.
    """
    if pid is None or host != socket.gethostname():
        return None
    here = boot_id()
    if boot is not None and here is not None and boot != here:
        return False
    st = _stat(pid)
    if st is not None:
        state, started = st
        if state in _GONE_STATES:
            return False
        return start is None or started == start
    if here is not None:
        return False  # /proc works here and has no such process
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    except OSError:
        return False
    return True

"""Logs left open: sealed at interpreter exit, and when collected unclosed.

A script that ends (or raises ``SystemExit``) without ``close()`` must not lose what it
logged: every open Log is registered here, *weakly*, and an ``atexit`` handler writes what
is pending and seals each one still open. The registry keeps nothing alive: the jobs the
runtime runs for a Log hold it only weakly too, so a Log the app drops can be collected.

A Log collected unclosed warns with ``ResourceWarning`` and is then closed (its pending
records written, the log sealed, the lock released) on a thread of its own. Not in
``__del__`` itself: the collection can run in any thread at any allocation, including one
of the runtime's threads while it holds a lock that closing needs, which would deadlock.
The closing thread resurrects the Log for as long as it runs; it is not a daemon, so the
interpreter waits for it before exiting.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from typing import Protocol

logger = logging.getLogger("persistlog")

# How long closing at exit waits for an enumeration running on a runtime worker before
# it seals the log anyway (the acknowledged records are written either way; the
# enumeration's log then stays incomplete, which restore handles).
EXIT_ROTATION_WAIT = 10.0


class Closeable(Protocol):
    def _close_left_open(self, rotation_wait: float | None) -> None: ...


_open: weakref.WeakSet[Closeable] = weakref.WeakSet()
_pid = os.getpid()


def register(lg: Closeable) -> None:
    """Seal ``lg`` at exit if it is still open then.

    The exit handler is registered again each time, so that it runs before the ``atexit``
    handlers registered since (``atexit`` runs the last registered first): s3fs closes
    its client sessions from a ``weakref.finalize``, whose ``atexit`` hook is registered
    with the first finalizer of the process, typically at a Log's first request, and a
    seal after that would meet closed sessions, as would the rotation or flush a
    runtime worker may still run while the seal waits for it.
    """
    _open.add(lg)
    atexit.unregister(_close_all_at_exit)
    atexit.register(_close_all_at_exit)


def forget(lg: Closeable) -> None:
    _open.discard(lg)


def close_collected(lg: Closeable) -> None:
    """Close a Log whose last reference went away (from its ``__del__``)."""
    if os.getpid() != _pid:
        return  # a forked child's copy: the parent's Log is not this process's to seal
    closer = threading.Thread(target=_close_quietly, args=(lg, None), name="persistlog-close", daemon=False)
    try:
        closer.start()
    except RuntimeError:  # the interpreter is shutting down and starts no threads
        _close_quietly(lg, EXIT_ROTATION_WAIT)


def _close_quietly(lg: Closeable, rotation_wait: float | None) -> None:
    try:
        lg._close_left_open(rotation_wait)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - nobody is left to raise it to
        logger.warning("closing %r, left open, failed: %r", lg, e)


def _close_all_at_exit() -> None:
    if os.getpid() != _pid:
        return
    for lg in list(_open):
        _close_quietly(lg, EXIT_ROTATION_WAIT)

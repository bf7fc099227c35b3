"""Handing a log over from a live writer to a new process (a rolling deploy).

Both sides open with ``handover=True``. The new process, finding the writer lock (or
lease) held, creates a ``HANDOVER`` request beside it, create-only, naming itself and the
time until which it waits (docs/FORMAT.md), then takes the lock as soon as it is free.
The live writer's background job looks for a request every :data:`POLL_LOCAL` (local disk)
or :data:`POLL_OBJECT` (object store) seconds; finding a fresh one from another writer, it
calls the app's ``on_handover`` hook, closes its Log (with ``rotate=True``: a fresh
snapshot, so that the new writer's open needs no enumeration), which writes what is
pending, seals and releases the lock; from then on its calls raise :class:`HandedOver`.
The new writer then restores and opens as any writer does (on an object store it fences
the newest log first, so a writer that was paused meanwhile can add nothing).

Nothing here is needed for safety: the lock (locally) or the fence (on an object store)
keeps one writer at a time whatever the request says. A request only makes the live
writer leave early instead of when its process ends or its lease runs out.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from destinations import Destination, LockHeld, WriterLock

from .._errors import WriterConflict
from .._format import constants as F
from .._format.decoder import parse_handover_request
from .._format.encoder import handover_request
from .lock_holder import read_holder

logger = logging.getLogger("persistlog")

#: Seconds ``open(..., handover=True)`` waits for the live writer to let go, by default.
HANDOVER_TIMEOUT = 30.0
#: Seconds between two looks for a request by a local writer opened with ``handover=True``
#: (one ``stat``), and by an object-store writer (one HEAD request).
POLL_LOCAL = 0.1
POLL_OBJECT = 0.5
#: Seconds between two tries of the lock by the process asking for a handover.
TRY_LOCAL = 0.02
TRY_OBJECT = 0.1
#: A request is answered only with at least this many seconds left before its deadline:
#: one answered later would close a Log whose successor is giving up.
ANSWER_MARGIN = 0.5


@dataclass(frozen=True)
class HandoverRequest:
    """A ``HANDOVER`` request read back: who asks, which writer it asks (only that one
    answers), and until when (Unix seconds) it waits."""

    by: str
    to: str
    asked: float
    deadline: float


def read_request(dest: Destination) -> HandoverRequest | None:
    """The request at ``dest`` (None if there is none, or it is not one)."""
    try:
        raw = dest.read(F.HANDOVER_NAME, 0, F.HANDOVER_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    parsed = parse_handover_request(raw)
    return None if parsed is None else HandoverRequest(*parsed)


def ask_for_handover(
    dest: Destination, writer_id: str, ttl: float, timeout: float, held: LockHeld
) -> WriterLock:
    """Ask the writer holding ``dest`` to hand it over, and take its lock once it is free,
    waiting ``timeout`` seconds at most. Raises :class:`WriterConflict` if the holder does
    not let go in time, or lets go to another process that asked too."""
    started = time.time()
    deadline = started + timeout
    holder = read_holder(dest)
    holder_owner = holder.owner if holder is not None else None
    # Addressed to the holder we saw: a writer that takes the log over meanwhile (another
    # asker) does not answer it, and we give up on it as soon as we see it holds the lock.
    mine = _post_request(dest, writer_id, holder_owner or "?", started, deadline)
    logger.info("asking the writer of %s (%s) to hand the log over; waiting up to %gs", dest.url, held, timeout)
    pause = TRY_LOCAL if dest.appendable else TRY_OBJECT
    try:
        while True:
            try:
                lock = dest.lock(writer_id, ttl)
            except LockHeld as e:
                now_holder = read_holder(dest)
                now_owner = now_holder.owner if now_holder is not None else None
                if now_owner not in (holder_owner, None, writer_id):
                    raise WriterConflict(
                        f"{e}: the log at {dest.url} was handed over to another process that asked at the "
                        "same time; a destination has one writer at a time"
                    ) from e
                if time.time() >= deadline:
                    raise WriterConflict(
                        f"{e}; it did not hand the log at {dest.url} over within {timeout:g}s "
                        "(it answers only if it opened with handover=True and is running; "
                        "a process stopped or gone lets go when its lock or lease ends)"
                    ) from e
                time.sleep(pause)
                continue
            logger.info("took the log at %s over after %.3fs", dest.url, time.time() - started)
            return lock
    finally:
        if mine:
            _withdraw(dest, writer_id)


def _post_request(dest: Destination, writer_id: str, to: str, asked: float, deadline: float) -> bool:
    """Create our request; False if another live request is there (we wait beside it)."""
    data = handover_request(writer_id, socket.gethostname(), os.getpid(), to, asked, deadline)
    for _ in range(2):
        try:
            dest.create(F.HANDOVER_NAME, data)
            return True
        except FileExistsError:
            other = read_request(dest)
            if other is not None and other.deadline > time.time():
                logger.info("%s asked for a handover of %s already; waiting beside it", other.by, dest.url)
                return False
            # A request whose asker gave up (or garbage): ours replaces it.
            try:
                dest.delete(F.HANDOVER_NAME)
            except FileNotFoundError:
                pass
    return False


def _withdraw(dest: Destination, writer_id: str) -> None:
    """Delete our request (answered, or given up)."""
    request = read_request(dest)
    if request is not None and request.by != writer_id:
        return
    try:
        dest.delete(F.HANDOVER_NAME)
    except FileNotFoundError:
        pass
    except OSError as e:
        logger.warning("could not delete the handover request at %s: %s", dest.url, e)


class HandoverWatch:
    """A live writer's look for requests, run by its Log's background job; answering one
    runs ``answer(request)`` on a thread of its own (a close may run an enumeration and
    wait for the runtime's workers: never on one of them)."""

    def __init__(self, dest: Destination, writer_id: str, answer: Callable[[HandoverRequest], Any]) -> None:
        self._dest = dest
        self._writer_id = writer_id
        self._answer = answer
        self.every = POLL_LOCAL if dest.appendable else POLL_OBJECT
        self.due = time.monotonic() + self.every
        self.answering: HandoverRequest | None = None
        self._ignored: HandoverRequest | None = None  # a stale request, logged once

    def look(self) -> None:
        """Look for a request once (the background job calls this when ``due``)."""
        self.due = time.monotonic() + self.every
        if self.answering is not None:
            return
        try:
            request = read_request(self._dest)  # one stat or GET when there is none
        except OSError as e:
            logger.debug("looking for a handover request at %s: %s", self._dest.url, e)
            return
        if request is None or request.to != self._writer_id or request == self._ignored:
            return  # none, not one, not for this writer (it asked the one before), or said already
        if request.deadline - time.time() < ANSWER_MARGIN:
            logger.info("ignoring a handover request at %s from %s: its asker has given up", self._dest.url, request.by)
            self._ignored = request
            return
        self.answering = request
        threading.Thread(target=self._answer, args=(request,), name=f"persistlog-handover {self._dest.url}",
                         daemon=True).start()


__all__ = ["HANDOVER_TIMEOUT", "HandoverRequest", "HandoverWatch", "ask_for_handover", "read_request"]

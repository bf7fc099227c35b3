"""The exceptions persistlog raises.

::

    PersistLogError
    ├── CorruptLogError        bytes that cannot be read: checksum, header, version, chain gap
    ├── WriterConflict         another live writer holds the destination
    ├── DestinationError       storage failed (wraps the OSError / client error as __cause__)
    ├── LogFailedError         the Log hit a write failure earlier and refuses further writes
    ├── LogClosedError         the Log was closed (also a RuntimeError)
    │   └── HandedOver         the Log was handed over to a new writer that asked for it
    ├── EnumerateError         the app's enumerate_all raised during a rotation
    ├── CodecError             intact bytes that the app's Codec cannot turn back into its object
    ├── EnumerationStalled     an update held for an enumeration that emitted nothing for 10 s
    ├── LogNotFoundError       restore(missing_ok=False) found no log (also a FileNotFoundError)
    ├── MissingDependencyError reading needs an optional package that is not installed (also an ImportError)
    ├── KeyUnavailableError    an encrypted batch and no key for its key id: no provider, unknown id, wrong key
    ├── ResetRequired          a follower's cursor (a consumer's position) points at data retention already deleted
    ├── PositionError          an LSN or time the logs do not hold: before retention, past the end (also a ValueError)
    ├── ExistingLogError       open() over records nobody restored (restore first, or discard)
    ├── LogSetError            a LogSet's root holds something else, or a set of another depth
    └── QuotaExceeded          a Queue's send would pass its message or byte quota (nothing written)

Misuse of the API (wrong types, unknown options) raises the built-in ``TypeError`` or
``ValueError`` with a message that says what is wrong.
"""

from __future__ import annotations


class PersistLogError(Exception):
    """Base class of every error persistlog raises on purpose."""


class _Where:
    """Where stored bytes sit (destination, log, segment, offset), said after a reason."""

    reason: str
    destination: str
    log: int | None
    segment: str | None
    offset: int | None

    def __init__(
        self, reason: str, destination: str = "", log: int | None = None, segment: str | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.destination = destination
        self.log = log
        self.segment = segment
        self.offset = offset
        Exception.__init__(self, self._message())  # type: ignore[arg-type]

    def _message(self) -> str:
        where = []
        if self.destination:
            where.append(f"destination {self.destination}")
        if self.log is not None:
            where.append(f"log {self.log}")
        if self.segment is not None:
            where.append(f"segment {self.segment}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        return f"{self.reason} ({', '.join(where)})" if where else self.reason


class CorruptLogError(PersistLogError, _Where):
    """Stored bytes failed a check. Names where: destination, log, segment and offset."""

    def __init__(
        self,
        reason: str,
        *,
        destination: str = "",
        log: int | None = None,
        segment: str | None = None,
        offset: int | None = None,
    ) -> None:
        _Where.__init__(self, reason, destination, log, segment, offset)


class WriterConflict(PersistLogError):
    """Another writer holds the destination; persistlog never interleaves two writers."""


class DestinationError(PersistLogError):
    """Reading or writing a destination failed; the storage error is ``__cause__``."""


class LogFailedError(PersistLogError):
    """A write to the primary destination failed; the original error is ``__cause__``.

    Nothing written after the failure was acknowledged. Close the Log, restore, and open a
    new one.
    """


class LogClosedError(PersistLogError, RuntimeError):
    """The Log was closed."""


class HandedOver(LogClosedError):
    """The Log was handed over to another process that opened it with ``handover=True``:
    everything acknowledged before is in the log the new writer restored; this call's
    record was not logged. ``to`` names the new writer."""

    def __init__(self, message: str, to: str = "") -> None:
        super().__init__(message)
        self.to = to


class EnumerateError(PersistLogError):
    """``enumerate_all`` raised during a rotation; the app's exception is ``__cause__``.

    The new log stays incomplete and writing continues in it; the next trigger retries.
    """


class CodecError(PersistLogError):
    """A record read back intact, but the app's :class:`Codec` could not rebuild it: the
    registered class changed since it was logged (a field added, dropped or renamed), or a
    decode or upgrade function raised. The app's exception is ``__cause__``.

    Never damage, so never skipped by ``recovery="skip"``: register the class with a
    ``version`` and ``upgrade`` functions for what older code logged, and read again.
    ``type_name``, ``version`` (the one the record was written with), ``lsn`` (None when
    it could not be told) and ``offset`` say which record; ``where`` names the destination,
    log and segment when the reader knows them.
    """

    def __init__(self, type_name: str, version: int, lsn: int | None, offset: int, cause: object) -> None:
        self.type_name = type_name
        self.version = version
        self.lsn = lsn
        self.offset = offset
        self.where = ""
        self._cause_text = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        super().__init__(self._message())

    def _message(self) -> str:
        at = f"LSN {self.lsn}" if self.lsn is not None else "a record"
        place = f"{self.where}, " if self.where else ""
        return (
            f"{at} ({place}batch at offset {self.offset}) holds a {self.type_name!r} of version "
            f"{self.version} that the app's Codec cannot rebuild: {self._cause_text}. The bytes are "
            "intact (not damage): if the class changed, register it with version= and upgrade= "
            "for what older code logged"
        )

    def locate(self, where: str) -> CodecError:
        """Name the place (destination, log, segment) in the message; returns self."""
        self.where = where
        self.args = (self._message(),)
        return self


class EnumerationStalled(PersistLogError):
    """An update waited for a rotation's ``enumerate_all`` (which runs with updates held,
    the default) and the enumeration emitted nothing for 10 seconds.

    Nothing of the call was logged. The usual cause is an ``enumerate_all`` that waits for
    a lock the held caller holds: an app that keeps per-resource locks across ``update()``
    and ``emit`` opens its log with ``concurrent_enumeration=True``.
    """


class LogNotFoundError(PersistLogError, FileNotFoundError):
    """``restore(..., missing_ok=False)`` found no log at the destination."""


class MissingDependencyError(PersistLogError, ImportError):
    """Bytes that are fine but need an optional package this interpreter lacks, such as a
    zstd-compressed batch without ``zstandard``. Never a sign of damage: install the extra
    the message names (``.extra``; ``.name`` is the missing package) and read again.
    """

    def __init__(self, message: str, *, package: str, extra: str) -> None:
        super().__init__(message, name=package)
        self.package = package
        self.extra = extra


class KeyUnavailableError(PersistLogError, _Where):
    """An encrypted batch that cannot be read with the keys at hand: no key provider was
    given (``key_provider=``, ``--key-provider``), the provider has no key for the batch's key id,
    or its key is not the one the batch was sealed with. Never damage, so never
    :class:`CorruptLogError` and never skipped by ``recovery="skip"``: the bytes are fine,
    the key is missing. Names the destination, log, segment, offset and ``key_id``; never
    the key.
    """

    def __init__(
        self,
        reason: str,
        *,
        key_id: str | None = None,
        destination: str = "",
        log: int | None = None,
        segment: str | None = None,
        offset: int | None = None,
    ) -> None:
        self.key_id = key_id
        _Where.__init__(self, reason, destination, log, segment, offset)


def missing_cryptography(needs: str, extra: str) -> MissingDependencyError:
    """The error for ``needs`` (what needs it) without the cryptography package."""
    return MissingDependencyError(
        f"{needs} need the cryptography package, which is not installed: pip install 'persistlog[{extra}]'",
        package="cryptography",
        extra=extra,
    )


class ResetRequired(PersistLogError):
    """A follower cannot continue from its cursor, or a named consumer from its position
    (retention deleted what it needs, or the cursor is ahead of the log), and no
    ``on_reset`` hook was given."""


class PositionError(PersistLogError, ValueError):
    """A position (an LSN, a commit time, a cursor) that the logs at a destination do not
    hold: before the oldest record retention left, past the end, or inside a gap a writer
    declared there. Never damage: the message and the attributes say what is there.

    ``first_lsn`` and ``last_lsn`` are the oldest and newest record's LSNs (``last_lsn``
    is ``first_lsn - 1`` when the logs hold no record), ``first_time`` and ``last_time``
    the commit times of their batches (seconds since the Unix epoch; None when unknown).
    """

    def __init__(
        self,
        message: str,
        *,
        first_lsn: int,
        last_lsn: int,
        first_time: float | None,
        last_time: float | None,
    ) -> None:
        super().__init__(message)
        self.first_lsn = first_lsn
        self.last_lsn = last_lsn
        self.first_time = first_time
        self.last_time = last_time


class ExistingLogError(PersistLogError):
    """``open()`` found records at the destination that this process did not restore.

    Opening starts a new complete log from ``enumerate_all``; over records the app never
    replayed, that log would say the state is empty and retention would then delete the
    real one. Restore first (``open(url, enumerate_all, replay=...)``, or
    ``restore(url, ...)`` then ``open(url, ...)`` with nothing written in between), or pass
    ``discard_existing=True`` to start over on purpose.
    """


class LogSetError(PersistLogError):
    """A :class:`persistlog.LogSet` cannot be opened at its root: the root holds something
    other than a log set (a log, other files, directories without a ``LOGSET`` marker), a
    marker this version does not read, or a set of another ``depth`` than the one asked for.
    The message names what is there."""


class QuotaExceeded(PersistLogError):
    """:meth:`persistlog.Queue.send` refused a message: with it the queue would hold more
    messages or bytes than its quota (``max_messages``, ``max_bytes``). Nothing was
    written; the message names the quota and what the queue holds."""

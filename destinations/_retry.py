"""Retry policy for object-store requests: transient errors only, capped backoff + jitter.

Transient: HTTP 5xx, throttling (``SlowDown``, 503), 409 conflicts of concurrent
conditional writes, timeouts and connection resets. Permanent (raised at once): missing
objects or buckets (``FileNotFoundError``), access denied (``PermissionError``), create-only
conflicts (``FileExistsError``), failed preconditions (412), bad requests, local disk errors.
"""

from __future__ import annotations

import errno
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, TypeVar

# Under the persistlog hierarchy: one logger ("persistlog") silences or raises all of it.
logger = logging.getLogger("persistlog." + __name__)

T = TypeVar("T")

_EREMOTEIO = getattr(errno, "EREMOTEIO", 121)
# s3fs maps 500 to EREMOTEIO and 503/409/SlowDown to EBUSY; the rest come from sockets.
_TRANSIENT_ERRNOS = {
    _EREMOTEIO,
    errno.EBUSY,
    errno.EAGAIN,
    errno.ETIMEDOUT,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.EPIPE,
    errno.ENETUNREACH,
    errno.EHOSTUNREACH,
}
_PERMANENT = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)
# botocore/aiohttp exceptions that s3fs lets through untranslated, matched by name so that
# this module imports neither.
_TRANSIENT_NAMES = {
    "ClientConnectionError",
    "ClientOSError",
    "ClientPayloadError",
    "ConnectTimeoutError",
    "ConnectionClosedError",
    "EndpointConnectionError",
    "ReadTimeoutError",
    "ResponseStreamingError",
    "ServerDisconnectedError",
}
_TRANSIENT_CODES = {
    "ConditionalRequestConflict",
    "InternalError",
    "RequestTimeout",
    "ServiceUnavailable",
    "SlowDown",
    "Throttling",
    "ThrottlingException",
}


class TransientError(OSError):
    """A failure worth retrying; raised by fault injection and by drivers wrapping stores."""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or the store error it wraps) is worth retrying."""
    if isinstance(exc, TransientError):
        return True
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if any(cls.__name__ in _TRANSIENT_NAMES for cls in type(exc).__mro__):
        return True
    status, code = _http_status(exc)
    if status is not None or code:
        return (status is not None and status >= 500) or status == 429 or code in _TRANSIENT_CODES
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    return False


def _http_status(exc: BaseException) -> tuple[int | None, str]:
    # botocore's ClientError carries the HTTP response; s3fs keeps it as __cause__.
    for e in (exc, exc.__cause__):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = response.get("Error", {}).get("Code", "")
            return (int(status) if status is not None else None), str(code or "")
    return None, ""


@dataclass
class RetryPolicy:
    """Capped exponential backoff with jitter: ``tries`` attempts in all.

    The n-th wait is drawn from ``[d/2, d]`` with ``d = min(cap, base * 2**n)``: the jitter
    keeps many writers throttled together from retrying in lockstep.
    """

    tries: int = 6
    base: float = 0.05
    cap: float = 2.0
    #: Seconds after the first attempt past which no retry starts: an unreachable endpoint
    #: fails within about this long whatever ``tries`` says.
    seconds: float = 20.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    def delays(self) -> Iterator[float]:
        """The waits between attempts (``tries - 1`` of them)."""
        for n in range(max(self.tries - 1, 0)):
            yield self.delay(n)

    def delay(self, n: int) -> float:
        """The wait after the ``n``-th failed attempt (from 0)."""
        d = min(self.cap, self.base * 2**n)
        return random.uniform(d / 2, d)

    def call(
        self,
        fn: Callable[[], T],
        what: str,
        on_retry: Callable[[BaseException], None] | None = None,
    ) -> T:
        """Run ``fn`` until it succeeds, fails permanently, or runs out of tries or of
        ``seconds``; the error of the last attempt is raised, and :func:`attempts_of` says
        how many were made and for how long."""
        # No generator of delays: one left suspended when a retry succeeds is closed as it
        # is collected, where a Ctrl-C is reported and dropped instead of raised.
        started = time.monotonic()
        tries = 0
        while True:
            try:
                tries += 1
                return fn()
            except Exception as e:
                if not is_transient(e):
                    raise
                delay = self.delay(tries - 1) if tries < self.tries else None
                elapsed = time.monotonic() - started
                if delay is not None and elapsed + delay > self.seconds:
                    delay = None
                if delay is None:
                    attempts = "1 try" if tries == 1 else f"{tries} tries"
                    logger.warning("%s: giving up after %s in %.1fs: %s", what, attempts, elapsed, e)
                    e.add_note(f"gave up after {attempts} in {elapsed:.1f}s")
                    raise
                logger.info("%s: transient error, retrying in %.3fs: %s", what, delay, e)
                if on_retry is not None:
                    on_retry(e)
                self.sleep(delay)

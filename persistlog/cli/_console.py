"""What the terminal sees: exit statuses, one-line errors, logging, a progress line and
the small formatting helpers every subcommand prints with."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from .. import CorruptLogError, PersistLogError
from ..reading import UsageError

EXIT_OK = 0
#: Damage was found (or is still there): torn tails, corruption, a refused repair.
EXIT_DAMAGED = 1
#: Bad usage or input, or storage that cannot be used: nothing was checked.
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

logger = logging.getLogger("persistlog.cli")


@contextlib.contextmanager
def logging_to_stderr(verbose: bool) -> Iterator[None]:
    """Send the library's log to stderr while a command runs, then put things back (so
    that ``main(argv)`` can be called in-process, by tests or other tools).

    The readers log every damaged batch they pass over; the subcommands report damage
    themselves, so without ``-v`` only the library's errors get through.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("persistlog: %(levelname)s: %(name)s: %(message)s"))
    saved = []
    for name, quiet in (("persistlog", logging.ERROR), ("destinations", logging.WARNING)):
        logger = logging.getLogger(name)
        saved.append((logger, logger.level, logger.propagate))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG if verbose else quiet)
        logger.propagate = False
    cli = logging.getLogger("persistlog.cli")
    saved_cli = cli.level
    cli.setLevel(logging.DEBUG if verbose else logging.INFO)
    try:
        yield
    finally:
        cli.setLevel(saved_cli)
        for logger, level, propagate in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate


def error(message: str) -> None:
    """One line on stderr."""
    print(f"persistlog: {message}", file=sys.stderr)


def fail(args: argparse.Namespace, message: str, status: int) -> int:
    """Report a command that could not do its job: one line on stderr and, with ``--json``,
    one on stdout as well, a JSON object, so that a script reading stdout sees why (as the
    last line of ``dump``'s and ``tail``'s JSON lines, or as the whole document)."""
    error(message)
    if getattr(args, "json", False):
        doc = {"url": getattr(args, "url", None), "ok": False, "error": message, "exit_status": status}
        print(json.dumps(doc), flush=True)
    return status


def guarded(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a subcommand, turning the errors an operator can meet into one line each."""
    verbose = bool(getattr(args, "verbose", False))
    try:
        return run(args)
    except CorruptLogError as e:
        return fail(args, f"corrupt: {e}", EXIT_DAMAGED)
    except (UsageError, PersistLogError) as e:
        return fail(args, str(e), EXIT_USAGE)
    except BrokenPipeError:
        # The reader went away (``persistlog dump URL | head``): not an error. Point
        # stdout at /dev/null so the interpreter's final flush does not complain.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (OSError, ValueError, ImportError) as e:
        if verbose:
            logger.exception("failed")
        return fail(args, f"{type(e).__name__}: {e}" if isinstance(e, OSError) else str(e), EXIT_USAGE)
    except Exception as e:
        # A storage client's own exception, or a bug: still one line (-v shows where).
        if verbose:
            logger.exception("failed")
        return fail(
            args,
            f"unexpected {type(e).__module__}.{type(e).__name__}: {e} (run with -v for the traceback)",
            EXIT_USAGE,
        )


def print_json(value: Any, stream: TextIO | None = None) -> None:
    """One JSON document on stdout."""
    print(json.dumps(value, indent=2, sort_keys=False, default=str), file=stream or sys.stdout)


def fmt_time(us: int | None) -> str:
    """Microseconds since the epoch as ``2026-11-25 22:40:20.123 UTC``."""
    if us is None:
        return "-"
    dt = datetime.datetime.fromtimestamp(us / 1e6, tz=datetime.timezone.utc)
    return dt.strftime("%Y-%m-%d %H:%M:%S.") + f"{dt.microsecond // 1000:03d} UTC"


def iso_time(us: int | None) -> str | None:
    """Microseconds since the epoch as ISO 8601 with microseconds (lossless)."""
    if us is None:
        return None
    dt = datetime.datetime.fromtimestamp(us // 1_000_000, tz=datetime.timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{us % 1_000_000:06d}Z"


def fmt_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value:.1f} PiB"


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


class ProgressLine:
    """A single self-overwriting status line on stderr, only when stderr is a terminal
    (pipes and CI logs get nothing). Updates are throttled to ten a second."""

    def __init__(self, label: str, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.label = label
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._last = 0.0
        self._shown = False

    def update(self, text: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        self.stream.write(f"\r{self.label}: {text}\x1b[K")
        self.stream.flush()
        self._shown = True

    def done(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False

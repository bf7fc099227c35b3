"""Options every subcommand shares, and turning them into a destination.

``--storage-option KEY=VALUE`` values go to fsspec untouched, parsed as JSON when they
parse (``anon=true`` is a bool, ``client_kwargs={"region_name": "eu-west-1"}`` a dict) and
kept as strings otherwise; the CLI never looks at them or names a driver.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from typing import Any

from destinations import Destination, open_destination

from ..reading import Keyring, UsageError, parse_storage_options, provider_named, why_no_log


def iso_time(value: str) -> datetime:
    """An ISO 8601 date and time; without a zone, UTC."""
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time: {value!r} (for example 2026-11-26T09:30:00Z)") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def add_start_options(p: argparse.ArgumentParser) -> None:
    """``--from-lsn N`` and ``--from-time TIME``: where the records printed start (dump,
    tail). :func:`check_start` refuses what contradicts itself."""
    p.add_argument("--from-lsn", type=int, default=None, metavar="N", help="only records with LSN >= N")
    p.add_argument("--from-time", type=iso_time, default=None, metavar="TIME",
                   help="only records committed at or after TIME (ISO 8601, UTC unless a zone is given)")


def check_start(args: argparse.Namespace) -> None:
    """Refuse a negative ``--from-lsn``, or both start options, before anything is read."""
    if args.from_lsn is not None and args.from_lsn < 0:
        raise UsageError("--from-lsn must be >= 0")
    if args.from_lsn is not None and args.from_time is not None:
        raise UsageError("give --from-lsn or --from-time, not both")


def common_options() -> argparse.ArgumentParser:
    """The parent parser of every subcommand: URL, storage options, JSON, verbosity."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("url", metavar="URL", help="destination: a local directory, s3://bucket/prefix, memory://...")
    common.add_argument(
        "--storage-option",
        "-o",
        dest="storage_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for the destination (repeatable; VALUE is parsed as JSON when it can be)",
    )
    common.add_argument(
        "--key-provider",
        metavar="MODULE:CALLABLE",
        help="key provider of an encrypted log: an importable callable key_id -> 32-byte key "
        "(the same one the writer's open(key_provider=) got); never the key itself",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    common.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    return common


def load_key_provider(spec: str | None) -> Keyring | None:
    """The key provider ``MODULE:CALLABLE`` names (``--key-provider``), imported; None for
    None. A bad name is a usage error."""
    if spec is None:
        return None
    try:
        return provider_named(spec)
    except (ValueError, TypeError) as e:
        raise UsageError(f"--key-provider {e}") from None


def key_provider(args: argparse.Namespace) -> Keyring | None:
    """The key provider named on the command line (``--key-provider``), or None."""
    return load_key_provider(getattr(args, "key_provider", None))


def open_dest(args: argparse.Namespace) -> Destination:
    """The destination named on the command line, which need not exist yet.

    An unknown protocol or a missing driver (``s3://`` without s3fs) is a usage error.
    """
    options = parse_storage_options(args.storage_options)
    try:
        return open_destination(args.url, **options)
    except (ValueError, ImportError) as e:
        raise UsageError(str(e)) from None


def open_log(args: argparse.Namespace, *, wait_for_log: bool = False) -> Destination:
    """The destination named on the command line, which must hold a persistlog log.

    Anything else -- a missing directory or bucket, a regular file, a directory of other
    files -- is a usage error saying "no persistlog log at URL" and what is there instead,
    found by reading only: nothing is ever written to a destination that holds no log.
    With ``wait_for_log`` (``tail -f``, which waits for a log to appear) a destination
    without a log is fine as long as a writer could make one there: only a file where the
    directory would be, or a missing bucket, is that error.
    """
    dest = open_dest(args)
    try:
        reason = dest.why_not_creatable() if wait_for_log else why_no_log(dest)
    except Exception as e:  # any storage client's error: the store cannot be used
        dest.close()
        raise UsageError(f"cannot reach {args.url}: {type(e).__name__}: {e}") from None
    if reason is None:
        return dest
    dest.close()
    raise UsageError(f"no persistlog log at {args.url}: {reason}")

"""The ``persistlog`` command: argument parsing and dispatch only.

Each subcommand is one module with ``add_parser(subparsers, common)`` and ``run(args)``;
the work itself is done by library functions, taken only from ``persistlog`` and its
public read API ``persistlog.reading`` (``inspect_destination``, ``repair``, ``restore``,
``follow``), so that the CLI only parses, calls and prints.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from .. import FORMAT_VERSION, SEGMENT_VERSIONS, __version__
from . import dump, info, repair, restore_check, tail, verify
from ._console import EXIT_USAGE, fail, guarded, logging_to_stderr
from ._options import common_options

COMMANDS = (info, verify, dump, tail, repair, restore_check)

EPILOG = """\
exit status:
  0  success, destination clean
  1  damage found (torn tail or corruption), or a repair refused
  2  bad usage or input, no log at URL, storage that cannot be used, or a log
     that cannot be checked (a batch needs a package that is not installed)

examples:
  persistlog info /var/lib/app/state
  persistlog verify s3://bucket/app -o endpoint_url=http://127.0.0.1:9000 -o anon=false
  persistlog dump /var/lib/app/state --from-lsn 1000 --json | jq .record
  persistlog tail -f /var/lib/app/state
  persistlog repair /var/lib/app/state --dry-run
  persistlog restore-check /var/lib/app/state

Run "persistlog COMMAND --help" for each command's options and examples.
"""


class BadUsage(Exception):
    """A command line argparse refused: raised instead of printed, so that :func:`main`
    reports it as the command line asks (``--json``: a JSON error object on stdout)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class Parser(argparse.ArgumentParser):
    """argparse's parser (and, through ``add_subparsers``, every subcommand's), raising
    :class:`BadUsage` for a usage error rather than printing it and exiting."""

    def error(self, message: str) -> NoReturn:
        raise BadUsage(self, message)


def wants_json(argv: list[str]) -> bool:
    """Whether ``--json`` (or an abbreviation argparse accepts, ``--js``) is on the command
    line, wherever it stands: a usage error then answers in JSON too."""
    return any(len(a) > 3 and "--json".startswith(a) for a in argv)


def usage_error(e: BadUsage, argv: list[str]) -> int:
    """Report a usage error: argparse's usage and message on stderr, and with ``--json``
    the JSON error object on stdout, as every other failure of a command with ``--json``."""
    if wants_json(argv):
        # "persistlog info" -> "info: ..."; the URL is not known when the line does not parse.
        command = e.parser.prog.partition(" ")[2]
        message = f"{command}: {e.message}" if command else e.message
        return fail(argparse.Namespace(json=True, url=None), message, EXIT_USAGE)
    e.parser.print_usage(sys.stderr)
    print(f"{e.parser.prog}: error: {e.message}", file=sys.stderr)
    return EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="persistlog",
        description="Inspect, verify, dump, tail, repair and test-restore persistlog destinations.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"persistlog {__version__} (writes format v{FORMAT_VERSION}, "
                        f"reads v{min(SEGMENT_VERSIONS)}-v{max(SEGMENT_VERSIONS)})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = common_options()
    for command in COMMANDS:
        command.add_parser(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (``sys.argv[1:]`` by default); returns the exit status."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parser.parse_args(argv)
    except BadUsage as e:
        return usage_error(e, argv)
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    with logging_to_stderr(args.verbose):
        status: int = guarded(args.run, args)
    return status


__all__ = ["build_parser", "main"]

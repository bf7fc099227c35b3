"""The ``persistlog`` command: argument parsing and dispatch only.

Each subcommand is one module with ``add_parser(subparsers, common)`` and ``run(args)``;
the work itself is done by library functions (``persistlog._destination_check``, ``_repair``,
``restore``, ``follow``) so that the CLI only parses, calls and prints.
"""

from __future__ import annotations

import argparse
import sys

from .._format import FORMAT_VERSION
from .._version import package_version
from . import dump, info, repair, restore_check, tail, verify
from ._console import EXIT_USAGE, guarded, logging_to_stderr
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="persistlog",
        description="Inspect, verify, dump, tail, repair and test-restore persistlog destinations.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"persistlog {package_version()} (format v{FORMAT_VERSION})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = common_options()
    for command in COMMANDS:
        command.add_parser(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (``sys.argv[1:]`` by default); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help, --version, or a usage error argparse reported
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    with logging_to_stderr(args.verbose):
        status: int = guarded(args.run, args)
    return status


__all__ = ["build_parser", "main"]

"""Running code in a fresh interpreter, optionally with some modules made unimportable
(``sys.modules[name] = None`` before anything else runs, so ``import name`` raises
ImportError as it would were the package not installed).

A child process is also how a test survives what it provokes: a crash there shows as the
child's exit status instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

#: The ``persistlog`` command, for :func:`run_python`.
CLI = "import sys\nfrom persistlog.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def run_python(
    code: str, *args: str, hide: Sequence[str] = (), timeout: float = 120, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (dedented) as ``python -c`` with ``args``, hiding the modules ``hide``;
    ``env_extra`` adds environment variables to this process's."""
    prelude = "".join(f"import sys; sys.modules[{name!r}] = None\n" for name in hide)
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env_extra} if env_extra else None,
    )


def run_json(code: str, *args: str, hide: Sequence[str] = ()) -> dict[str, Any]:
    """:func:`run_python` for code that prints one JSON object as its last line; a child
    that exits non-zero (a crash shows as a negative signal number) fails the test."""
    proc = run_python(code, *args, hide=hide)
    assert proc.returncode == 0, f"child exited with {proc.returncode}: {proc.stderr[-2000:]}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


class StdoutLines:
    """A child's stdout read line by line, then to its end with ``communicate``.

    ``Popen.communicate`` reads the pipe itself, past the buffer of ``proc.stdout``: lines
    that a ``proc.stdout.readline()`` read ahead would be missing from its output. These
    lines come straight from the pipe, and what was read past the last one returned is
    given back by :meth:`communicate`.
    """

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self._fd = proc.stdout.fileno()
        self._pending = b""

    def readline(self) -> str:
        """The next line, with its newline ("" at the end of the output)."""
        while b"\n" not in self._pending:
            chunk = os.read(self._fd, 65536)
            if not chunk:
                line, self._pending = self._pending, b""
                return line.decode()
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode() + "\n"

    def communicate(self, timeout: float) -> tuple[str, str]:
        """The rest of stdout (what was read ahead first) and all of stderr, once the child
        exits."""
        out, err = self.proc.communicate(timeout=timeout)
        rest, self._pending = self._pending.decode() + (out or ""), b""
        return rest, err or ""

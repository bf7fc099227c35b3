"""The scripts of ``tests/persistlog/procs/`` run as child processes: the environment they
need, a ``Proc`` that keeps each one's stderr, and the JSON files they report through."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any


REPO = Path(__file__).resolve().parents[2]
PROCS = Path(__file__).resolve().parent / "procs"


def child_env() -> dict[str, str]:
    """The environment of a child script: the repository first, then ``tests/`` for the
    helper modules (``kv_app``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    return env


class Proc:
    """A child process running one of the scripts in ``procs/`` (or the script at the path
    ``script``), its stdout discarded unless ``stdout`` says where it goes."""

    def __init__(self, script: str | Path, cfg: dict[str, Any], logdir: Path, name: str,
                 stdout: Any = subprocess.DEVNULL) -> None:
        self.name = name
        self.stderr_path = logdir / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.p = subprocess.Popen(
            [sys.executable, str(PROCS / script), json.dumps(cfg)],
            stdout=stdout,
            stderr=self._stderr,
            env=child_env(),
            cwd=str(logdir),
        )

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")[-3000:]

    def wait(self, timeout: float) -> int:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not finish within {timeout}s; stderr:\n{self.stderr()}") from None

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait(30)

    def close(self) -> None:
        self.kill()
        self._stderr.close()


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None

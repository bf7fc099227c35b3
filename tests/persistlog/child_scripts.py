"""The scripts of ``tests/persistlog/procs/`` run as child processes: the environment they
need, a ``Proc`` that keeps each one's stderr, the JSON files they report through, and
``AckingWriter``, whose process reports each acknowledgement on stdout as it happens."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
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


class AckingWriter:
    """``procs/acking_writer.py`` as a child process: its stdout lines (open, each
    acknowledgement, a failure) collected as they come, and signals to stop, resume or
    kill it."""

    def __init__(self, cfg: dict[str, Any], logdir: Path, name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self.stderr_path = logdir / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.p = subprocess.Popen(
            [sys.executable, str(PROCS / "acking_writer.py"), json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=child_env(),
            cwd=str(logdir),
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for raw in self.p.stdout:
            with self._seen:
                self.lines.append(raw.decode().rstrip("\n"))
                self._seen.notify_all()

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")[-3000:]

    def wait_for(self, what: str, pred: Callable[[], bool], timeout: float) -> None:
        """Wait until ``pred()`` holds of the lines read so far; fail the test if the
        process ends or ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        with self._seen:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0 or (self.p.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"{self.name}: no {what} within {timeout}s; lines {self.lines[-5:]}; "
                                         f"stderr:\n{self.stderr()}")
                self._seen.wait(min(left, 0.1))

    def count(self, prefix: str) -> int:
        with self._seen:
            return sum(1 for line in self.lines if line.startswith(prefix))

    def acked_keys(self, name: str) -> set[str]:
        """The keys of every update the process reported acknowledged (key prefix ``name``)."""
        with self._seen:
            return {f"{name}.{line.split()[1]}.{line.split()[2]}" for line in self.lines if line.startswith("A ")}

    def signal(self, signum: int) -> None:
        self.p.send_signal(signum)

    def finish(self, timeout: float) -> int:
        """Let a holding process close (a line on its stdin) and wait for it to end."""
        assert self.p.stdin is not None
        try:
            self.p.stdin.write(b"\n")
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        return self.wait(timeout)

    def wait(self, timeout: float) -> int:
        try:
            code = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not finish within {timeout}s; stderr:\n{self.stderr()}") from None
        self._reader.join(10)
        return code

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGCONT)
            self.p.kill()
            self.p.wait(30)
        self._reader.join(10)
        for stream in (self.p.stdin, self.p.stdout):
            if stream is not None:
                stream.close()
        self._stderr.close()

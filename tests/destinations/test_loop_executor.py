"""The executor of fsspec's event loop (``destinations/_loop_executor.py``): blocking calls
of the loop still run at interpreter exit, where asyncio's default executor refuses them."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from destinations._loop_executor import ExitSafeExecutor

ROOT = Path(__file__).resolve().parents[2]  # "python -c" imports this checkout's packages from here

# An event loop in a daemon thread, as fsspec runs one; at exit an atexit handler asks it
# for a blocking call (what a new connection's host name lookup is), as persistlog's seal
# of a log left open does through s3fs.
_AT_EXIT = """
import asyncio, atexit, sys, threading, types
from destinations._loop_executor import serve_at_exit

loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()
if sys.argv[1] == "served":
    serve_at_exit(types.SimpleNamespace(async_impl=True, loop=loop))

async def blocking_call():
    return await asyncio.get_running_loop().run_in_executor(None, lambda: "ran")

asyncio.run_coroutine_threadsafe(blocking_call(), loop).result(10)  # before exit: fine

@atexit.register
def at_exit():
    try:
        print(asyncio.run_coroutine_threadsafe(blocking_call(), loop).result(10))
    except RuntimeError as e:
        print("refused:", e)
"""


@pytest.mark.parametrize("served", [True, False], ids=["served", "asyncio's default"])
def test_blocking_calls_of_the_loop_run_at_exit(served: bool) -> None:
    proc = subprocess.run([sys.executable, "-c", _AT_EXIT, "served" if served else "default"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    if served:
        assert proc.stdout.strip() == "ran"
    else:  # what the executor is for: concurrent.futures stopped its own before atexit
        assert proc.stdout.startswith("refused: cannot schedule new futures"), proc.stdout


def test_calls_run_on_daemon_threads_and_shutdown_stops_nothing() -> None:
    ex = ExitSafeExecutor(max_workers=2, name="test-fsspec")
    started = threading.Event()
    release = threading.Event()

    def wait() -> str:
        started.set()
        release.wait(10)
        return threading.current_thread().name

    first = ex.submit(wait)
    assert started.wait(10)
    second = ex.submit(lambda: threading.current_thread())  # one worker is busy: a second starts
    assert second.result(10).daemon and second.result(10).name.startswith("test-fsspec-")
    release.set()
    assert first.result(10).startswith("test-fsspec-")
    ex.shutdown()
    with pytest.raises(ZeroDivisionError):
        ex.submit(lambda: 1 // 0).result(10)  # still serving; the call's error is its future's

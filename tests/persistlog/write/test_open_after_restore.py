"""open() after a restore of a log left unsealed (a crash): it takes the end the restore
found (newest log, next LSN, chain head) instead of scanning the last segment again, and
only while nothing was written there since.

The logs are left unsealed by a child process that ends without closing (``os._exit``,
what SIGKILL leaves).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import persistlog
from persistlog import _api
from tests.childproc import run_python

_CRASHED_WRITER = """
import os, sys
import persistlog
url, n = sys.argv[1], int(sys.argv[2])
lg = persistlog.open(url, lambda emit: None, durability="flush")
for i in range(n):
    lg.update({"i": i})
os._exit(0)  # no close: the log stays unsealed
"""


def _crash_after(url: str, n: int) -> None:
    proc = run_python(_CRASHED_WRITER, url, str(n))
    assert proc.returncode == 0, proc.stderr


def _segments(url: str) -> list[str]:
    return sorted(name for name in os.listdir(url) if name.endswith(".plog"))


def _no_second_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    def scan(*args: Any) -> Any:
        raise AssertionError("open() scanned the end of the log again after the restore")

    monkeypatch.setattr(_api, "end_and_chain", scan)
    monkeypatch.setattr(_api, "end_after_seal", scan)


@pytest.mark.parametrize("torn", [False, True])
@pytest.mark.parametrize("hash_chain", [True, False])
def test_open_right_after_a_restore_takes_its_end_and_the_chain_holds_across(
    log_dir: str, monkeypatch: pytest.MonkeyPatch, torn: bool, hash_chain: bool
) -> None:
    _crash_after(log_dir, 5)
    if torn:
        # The last batch cut short, as a crash in the middle of its write leaves it.
        last = os.path.join(log_dir, _segments(log_dir)[-1])
        os.truncate(last, os.path.getsize(last) - 3)
    records: list[Any] = []
    result = persistlog.restore(log_dir, records.append)
    assert (result.torn_tail is not None) == torn
    assert records == [{"i": i} for i in range(4 if torn else 5)]
    with monkeypatch.context() as m:
        _no_second_scan(m)
        lg = persistlog.open(log_dir, lambda emit: [emit(r) for r in records], durability="flush",
                             hash_chain=hash_chain)
    assert lg.next_lsn == result.next_lsn + len(records)
    lg.update({"i": 100})
    lg.close()
    again: list[Any] = []
    persistlog.restore(log_dir, again.append)  # checks every link, across the logs too
    assert again == records + [{"i": 100}]
    if not torn:  # (verify reports the torn tail the old log keeps)
        verify = subprocess.run([sys.executable, "-m", "persistlog", "verify", log_dir], capture_output=True, text=True)
        assert verify.returncode == 0, verify.stdout + verify.stderr


def test_records_written_after_the_restore_are_never_opened_over(log_dir: str) -> None:
    # A writer still running while this process restores (without the writer lock)
    # appends to the very segment the restore read: open() must see it, not take the
    # restore's end as it was.
    _crash_after(log_dir, 2)
    code = textwrap.dedent("""
        import os, sys
        import persistlog
        url = sys.argv[1]
        lg = persistlog.open(url, lambda emit: None, durability="flush", discard_existing=True)
        lg.update({"i": 0})
        print("ready", flush=True)
        sys.stdin.readline()
        lg.update({"i": 1})
        print("done", flush=True)
        sys.stdin.readline()
        os._exit(0)
    """)
    child = subprocess.Popen([sys.executable, "-c", code, log_dir], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        segments = _segments(log_dir)
        records: list[Any] = []
        persistlog.restore(log_dir, records.append)
        assert records == [{"i": 0}]
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        assert _segments(log_dir) == segments  # the same segments, the last one longer
    finally:
        child.kill()
        child.wait()
    with pytest.raises(persistlog.ExistingLogError):
        persistlog.open(log_dir, lambda emit: None, durability="flush")
    records = []
    persistlog.restore(log_dir, records.append)
    assert records == [{"i": 0}, {"i": 1}]
    persistlog.open(log_dir, lambda emit: [emit(r) for r in records], durability="flush").close()


def test_a_log_written_after_the_restore_is_never_opened_over(log_dir: str) -> None:
    _crash_after(log_dir, 2)
    persistlog.restore(log_dir, lambda r: None)
    # Another process restores, opens (a log of its own) and crashes.
    proc = run_python("""
        import os, sys
        import persistlog
        records = []
        persistlog.restore(sys.argv[1], records.append)
        lg = persistlog.open(sys.argv[1], lambda emit: [emit(r) for r in records], durability="flush")
        lg.update({"i": 9})
        os._exit(0)
    """, log_dir)
    assert proc.returncode == 0, proc.stderr
    with pytest.raises(persistlog.ExistingLogError):
        persistlog.open(log_dir, lambda emit: None, durability="flush")

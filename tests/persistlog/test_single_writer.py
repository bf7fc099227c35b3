"""One writer per destination: a second writer, in this process or another, gets
``WriterConflict`` and leaves the first unharmed; a killed writer's lock is recoverable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from kv_app import App, restore_state
from log_files import log_seqs

import persistlog


# -- one writer -------------------------------------------------------------------------


def test_second_writer_gets_writer_conflict(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir)
    with pytest.raises(persistlog.WriterConflict) as info:
        persistlog.open(log_dir, lambda emit: None)
    assert str(os.getpid()) in str(info.value)  # names the holder
    code = "import sys, persistlog\npersistlog.open(sys.argv[1], lambda emit: None)\n"
    proc = subprocess.run([sys.executable, "-c", code, log_dir], capture_output=True, text=True)
    assert proc.returncode != 0 and "WriterConflict" in proc.stderr
    app.put("b", 2)  # the holder is unaffected
    lg.close()
    assert restore_state(log_dir)[0] == {"a": 1, "b": 2}
    assert log_seqs(log_dir) == [1]  # the conflicting writers created nothing


def test_stale_lock_of_a_killed_process_is_recoverable(log_dir: str) -> None:
    code = (
        "import sys, time, persistlog\n"
        "lg = persistlog.open(sys.argv[1], lambda emit: emit({'op': 'put', 'key': 'a', 'value': 1}),"
        " durability='fsync')\n"
        "lg.update({'op': 'put', 'key': 'b', 'value': 2})\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, log_dir], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == b"ready\n"
        with pytest.raises(persistlog.WriterConflict) as info:
            persistlog.open(log_dir, lambda emit: None)
        assert str(proc.pid) in str(info.value)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    with open(os.path.join(log_dir, "LOCK"), "rb") as f:
        assert str(proc.pid).encode() in f.read()  # the dead owner's record is still there
    state, _ = restore_state(log_dir)
    assert state == {"a": 1, "b": 2}
    app = App(state)
    app.open(log_dir).close()
    assert restore_state(log_dir)[0] == state

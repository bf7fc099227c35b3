"""What starts a rotation: bytes, records, an interval, an explicit ``rotate()``, a signal,
and ``open()`` itself; with the triggers off, nothing does."""

from __future__ import annotations

import os
import signal
import threading
import time

from kv_app import App, restore_state
from log_files import is_complete_log, log_seqs
from threads import wait_until

import persistlog


# -- triggers ---------------------------------------------------------------------------


def test_trigger_rotate_bytes(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, rotate_bytes=4096, durability="flush")
    for i in range(60):
        app.put(i % 5, "x" * 100)
    wait_until(lambda: lg.stats()["rotations"] >= 2, describe="a size-triggered rotation")
    lg.close()
    assert restore_state(log_dir)[0] == app.data


def test_trigger_rotate_records(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, rotate_records=10, rotate_bytes=None, durability="flush")
    for i in range(9):
        app.put(i, i)
    time.sleep(0.2)
    assert lg.stats()["rotations"] == 1  # the open's only
    app.put("tenth", 10)
    wait_until(lambda: lg.stats()["rotations"] == 2, describe="a count-triggered rotation")
    lg.close()
    assert restore_state(log_dir)[0] == app.data


def test_trigger_rotate_interval(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, rotate_interval=0.2, rotate_bytes=None, flush_interval=0.02)
    wait_until(lambda: lg.stats()["rotations"] >= 3, describe="interval rotations")
    lg.close()
    assert restore_state(log_dir)[0] == app.data


def test_triggers_off_means_no_rotation(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, rotate_bytes=None, durability="flush")
    for i in range(300):
        app.put(i % 9, "y" * 200)
    time.sleep(0.2)
    assert lg.stats()["rotations"] == 1 and lg.seq == 1
    lg.close()


def test_trigger_explicit_rotate(log_dir: str) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir)
    assert lg.seq == 1
    assert lg.rotate() == 2 and lg.seq == 2
    assert lg.rotate(wait=False) is None
    wait_until(lambda: lg.stats()["rotations"] == 3, describe="the requested rotation")
    lg.close()
    assert log_seqs(log_dir) == [2, 3]


def test_trigger_rotate_on_signal(log_dir: str) -> None:
    previous = signal.getsignal(signal.SIGUSR1)
    app = App({"a": 1})
    lg = app.open(log_dir, rotate_on_signal=signal.SIGUSR1, flush_interval=0.01)
    assert signal.getsignal(signal.SIGUSR1) is not previous
    os.kill(os.getpid(), signal.SIGUSR1)
    wait_until(lambda: lg.stats()["rotations"] == 2, describe="a signal-triggered rotation")
    lg.close()
    assert signal.getsignal(signal.SIGUSR1) is previous
    assert restore_state(log_dir)[0] == app.data


def test_rotate_on_signal_needs_the_main_thread(log_dir: str) -> None:
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            persistlog.open(log_dir, lambda emit: None, rotate_on_signal=signal.SIGUSR2)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=opener)
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], ValueError)
    persistlog.open(log_dir, lambda emit: None).close()  # nothing was left locked


def test_open_starts_a_new_complete_log(log_dir: str) -> None:
    for seq in (1, 2, 3):
        app = App(restore_state(log_dir)[0] or {"a": 1})
        lg = app.open(log_dir, retain=5)
        assert lg.seq == seq and is_complete_log(log_dir, seq)
        assert app.enumerations == 1
        lg.close()

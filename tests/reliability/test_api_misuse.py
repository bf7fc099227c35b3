"""Bad API input: every misuse gets a clear error, and the log stays usable (or says why not).

After each refused call the test proves the state: a refused ``open`` leaves the
destination unlocked (a correct ``open`` right after succeeds); a refused ``update``
writes nothing and the Log goes on; a failing callback is reported and the Log goes on.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from kv_app import App, apply, restore_state

import persistlog
from persistlog import EnumerateError, LogClosedError


def _dump(emit: Any) -> None:
    return None


def _assert_openable(url: str) -> None:
    lg = persistlog.open(url, _dump, discard_existing=True)  # only the lock matters here
    lg.close()


BAD_OPEN: list[tuple[str, dict[str, Any], type[BaseException], str]] = [
    ("durability", {"durability": "sometimes"}, ValueError, "durability"),
    ("compression", {"compression": "lz4"}, ValueError, "compression"),
    ("retain-0", {"retain": 0}, ValueError, "retain"),
    ("retain-bool", {"retain": True}, ValueError, "retain"),
    ("retain-str", {"retain": "2"}, ValueError, "retain"),
    ("rotate_bytes", {"rotate_bytes": 0}, ValueError, "rotate_bytes"),
    ("rotate_records", {"rotate_records": 1.5}, ValueError, "rotate_records"),
    ("rotate_interval", {"rotate_interval": -1}, ValueError, "rotate_interval"),
    ("segment_bytes", {"segment_bytes": 100}, ValueError, "segment_bytes"),
    ("batch_bytes", {"batch_bytes": 0}, ValueError, "batch_bytes"),
    ("flush_interval", {"flush_interval": 0}, ValueError, "flush_interval"),
    ("lease_ttl", {"lease_ttl": 0}, ValueError, "lease_ttl"),
    ("storage_options", {"storage_options": "key=1"}, TypeError, "storage_options"),
    ("codec", {"codec": "cbor"}, TypeError, "codec"),
    ("unknown-option", {"durabilty": "fsync"}, TypeError, "durabilty"),
    ("secondary-entry", {"secondaries": [123]}, TypeError, "secondaries"),
    ("secondary-protocol", {"secondaries": ["nosuch://x/y"]}, ValueError, "nosuch"),
]


@pytest.mark.parametrize("name,options,error,word", BAD_OPEN, ids=[b[0] for b in BAD_OPEN])
def test_bad_open_options(tmp_path: Path, name: str, options: dict[str, Any], error: type[BaseException],
                          word: str) -> None:
    url = str(tmp_path / "log")
    with pytest.raises(error, match=word):
        persistlog.open(url, _dump, **options)
    _assert_openable(url)  # nothing stays locked, nothing half-made blocks the next writer


@pytest.mark.parametrize("url,error,word", [
    ("", ValueError, "URL"),
    ("nosuch://bucket/x", ValueError, "unknown destination protocol"),
    ("s4://bucket/x", ValueError, "did you mean s3"),
    ("simplecache::s3://b/x", ValueError, "chained"),
    ("memory://", ValueError, "names no bucket"),
])
def test_bad_urls(url: str, error: type[BaseException], word: str) -> None:
    with pytest.raises(error, match=word):
        persistlog.open(url, _dump)
    with pytest.raises(error, match=word):
        persistlog.restore(url, lambda r: None)


@pytest.mark.parametrize("url", [None, 123, b"/tmp/x"])
def test_url_of_the_wrong_type(url: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        persistlog.open(url, _dump)


def test_enumerate_all_must_be_callable(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="enumerate_all"):
        persistlog.open(str(tmp_path / "log"), None)  # type: ignore[arg-type]
    _assert_openable(str(tmp_path / "log"))


class _Unloggable:
    pass


@pytest.mark.slow
def test_bad_records_write_nothing_and_the_log_goes_on(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    lg = persistlog.open(url, _dump, durability="fsync")
    lg.update({"op": "put", "key": "a", "value": 1})
    for bad in (_Unloggable(), {"op": "put", "key": "b", "value": _Unloggable()}, {1, _Unloggable()},
                lambda: None, threading.Lock()):
        with pytest.raises(TypeError, match="record not logged"):
            lg.update(bad)
    with pytest.raises(TypeError):
        lg.update_many([{"op": "put", "key": "c", "value": 1}, _Unloggable()])
    with pytest.raises(ValueError, match="exceeds"):
        lg.update({"op": "put", "key": "big", "value": b"\0" * (persistlog._format.constants.MAX_RECORD_BYTES + 1)})
    with pytest.raises(ValueError, match="exceeds"):
        lg.update_many([{"op": "put", "key": "c2", "value": 1},
                        {"op": "put", "key": "big", "value": b"\0" * (persistlog._format.constants.MAX_RECORD_BYTES + 1)}])
    lg.update({"op": "put", "key": "d", "value": 2})
    assert not lg.stats()["failed"]
    lg.close()
    state, result = restore_state(url)
    assert state == {"a": 1, "d": 2}
    assert result.records == 2  # LSNs stay gapless: nothing of the refused records was written


def test_closed_log_refuses_clearly(tmp_path: Path) -> None:
    lg = persistlog.open(str(tmp_path / "log"), _dump)
    lg.close()
    lg.close()  # idempotent
    for call in (lambda: lg.update({"a": 1}), lambda: lg.update_many([{"a": 1}]), lg.sync, lg.rotate,
                 lambda: lg.add_destination(str(tmp_path / "other"))):
        with pytest.raises(LogClosedError, match="closed"):
            call()
    assert lg.stats()["closed"] is True


def test_enumerate_raising_at_open_leaves_nothing_locked(tmp_path: Path) -> None:
    url = str(tmp_path / "log")

    def broken(emit: Any) -> None:
        emit({"op": "put", "key": "a", "value": 1})
        raise KeyError("app bug")

    with pytest.raises(EnumerateError) as info:
        persistlog.open(url, broken)
    assert isinstance(info.value.__cause__, KeyError)
    _assert_openable(url)


def test_enumerate_raising_in_rotation_and_on_error_raising(tmp_path: Path) -> None:
    """enumerate_all raising during a rotation: rotate() raises EnumerateError (cause: the
    app's error), on_error is called (its own exception is logged, not raised), the Log
    keeps working in the incomplete log, the next rotation succeeds, and restore is right."""
    url = str(tmp_path / "log")
    app = App()
    calls: list[BaseException] = []
    fail = {"on": False}

    def enumerate_all(emit: Any) -> None:
        app.enumerate_all(emit)
        if fail["on"]:
            raise RuntimeError("enumeration bug")

    def on_error(e: BaseException) -> None:
        calls.append(e)
        raise ValueError("on_error bug")

    lg = persistlog.open(url, enumerate_all, on_error=on_error, durability="fsync")
    app.log = lg
    for i in range(5):
        lg.update({"op": "put", "key": f"k{i}", "value": i})
        app.data[f"k{i}"] = i
    fail["on"] = True
    with pytest.raises(EnumerateError) as info:
        lg.rotate()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert len(calls) == 1 and isinstance(calls[0], RuntimeError)
    assert lg.stats()["rotation_failures"] == 1 and not lg.stats()["failed"]
    lg.update({"op": "put", "key": "after", "value": 1})
    app.data["after"] = 1
    assert restore_state(url)[0] == app.data  # from the older complete log plus the newer one
    fail["on"] = False
    lg.rotate()
    lg.update({"op": "put", "key": "later", "value": 2})
    app.data["later"] = 2
    lg.close()
    assert restore_state(url)[0] == app.data


def test_enumerate_emitting_unloggable(tmp_path: Path) -> None:
    state = {"x": _Unloggable()}

    def enumerate_all(emit: Any) -> None:
        for k, v in state.items():
            emit({"op": "put", "key": k, "value": v})

    with pytest.raises(EnumerateError) as info:
        persistlog.open(str(tmp_path / "log"), enumerate_all)
    assert isinstance(info.value.__cause__, TypeError)
    _assert_openable(str(tmp_path / "log"))


def test_emit_after_enumerate_returned(tmp_path: Path) -> None:
    kept: list[Any] = []

    def enumerate_all(emit: Any) -> None:
        kept.append(emit)

    lg = persistlog.open(str(tmp_path / "log"), enumerate_all)
    with pytest.raises(RuntimeError, match="after enumerate_all returned"):
        kept[0]({"op": "put", "key": "late", "value": 1})
    lg.update({"op": "put", "key": "ok", "value": 1})
    lg.close()
    assert restore_state(str(tmp_path / "log"))[0] == {"ok": 1}


def _written_log(tmp_path: Path, n: int = 20) -> str:
    url = str(tmp_path / "log")
    lg = persistlog.open(url, _dump, durability="flush", batch_bytes=1)
    for i in range(n):
        lg.update({"op": "put", "key": f"k{i}", "value": i})
    lg.close()
    return url


def test_restore_bad_arguments(tmp_path: Path) -> None:
    url = _written_log(tmp_path)
    with pytest.raises(TypeError, match="exactly one"):
        persistlog.restore(url)
    with pytest.raises(TypeError, match="exactly one"):
        persistlog.restore(url, lambda r: None, replay_batch=lambda rs: None)
    with pytest.raises(ValueError, match="recovery"):
        persistlog.restore(url, lambda r: None, recovery="lenient")
    with pytest.raises(TypeError, match="storage_options"):
        persistlog.restore(url, lambda r: None, storage_options=["x"])  # type: ignore[arg-type]
    with pytest.raises(persistlog.LogNotFoundError):
        persistlog.restore(str(tmp_path / "nothing"), lambda r: None, missing_ok=False)
    assert persistlog.restore(str(tmp_path / "nothing"), lambda r: None).found is False


def test_replay_raising_propagates_and_restore_can_be_retried(tmp_path: Path) -> None:
    url = _written_log(tmp_path)

    class AppBug(Exception):
        pass

    def replay(r: Any) -> None:
        if r["key"] == "k7":
            raise AppBug("replay bug")

    with pytest.raises(AppBug):
        persistlog.restore(url, replay)
    state, _ = restore_state(url)  # nothing was changed by the failed restore
    assert state == {f"k{i}": i for i in range(20)}


def test_follower_replay_raising_loses_nothing(tmp_path: Path) -> None:
    """A follower whose replay raises reports the app's error; polling again re-delivers
    from the failed batch, so the replica still ends equal to the log."""
    url = _written_log(tmp_path)
    state: dict[Any, Any] = {}
    boom = {"left": 1}

    def replay(r: Any) -> None:
        if r["key"] == "k7" and boom["left"]:
            boom["left"] -= 1
            raise RuntimeError("replay bug")
        apply(state, r)

    f = persistlog.follow(url, replay)
    with pytest.raises(RuntimeError, match="replay bug"):
        f.poll()
    for _ in range(3):
        f.poll()
    f.stop()
    assert state == {f"k{i}": i for i in range(20)}


def test_follow_bad_arguments(tmp_path: Path) -> None:
    url = _written_log(tmp_path)
    with pytest.raises(ValueError, match="poll_interval"):
        persistlog.follow(url, lambda r: None, poll_interval=0)
    with pytest.raises(ValueError, match="cursor"):
        persistlog.follow(url, lambda r: None, cursor="1:2")
    with pytest.raises(TypeError, match="cursor"):
        persistlog.follow(url, lambda r: None, cursor=3.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        persistlog.follow(url, lambda r: None, replay_batch=lambda rs: None)
    with pytest.raises(ValueError, match="recovery"):
        persistlog.follow(url, lambda r: None, recovery="lenient")


def test_add_destination_misuse(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    lg = persistlog.open(url, _dump)
    with pytest.raises(ValueError, match="already"):
        lg.add_destination(url)
    with pytest.raises(ValueError):
        lg.remove_destination(str(tmp_path / "never"))
    with pytest.raises(ValueError, match="nosuch"):
        lg.add_destination("nosuch://x/y")
    lg.update({"op": "put", "key": "a", "value": 1})
    lg.close()
    assert restore_state(url)[0] == {"a": 1}

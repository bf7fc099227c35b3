"""LogSet: many logs named by key under one root, in shard directories (README, "Many logs:
LogSet"; docs/FORMAT.md, "LOGSET").

Real logs on a local disk and on a moto S3 server; a child process killed by SIGKILL; a
second process refused by the log's own writer lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from child_scripts import PROCS, child_env
from conftest_s3 import MotoRequests
from hypothesis import given, settings
from hypothesis import strategies as st

import persistlog
from persistlog._format import encoder
from persistlog._format import constants as F
from persistlog._format.log_set_layout import key_name, name_key

KEYS = [
    "user:1",
    "queue/ab/cd",            # slashes are no directories
    "/leading/slash",
    ".hidden",                # a leading dot is encoded
    "..",
    ".",
    "100% sure",              # percent signs and spaces
    "%41",                    # looks encoded, is not
    "日本語のキー",
    "emoji 🦀",
    "LOGSET",                 # the marker's name, as a key
    "CURRENT",
    "tab\tnew\nline",
    "a" * 255,                # the longest plain key
    "\udcff lone surrogate",
    "UPPER and lower",
]


def counter_log(logset: persistlog.LogSet, key: str, **options: Any) -> tuple[persistlog.Log, dict[str, Any]]:
    """``key``'s log opened with replay: a dict of what was put."""
    state: dict[str, Any] = {}

    def enumerate_all(emit: Any) -> None:
        for k, v in list(state.items()):
            emit({"k": k, "v": v})

    lg = logset.open(key, enumerate_all, replay=lambda r: state.__setitem__(r["k"], r["v"]), **options)
    return lg, state


def restored(logset: persistlog.LogSet, key: str) -> dict[str, Any]:
    state: dict[str, Any] = {}
    logset.restore(key, lambda r: state.__setitem__(r["k"], r["v"]))
    return state


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- layout --------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [1, 2])
def test_logs_lie_in_sha256_shards_under_a_marker(tmp_path: Path, depth: int) -> None:
    root = tmp_path / "set"
    with persistlog.LogSet(root, depth=depth) as logset:
        lg, _ = counter_log(logset, "user:1")
        lg.update({"k": "a", "v": 1})
    digest = hashlib.sha256(b"user:1").hexdigest()
    shard_dirs = [digest[2 * i : 2 * i + 2] for i in range(depth)]
    assert logset.url("user:1") == "/".join([str(root), *shard_dirs, "user%3A1"])
    assert (root / F.LOG_SET_NAME).read_bytes() == encoder.log_set_marker(depth)
    assert sorted(os.listdir(root)) == ["LOGSET", shard_dirs[0]]
    assert persistlog.restore(logset.url("user:1"), lambda r: None).records == 1  # a plain log
    # The marker says the depth: a LogSet opened without one takes it.
    assert persistlog.LogSet(root).depth == depth


def test_the_marker_is_sixteen_bytes_with_its_depth_and_a_crc() -> None:
    marker = encoder.log_set_marker(3)
    assert len(marker) == 16
    assert marker[:8] == b"PLOGLSET" and marker[8:10] == b"\x01\x00" and marker[10:12] == b"\x03\x00"
    import zlib

    assert int.from_bytes(marker[12:], "little") == zlib.crc32(marker[:12])


def test_keys_round_trip_through_their_directory_names(tmp_path: Path) -> None:
    logset = persistlog.LogSet(tmp_path / "set")
    for i, key in enumerate(KEYS):
        lg, _ = counter_log(logset, key)
        lg.update({"k": "i", "v": i})
    logset.close()
    assert sorted(logset.keys()) == sorted(KEYS)
    for i, key in enumerate(KEYS):
        assert key in logset
        assert restored(logset, key) == {"i": i}
        name = logset.url(key).rsplit("/", 1)[1]
        assert set(name) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-%")
        assert not name.startswith(".")
    assert "never opened" not in logset
    assert persistlog.LogSet(tmp_path / "set").restore("never opened", print).found is False
    assert "never opened" not in logset  # a restore creates nothing
    assert list(logset.logs()) == [(key, logset.url(key)) for key in logset.keys()]


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_a_key_is_what_its_directory_name_decodes_to(key: str) -> None:
    try:
        name = key_name(key)
    except ValueError:
        # Refused only where the name would pass a directory name's limit: any key of up
        # to 85 UTF-8 bytes fits (each byte encodes to at most 3).
        assert len(key.encode("utf-8", "surrogatepass")) > 85
        return
    assert name_key(name) == key


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="Aa0._-%2E", min_size=1, max_size=20))
def test_a_directory_name_decodes_to_a_key_only_if_that_key_is_named_so(name: str) -> None:
    key = name_key(name)
    assert key is None or key_name(key) == name


def test_keys_skips_directories_no_key_of_the_set_has(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    logset = persistlog.LogSet(tmp_path / "set")
    counter_log(logset, "real")[0].close()
    shard = Path(logset.url("real")).parent.name
    (tmp_path / "set" / shard / "not%zzencoded").mkdir()
    (tmp_path / "set" / shard / "elsewhere").mkdir()  # a valid name, in another key's shard
    (tmp_path / "set" / shard / ".dotted").mkdir()  # a key's leading dot is encoded: no key's name
    (tmp_path / "set" / "not-a-shard").mkdir()
    assert list(logset.keys()) == ["real"]
    assert "not%zzencoded is no key's directory" in caplog.text


# -- bad roots and bad keys ----------------------------------------------------------------


def test_a_root_holding_something_else_is_refused_naming_what_is_there(tmp_path: Path) -> None:
    a_log = tmp_path / "log"
    persistlog.open(a_log, lambda emit: None).close()
    log_files = tree(a_log)
    with pytest.raises(persistlog.LogSetError, match="holds a persistlog log \\(log 1\\)"):
        persistlog.LogSet(a_log)
    other = tmp_path / "other"
    (other / "photos").mkdir(parents=True)
    (other / "notes.txt").write_text("hi")
    with pytest.raises(persistlog.LogSetError, match=r"1 file\(s\) and 1 directory\(ies\) \(photos/, notes.txt\)"):
        persistlog.LogSet(other)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(persistlog.LogSetError, match="is a file"):
        persistlog.LogSet(a_file)
    assert tree(other) == ["notes.txt", "photos"] and tree(a_log) == log_files  # nothing written


def test_a_root_that_cannot_be_made_is_refused_naming_why(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for root in (tmp_path / "file" / "set", tmp_path / "file" / "a" / "set"):
        with pytest.raises(persistlog.LogSetError, match=f"cannot make a log set at .*: {tmp_path / 'file'} is a file"):
            persistlog.LogSet(root)
    assert tree(tmp_path) == ["file"] and (tmp_path / "file").read_text() == "x"  # nothing written


def test_another_depth_or_a_bad_marker_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "set"
    persistlog.LogSet(root, depth=2)
    with pytest.raises(persistlog.LogSetError, match="is a log set of depth 2, not 1: open it with depth=2"):
        persistlog.LogSet(root, depth=1)
    (root / "LOGSET").write_bytes(b"PLOGLSET" + b"\x02\x00\x01\x00" + b"\x00" * 4)
    with pytest.raises(persistlog.LogSetError, match="checksum"):
        persistlog.LogSet(root)
    newer = b"PLOGLSET\x02\x00\x01\x00"
    import zlib

    (root / "LOGSET").write_bytes(newer + zlib.crc32(newer).to_bytes(4, "little"))
    with pytest.raises(persistlog.LogSetError, match="layout version 2 is unknown"):
        persistlog.LogSet(root)
    for depth in (0, 5, True, "1"):
        with pytest.raises(ValueError, match="depth must be an integer from 1 to 4"):
            persistlog.LogSet(tmp_path / "new", depth=depth)  # type: ignore[arg-type]
    assert not (tmp_path / "new").exists()


def test_a_missing_root_is_made_only_with_create(tmp_path: Path) -> None:
    with pytest.raises(persistlog.LogNotFoundError, match="no log set at .*does not exist.*create=True"):
        persistlog.LogSet(tmp_path / "a" / "b", create=False)
    assert not (tmp_path / "a").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(persistlog.LogNotFoundError, match="it is empty"):
        persistlog.LogSet(tmp_path / "empty", create=False)
    assert persistlog.LogSet(tmp_path / "a" / "b").depth == 1
    assert persistlog.LogSet(tmp_path / "a" / "b", create=False).depth == 1
    assert persistlog.LogSet(tmp_path / "empty").depth == 1


def test_bad_keys_and_options_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    root = tmp_path / "set"
    logset = persistlog.LogSet(root)
    before = tree(root)
    for bad, error in [(None, TypeError), (b"bytes", TypeError), (7, TypeError), ("", ValueError), ("x" * 256, ValueError), ("é" * 43, ValueError)]:
        with pytest.raises(error):
            logset.open(bad, lambda emit: None)  # type: ignore[arg-type]
        with pytest.raises(error):
            logset.restore(bad)  # type: ignore[arg-type]
        with pytest.raises(error):
            logset.url(bad)  # type: ignore[arg-type]
        assert bad not in logset
    assert logset.url("é" * 42).endswith("%C3%A9" * 42)  # 252 bytes: fits
    with pytest.raises(TypeError, match="unknown persistlog.open option"):
        logset.open("k", lambda emit: None, durabilty="fsync")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="takes no storage_options"):
        logset.open("k", lambda emit: None, storage_options={})
    with pytest.raises(TypeError, match="LogSet\\(\\) takes no secondaries"):
        persistlog.LogSet(root, secondaries=[str(tmp_path / "backup")])
    with pytest.raises(TypeError, match="unknown persistlog.open option"):
        persistlog.LogSet(root, replay=print)  # type: ignore[call-arg]
    assert tree(root) == before


# -- opening and closing ---------------------------------------------------------------------


def test_defaults_reach_every_log_and_close_closes_what_the_set_opened(tmp_path: Path) -> None:
    logset = persistlog.LogSet(tmp_path / "set", durability="fsync", metadata={"app": "broker"})
    logs = {f"q{i}": counter_log(logset, f"q{i}")[0] for i in range(20)}
    assert all(lg.stats()["durability"] == "fsync" for lg in logs.values())
    logs["q3"].close()  # closed by the app: no longer the set's
    assert sorted(logset.open_logs) == sorted(set(logs) - {"q3"})
    with pytest.raises(persistlog.WriterConflict, match="has the log of key 'q1' open already"):
        logset.open("q1", lambda emit: None)
    flush = counter_log(logset, "q20", durability="flush")[0]  # an option over the default
    assert flush.stats()["durability"] == "flush"
    logset.close()
    assert all(lg.closed for lg in logs.values()) and flush.closed and logset.open_logs == {}
    with pytest.raises(persistlog.LogClosedError):
        logset.open("q0", lambda emit: None)
    logset.close()  # again: nothing to do
    again = persistlog.LogSet(tmp_path / "set")
    lg, state = counter_log(again, "q1")
    assert lg.restored is not None and lg.restored.found and state == {}
    header = persistlog.restore(again.url("q1"), lambda r: None)
    assert header.found
    again.close()


@pytest.mark.slow
def test_a_second_process_opening_the_same_log_gets_writer_conflict(tmp_path: Path) -> None:
    root = tmp_path / "set"
    with persistlog.LogSet(root) as logset:
        lg, _ = counter_log(logset, "shared")
        lg.update({"k": "mine", "v": 1}, sync=True)
        log_dir = Path(logset.url("shared"))
        files = {p.name: p.read_bytes() for p in log_dir.iterdir()}
        code = (
            "import sys, persistlog\n"
            "s = persistlog.LogSet(sys.argv[1])\n"
            "try:\n"
            "    s.open('shared', lambda emit: emit({'k': 'theirs', 'v': 2}), replay=lambda r: None)\n"
            "except persistlog.WriterConflict as e:\n"
            "    print('conflict', e)\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code, str(root)], capture_output=True, text=True, env=child_env(), timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("conflict") and str(os.getpid()) in proc.stdout
        assert {p.name: p.read_bytes() for p in log_dir.iterdir()} == files  # nothing written
        lg.update({"k": "mine", "v": 3})
    assert restored(persistlog.LogSet(root), "shared") == {"mine": 3}


@pytest.mark.slow
def test_every_log_restores_after_a_sigkill_of_a_writer_of_many(tmp_path: Path) -> None:
    """A child writes to 12 logs of a set in fsync mode (rotating every 5 records) and is
    killed; every log restores to a counter between its last acknowledged and its last
    attempted value, and the next child reopens every log where the first stopped."""
    root = str(tmp_path / "set")
    acked: dict[str, int] = {}
    for round_ in range(2):
        proc = subprocess.Popen(
            [sys.executable, str(PROCS / "logset_writer.py"), json.dumps({"root": root, "keys": 12, "seed": round_})],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(),
        )
        lines: list[str] = []
        assert proc.stdout is not None

        def read() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                lines.append(raw.decode().rstrip("\n"))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while sum(line.startswith("A ") for line in lines) < 150 + 100 * round_ and proc.poll() is None:
            assert time.monotonic() < deadline, "the writer made too little progress"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        reader.join(10)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        proc.stdout.close()
        proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL, err
        assert not [line for line in lines if line.startswith("X ")], lines
        opened = {w[1]: int(w[2]) for w in (line.split() for line in lines) if w[0] == "O"}
        assert opened == {f"queue/{i}": acked.get(f"queue/{i}", 0) for i in range(12)}
        for w in (line.split() for line in lines):
            if w[0] == "A":
                acked[w[1]] = int(w[2])
        logset = persistlog.LogSet(root, create=False)
        assert sorted(logset.keys()) == sorted(f"queue/{i}" for i in range(12))
        for key in logset.keys():
            values: list[int] = []
            logset.restore(key, lambda r: values.append(r["n"]))
            last = values[-1] if values else 0
            # fsync: every acknowledged update is there; at most the one in flight beyond it.
            assert acked.get(key, 0) <= last <= acked.get(key, 0) + 1, (key, values)
            acked[key] = last


# -- on S3: walking a set lists shards, never the objects of every log -------------------------


@pytest.mark.slow
def test_walking_a_set_on_s3_lists_one_level_at_a_time(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_requests: MotoRequests
) -> None:
    root = f"s3://{s3_bucket}/broker/queues"
    logset = persistlog.LogSet(root, storage_options=s3_storage_options)
    keys = [f"queue/{i}" for i in range(40)]
    for key in keys:
        lg, _ = counter_log(logset, key)
        for i in range(3):
            lg.update({"k": i, "v": i}, sync=True)  # one segment object per sync
    logset.close()
    s3_requests.take()
    assert sorted(persistlog.LogSet(root, storage_options=s3_storage_options).keys()) == sorted(keys)
    seen = s3_requests.take()
    shards = {logset.url(k).split("/")[-2] for k in keys}
    lists = [q for method, _path, q in seen if "list-type=2" in q]
    # The marker, then one delimited listing of the root and one per shard: nothing else.
    assert [(m, p) for m, p, q in seen if "list-type=2" not in q] == [("GET", f"/{s3_bucket}/broker/queues/LOGSET")]
    assert len(lists) == 1 + len(shards), lists
    assert all("delimiter=%2F" in q for q in lists)
    # Objects under the logs (segments, CURRENT, ...) outnumber the listings many times over.
    import fsspec

    objects = fsspec.filesystem("s3", **s3_storage_options).find(f"{s3_bucket}/broker/queues")
    assert len(objects) > 4 * len(lists)
    assert "queue/0" in logset and "queue/40" not in logset
    assert restored(logset, "queue/7") == {0: 0, 1: 1, 2: 2}


@pytest.mark.slow
def test_a_set_on_s3_refuses_a_log_at_its_root_and_the_second_writer(
    s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    a_log = f"s3://{s3_bucket}/a-log"
    persistlog.open(a_log, lambda emit: None, storage_options=s3_storage_options).close()
    with pytest.raises(persistlog.LogSetError, match="holds a persistlog log"):
        persistlog.LogSet(a_log, storage_options=s3_storage_options)
    with pytest.raises(persistlog.LogNotFoundError):
        persistlog.LogSet(f"s3://{s3_bucket}/none", storage_options=s3_storage_options, create=False)
    with pytest.raises(persistlog.LogSetError, match="bucket 'no-such-bucket' does not exist"):
        persistlog.LogSet("s3://no-such-bucket/set", storage_options=s3_storage_options)
    one = persistlog.LogSet(f"s3://{s3_bucket}/set", storage_options=s3_storage_options)
    two = persistlog.LogSet(f"s3://{s3_bucket}/set", storage_options=s3_storage_options)
    lg, _ = counter_log(one, "k")
    with pytest.raises(persistlog.WriterConflict):
        two.open("k", lambda emit: None, replay=lambda r: None)
    lg.update({"k": "a", "v": 1})
    one.close()
    assert restored(two, "k") == {"a": 1}


def test_a_set_made_by_another_process_between_the_two_listings_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two processes make the same set at once: this one lists the root's files before the
    # other writes the marker, and its directories after the other opened a key in it.
    # The marker comes before any shard, so the set is there: no "is not a log set".
    import persistlog._apps.log_set as log_set_module

    root = tmp_path / "set"
    root.mkdir()  # empty, as the other process found it too
    real = log_set_module.subdirectories
    made = []

    def listing_after_the_other_made_the_set(url: Any, storage_options: Any = None) -> list[str]:
        if not made:
            made.append(True)  # the other process's own listing is a plain one
            persistlog.LogSet(root, depth=2).open("k", lambda emit: None).close()
        return real(url, storage_options)

    monkeypatch.setattr(log_set_module, "subdirectories", listing_after_the_other_made_the_set)
    logs = persistlog.LogSet(root)
    assert logs.depth == 2 and list(logs.keys()) == ["k"]

"""The CLI on things that are not logs: each command says "no persistlog log at URL" and
what is there instead, exits 2 and writes nothing; ``--json`` errors are JSON on stdout
too; ``--version`` names the package; ``restore-check`` labels log seqs as seqs."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cli_logs import KV, cli, cli_subprocess, corrupt_middle, write_logs

import persistlog

COMMANDS = ["verify", "restore-check", "dump", "info", "tail", "repair"]


@pytest.fixture
def readme_dir(tmp_path: Path) -> str:
    d = tmp_path / "notalog"
    d.mkdir()
    (d / "readme.txt").write_text("not a log\n")
    return str(d)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_directory_of_other_files_is_no_log(readme_dir: str, command: str) -> None:
    run = cli(command, readme_dir)
    assert run.status == 2, run.out + run.err
    assert run.out == ""
    assert run.err.strip() == (
        f"persistlog: no persistlog log at {readme_dir}: it holds 1 other file (readme.txt) and no log segment"
    )
    assert os.listdir(readme_dir) == ["readme.txt"]  # repair took no lock, nothing was written


@pytest.mark.parametrize("command", COMMANDS)
def test_a_log_set_root_says_so_and_how_to_name_one_of_its_logs(tmp_path: Path, command: str) -> None:
    root = str(tmp_path / "set")
    with persistlog.LogSet(root, create=True) as logs:
        logs.open("alice", lambda emit: None).update({"k": 1})
        one = logs.url("alice")
    before = sorted(os.walk(root))
    run = cli(command, root)
    assert run.status == 2 and run.out == ""
    assert "it is the root of a log set (LOGSET)" in run.err and "LogSet(root).url(key)" in run.err
    assert sorted(os.walk(root)) == before  # nothing written
    if command != "repair":  # repair's own rules (a lock) are not this test's
        assert cli(command, one).status == 0, command


@pytest.mark.parametrize("command", COMMANDS)
def test_json_errors_are_json_on_stdout(readme_dir: str, command: str) -> None:
    run = cli(command, readme_dir, "--json")
    assert run.status == 2
    doc = json.loads(run.out)
    assert doc == {
        "url": readme_dir,
        "ok": False,
        "error": f"no persistlog log at {readme_dir}: it holds 1 other file (readme.txt) and no log segment",
        "exit_status": 2,
    }
    assert doc["error"] in run.err  # still said on stderr


def test_repair_writes_nothing_where_there_is_no_log(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    run = cli("repair", str(empty))
    assert run.status == 2 and "no persistlog log at" in run.err and "it is empty" in run.err
    assert os.listdir(empty) == []
    missing = tmp_path / "missing"
    run = cli("repair", str(missing), "--force")
    assert run.status == 2 and "the directory does not exist" in run.err
    assert not missing.exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_regular_file_is_not_called_a_missing_directory(tmp_path: Path, command: str) -> None:
    f = tmp_path / "state.db"
    f.write_text("x")
    run = cli(command, str(f))
    assert run.status == 2
    assert f"no persistlog log at {f}: it is a file, not a directory" in run.err
    assert "does not exist" not in run.err
    below = cli(command, str(f / "log"))
    assert below.status == 2 and f"{f} is a file, not a directory" in below.err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_directory_says_so(tmp_path: Path, command: str) -> None:
    run = cli(command, str(tmp_path / "nothing"))
    assert run.status == 2 and run.out == ""
    assert run.err.strip() == f"persistlog: no persistlog log at {tmp_path / 'nothing'}: the directory does not exist"


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.parametrize("command", COMMANDS)
def test_s3_missing_bucket_and_empty_prefix(s3_bucket: str, s3_storage_options: dict, command: str) -> None:
    endpoint = s3_storage_options["client_kwargs"]["endpoint_url"]
    options = ["-o", "key=testing", "-o", "secret=testing", "-o", f"client_kwargs.endpoint_url={endpoint}"]
    missing = cli(command, "s3://no-such-bucket-persistlog/app", *options)
    assert missing.status == 2
    assert "no persistlog log at s3://no-such-bucket-persistlog/app: the bucket 'no-such-bucket-persistlog' does not exist" in missing.err
    assert "directory" not in missing.err
    empty = cli(command, f"s3://{s3_bucket}/app", *options, "--json")
    assert empty.status == 2
    assert json.loads(empty.out)["error"] == (
        f"no persistlog log at s3://{s3_bucket}/app: no object in bucket '{s3_bucket}' has the prefix 'app/'"
    )


@pytest.mark.slow
def test_s3_without_credentials_says_how_to_give_them(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    run = subprocess.run([sys.executable, "-m", "persistlog", "info", "s3://no-such-bucket-anywhere/app"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 2 and run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "NoCredentialsError" in lines[0] and "AWS_ACCESS_KEY_ID" in lines[0], run.stderr


def test_other_failures_are_json_on_stdout_too(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    kv = KV()
    lg = persistlog.open(url, kv.enumerate_all, batch_bytes=300)
    for i in range(200):
        kv.put(lg, f"k{i % 20}", {"i": i})
        if i % 10 == 9:
            lg.sync()
    lg.close()
    victim = corrupt_middle(url)
    run = cli("restore-check", url, "--json")
    assert run.status == 1
    doc = json.loads(run.out)
    assert doc["ok"] is False and doc["exit_status"] == 1 and f"offset {victim.offset}" in doc["error"]


def test_version_names_the_package_and_the_format() -> None:
    run = cli_subprocess("--version")
    assert run.status == 0
    version = importlib.metadata.version("persistlog")
    assert run.out.strip() == f"persistlog {version} (writes format v3, reads v1-v3)"
    assert persistlog.FORMAT_VERSION == 3 and persistlog.SEGMENT_VERSIONS == (1, 2, 3)


def test_restore_check_labels_log_seqs_as_seqs(logdir: str) -> None:
    run = cli("restore-check", logdir)
    assert run.status == 0, run.err
    assert "  replayed from    log seq 3\n" in run.out
    assert "logs replayed" not in run.out


# -- tail -f: a location with no log is an error; with --wait, a log that is not there yet
# -- is waited for, but not where none can ever be -------------------------------------


@pytest.mark.slow
def test_tail_follow_fails_at_once_on_a_regular_file(tmp_path: Path) -> None:
    # A child process: a tail -f that waits for the file to become a directory never ends.
    f = tmp_path / "state.db"
    f.write_text("x")
    run = cli_subprocess("tail", "-f", "--wait", str(f), timeout=60)
    assert run.status == 2 and run.out == ""
    assert run.err.strip() == f"persistlog: no persistlog log at {f}: it is a file, not a directory"
    below = cli_subprocess("tail", "-f", "--wait", str(f / "log"), "--json", timeout=60)
    assert below.status == 2
    assert json.loads(below.out)["error"] == f"no persistlog log at {f / 'log'}: {f} is a file, not a directory"
    assert f.read_text() == "x"


@pytest.mark.slow
@pytest.mark.s3
def test_tail_follow_fails_at_once_on_a_missing_bucket(s3_storage_options: dict) -> None:
    endpoint = s3_storage_options["client_kwargs"]["endpoint_url"]
    options = ["-o", "key=testing", "-o", "secret=testing", "-o", f"client_kwargs.endpoint_url={endpoint}"]
    run = cli_subprocess("tail", "-f", "--wait", "s3://no-such-bucket-persistlog/app", *options, timeout=60)
    assert run.status == 2 and run.out == ""
    assert run.err.strip() == (
        "persistlog: no persistlog log at s3://no-such-bucket-persistlog/app: "
        "the bucket 'no-such-bucket-persistlog' does not exist"
    )


@pytest.mark.slow
def test_tail_follow_without_wait_fails_on_a_typo_at_once(tmp_path: Path) -> None:
    """A mistyped path is not a quiet log: tail -f says there is no log there (exit 2)."""
    run = cli_subprocess("tail", "-f", str(tmp_path / "typo"), timeout=60)
    assert run.status == 2 and run.out == ""
    assert run.err.startswith(f"persistlog: no persistlog log at {tmp_path / 'typo'}")
    assert cli_subprocess("tail", "--wait", str(tmp_path / "typo"), timeout=60).status == 2


@pytest.mark.slow
def test_tail_follow_wait_waits_for_a_log_in_a_directory_not_made_yet(tmp_path: Path) -> None:
    url = str(tmp_path / "later" / "log")
    proc = subprocess.Popen(
        [sys.executable, "-m", "persistlog", "tail", "-f", "--wait", url, "--json", "--interval", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = threading.Timer(60, proc.kill)  # a tail that prints nothing fails, never hangs
    deadline.start()
    try:
        # Still running after its start-up and first look (a fraction of a second): it waits.
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
        write_logs(url, updates=5, rotate_every=0)
        assert proc.stdout is not None
        first = proc.stdout.readline()  # printed by the tail -f started before the directory
        assert first, proc.stderr.read() if proc.stderr else ""
        assert json.loads(first)["record"] == {"op": "put", "key": "k0", "value": {"i": 0, "pad": ""}}
    finally:
        deadline.cancel()
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_log_sets_shard_directory_is_named_as_a_directory_above_a_log(tmp_path: Path, command: str) -> None:
    # A shard directory holds only the keys' directories: it is no empty log.
    logs = persistlog.LogSet(str(tmp_path / "broker"))
    logs.open("alice", lambda emit: None).close()
    shard = os.path.dirname(logs.url("alice"))
    run = cli(command, shard)
    assert run.status == 2
    assert f"no persistlog log at {shard}: it holds 1 directory (alice/) and no log segment" in run.err
    assert os.listdir(shard) == ["alice"]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_key_named_under_a_log_set_root_without_its_shard_says_where_its_log_is(tmp_path: Path, command: str) -> None:
    # root/alice for root/2b/alice: the typo a stranger makes first. The reader says where
    # the key's log is, and for a key the set does not hold, where it would be.
    root = str(tmp_path / "broker")
    with persistlog.LogSet(root, create=True) as logs:
        logs.open("user:1", lambda emit: None).update({"k": 1})
        there, absent = logs.url("user:1"), logs.url("bob")
    before = sorted(os.walk(root))
    for typed, key, said in ((f"{root}/user:1", "user:1", f"the log of key 'user:1' is {there}"),
                             (f"{root}/user%3A1", "user:1", f"the log of key 'user:1' is {there}"),
                             (f"{root}/bob", "bob", f"key 'bob' has no log in it (it would be {absent})")):
        run = cli(command, typed)
        assert run.status == 2 and run.out == "", (typed, run.err)
        assert run.err.strip() == (
            f"persistlog: no persistlog log at {typed}: the directory does not exist; {root} is the root of a "
            f"log set (LOGSET): {said}"
        ), key
    assert sorted(os.walk(root)) == before  # nothing written

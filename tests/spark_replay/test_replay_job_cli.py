"""The replay job's command line, where no Spark is needed: bad input fails fast and clearly."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from spark_replay._job import JobError, main, parse_storage_options


def test_storage_options_nest_and_parse_json() -> None:
    assert parse_storage_options(["key=abc", "client_kwargs.endpoint_url=http://h:1", "anon=false", "n=3"]) == {
        "key": "abc",
        "client_kwargs": {"endpoint_url": "http://h:1"},
        "anon": False,
        "n": 3,
    }
    with pytest.raises(JobError, match="KEY=VALUE"):
        parse_storage_options(["novalue"])


@pytest.mark.slow
def test_missing_log_exits_2_before_starting_spark(tmp_path: Any) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "spark_replay", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert f"no persistlog logs at {tmp_path / 'nothing'}: the directory does not exist" in proc.stderr
    assert not (tmp_path / "out").exists()
    (tmp_path / "afile").write_text("not a log")
    proc = subprocess.run(
        [sys.executable, "-m", "spark_replay", str(tmp_path / "afile"), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and "it is a file, not a directory" in proc.stderr


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--convention", "resource", "--key", "x"], "--key/--op are for --convention raw"),
        (["--convention", "raw", "--op", "x"], "--op needs --key"),
    ],
)
def test_inconsistent_arguments_are_refused(tmp_path: Any, capsys: Any, extra: list[str], message: str) -> None:
    assert main([str(tmp_path), "--out", str(tmp_path / "out"), *extra], spark=object()) == 2
    assert message in capsys.readouterr().err


def test_unknown_protocol_is_bad_input(tmp_path: Any, capsys: Any) -> None:
    assert main(["nosuchproto://x/y", "--out", str(tmp_path / "out")], spark=object()) == 2
    assert "cannot open nosuchproto://x/y" in capsys.readouterr().err


@pytest.mark.slow
def test_a_bad_as_of_time_is_refused_before_spark_starts(tmp_path: Any) -> None:
    import persistlog

    url = str(tmp_path / "log")
    lg = persistlog.open(url, lambda emit: None)
    lg.update({"op": "put", "key": "a", "value": 1})
    lg.close()
    proc = subprocess.run(
        [sys.executable, "-m", "spark_replay", url, "--out", str(tmp_path / "out"), "--as-of-time", "yesterday"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "as_of_time must be an ISO-8601 time" in proc.stderr and "'yesterday'" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("lsn", [99, 2])
def test_an_as_of_lsn_the_log_does_not_hold_is_refused_before_spark_starts(tmp_path: Any, capsys: Any, lsn: int) -> None:
    import persistlog

    url = str(tmp_path / "log")
    with persistlog.open(url, lambda emit: None, retain=1) as lg:
        for i in range(3):
            lg.update({"op": "put", "key": f"k{i}", "value": i})
        lg.rotate(wait=True)
        lg.rotate(wait=True)
        lg.update({"op": "put", "key": "k3", "value": 3})
    # 99: past the end; 2: before the oldest record retention left (log 1 is gone).
    assert main([url, "--out", str(tmp_path / "out"), "--as-of-lsn", str(lsn)], spark=object()) == 2
    err = capsys.readouterr().err
    assert f"--as-of-lsn {lsn}: LSN {lsn} is" in err and "it holds LSNs" in err
    assert not (tmp_path / "out").exists()

"""The CLI on a healthy zstd log, run by an interpreter without ``zstandard``: nothing is
called corrupt, ``verify`` cannot check (exit 2, not 1) and ``repair`` refuses, cutting
nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_logs import KV, cli, tree_digest

import persistlog
from childproc import CLI, run_python

HINT = "pip install 'persistlog[zstd]'"


@pytest.fixture
def zstd_log(tmp_path: Path) -> str:
    url = str(tmp_path / "log")
    kv = KV()
    lg = persistlog.open(url, kv.enumerate_all, compression="zstd", batch_bytes=4096)
    for i in range(300):
        kv.put(lg, f"k{i % 40}", {"i": i, "pad": "x" * 50})
    lg.close()
    assert cli("verify", url).status == 0  # healthy, read with the package
    return url


def cli_without_zstandard(*argv: str) -> tuple[int, str, str]:
    proc = run_python(CLI, *argv, hide=["zstandard"])
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.slow
def test_verify_cannot_check_and_says_what_to_install(zstd_log: str) -> None:
    status, out, err = cli_without_zstandard("verify", zstd_log)
    assert status == 2, err
    assert f"cannot check {zstd_log}" in err and HINT in err
    assert "CORRUPT" not in out + err and "DAMAGED" not in out + err

    status, out, err = cli_without_zstandard("verify", zstd_log, "--json")
    doc = json.loads(out)
    assert status == 2 and doc["ok"] is False and doc["exit_status"] == 2 and HINT in doc["error"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--force"], ["--force", "--dry-run"], []])
def test_repair_refuses_and_cuts_nothing(zstd_log: str, mode: list[str]) -> None:
    before = tree_digest(zstd_log)
    status, out, err = cli_without_zstandard("repair", zstd_log, *mode)
    assert status == 2, out + err
    assert "repair refused, nothing changed" in err and HINT in err
    assert "truncate" not in out
    assert tree_digest(zstd_log) == before
    assert not os.path.exists(os.path.join(zstd_log, "broken"))
    assert cli("verify", zstd_log).status == 0


@pytest.mark.slow
@pytest.mark.parametrize("command", ["restore-check", "dump", "info", "tail"])
def test_readers_stop_with_the_install_hint(zstd_log: str, command: str) -> None:
    status, out, err = cli_without_zstandard(command, zstd_log)
    assert status == 2, out + err
    assert HINT in err and "corrupt" not in err.lower()

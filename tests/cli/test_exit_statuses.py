"""Exit statuses and errors as the help states them: ``info`` exits 1 on damage (a torn
tail or corruption; warnings do not count), and with ``--json`` anywhere on the command line
a usage error is the JSON error object on stdout too."""

from __future__ import annotations

import json
import os

import pytest
from cli_logs import cli, corrupt_middle, flip, tear_newest


@pytest.mark.parametrize("damage", ["corrupt", "torn", "none", "current"])
def test_info_exits_1_on_damage(logdir: str, damage: str) -> None:
    if damage == "corrupt":
        corrupt_middle(logdir)
    elif damage == "torn":
        tear_newest(logdir)
    elif damage == "current":
        flip(os.path.join(logdir, "CURRENT"), 13)  # a warning: readers search the logs
    run = cli("info", logdir)
    want = 1 if damage in ("corrupt", "torn") else 0
    assert run.status == want, run.out
    assert ("damage:" in run.out) == (want == 1)
    data = json.loads(cli("info", logdir, "--json").out)
    assert data["ok"] is (want == 0)


@pytest.mark.parametrize(
    "argv",
    [
        ["info", "{url}", "--json", "--bogus"],
        ["--json", "info"],
        ["tail", "{url}", "--from-lsn", "x", "--json"],
        ["--json", "no-such-command", "{url}"],
        ["verify", "--js", "{url}", "--torn-ok=3"],
    ],
)
def test_usage_errors_with_json_are_json_on_stdout(logdir: str, argv: list[str]) -> None:
    run = cli(*(a.format(url=logdir) for a in argv))
    assert run.status == 2
    doc = json.loads(run.out)
    assert set(doc) == {"url", "ok", "error", "exit_status"}
    assert doc["ok"] is False and doc["exit_status"] == 2 and doc["error"] and doc["url"] is None
    assert doc["error"] in run.err
    plain = cli(*(a.format(url=logdir) for a in argv if a not in ("--json", "--js")))
    assert plain.status == 2 and plain.out == "" and "usage:" in plain.err

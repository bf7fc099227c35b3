"""Every example runs, as a user would run it, with small sizes: as a child process."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import persistlog
import pytest
from example_scripts import EXAMPLES
from threads import wait_until


# -- kvstore.py ---------------------------------------------------------------------------


class ExampleService:
    """An example service as a running child process on a free port: the line it printed
    once restored, and the match of ``listening`` in the next one."""

    script = ""
    listening = ""

    def __init__(self, url: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(EXAMPLES / self.script), url, "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.restored = self.proc.stdout.readline()
        line = self.proc.stdout.readline()
        m = re.search(self.listening, line)
        assert m, (self.restored, line, self.proc.stderr.read() if self.proc.stderr else "")
        self.address = m


class KVService(ExampleService):
    """examples/kvstore.py as a running child process."""

    script = "kvstore.py"
    listening = r"listening on (http://\S+)"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.base = self.address.group(1)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            e.close()
            return e.code, None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.close_pipes()

    def terminate(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=20)
        return out

    def close_pipes(self) -> None:
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


@pytest.mark.slow
def test_kvstore_survives_kill_9(tmp_path: Path) -> None:
    url = str(tmp_path / "kv")
    svc = KVService(url)
    try:
        assert "restored 0 keys" in svc.restored
        for i in range(20):
            assert svc.request("PUT", f"/kv/user:{i}", {"n": i})[0] == 204
        assert svc.request("DELETE", "/kv/user:3")[0] == 204
        assert svc.request("GET", "/kv/user:4") == (200, {"n": 4})
        assert svc.request("GET", "/kv/user:3")[0] == 404
    finally:
        svc.kill()  # SIGKILL: every 204 above was durable (fsync mode) before it was sent

    svc = KVService(url)
    try:
        assert "restored 19 keys" in svc.restored
        status, everything = svc.request("GET", "/kv")
        assert status == 200 and everything == {f"user:{i}": {"n": i} for i in range(20) if i != 3}
        assert svc.request("GET", "/stats")[1]["durability"] == "fsync"
        out = svc.terminate()
        assert svc.proc.returncode == 0 and "closed cleanly with 19 keys" in out
    finally:
        if svc.proc.poll() is None:
            svc.kill()
        svc.close_pipes()
    assert persistlog.restore(url, lambda r: None).records == 19


# -- sessions.py --------------------------------------------------------------------------


@pytest.mark.slow
def test_sessions_survive_a_restart(tmp_path: Path, run_example: Any) -> None:
    url = str(tmp_path / "sessions")
    proc = run_example("sessions.py", url, "--clients", "6", "--messages", "60")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every session came back" in proc.stdout
    assert re.search(r"delivered \d+ messages after the restart", proc.stdout)
    again = run_example("sessions.py", url)
    assert again.returncode == 2 and "already holds sessions" in again.stderr


# -- broker_queues.py ---------------------------------------------------------------------


def test_broker_queues_survive_kill_9_with_nothing_acknowledged_back_and_nothing_lost(
    tmp_path: Path, run_example: Any
) -> None:
    root = str(tmp_path / "broker")
    proc = run_example("broker_queues.py", root, "--queues", "100", "--messages", "3", "--after", "300")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["queues"] == 100
    assert summary["acked_redelivered"] == 0 and summary["unacked_lost"] == 0
    assert summary["acked"] > 0 and summary["sent"] >= 300
    # What the example says is pending is what the set holds, read by this process.
    with persistlog.LogSet(root, create=False) as logs:
        held = sum(len(persistlog.Queue.open_in(logs, key)) for key in logs.keys())
    assert held == summary["pending"]
    again = run_example("broker_queues.py", root)
    assert again.returncode == 2 and "not empty" in again.stderr


# -- replica.py ---------------------------------------------------------------------------


def _digest(data: dict[str, Any]) -> str:
    import hashlib

    text = json.dumps(sorted(data.items(), key=lambda kv: json.dumps(kv[0])))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _write(url: str, start: int, count: int, **options: Any) -> dict[str, Any]:
    store = persistlog.ResourceStore.open(url, segment_bytes=4096, **options)
    for i in range(start, start + count):
        store[f"k{i % 70}"] = {"i": i}
        if i % 9 == 0:
            store.pop(f"k{(i * 5) % 70}", None)
    state = store.to_dict()
    store.close()
    return state


@pytest.mark.slow
def test_replica_mirrors_and_resumes_from_its_cursor(tmp_path: Path, run_example: Any) -> None:
    url = str(tmp_path / "primary")
    state_file = str(tmp_path / "replica.json")
    primary = _write(url, 0, 300)
    first = run_example("replica.py", url, "--state", state_file, "--idle-exit", "0.3")
    assert first.returncode == 0, first.stderr
    assert f"digest {_digest(primary)}" in first.stdout

    primary = _write(url, 300, 200)
    second = run_example("replica.py", url, "--state", state_file, "--idle-exit", "0.3")
    assert second.returncode == 0, second.stderr
    assert "resuming" in second.stdout and "resets 0" in second.stdout
    assert f"digest {_digest(primary)}" in second.stdout
    saved = json.loads(Path(state_file).read_text())
    assert saved["data"] == primary

    # Retention deletes the log the saved cursor points into: the replica starts over.
    for n in range(3):
        primary = _write(url, 500 + 100 * n, 100, retain=1)
    third = run_example("replica.py", url, "--state", state_file, "--idle-exit", "0.3")
    assert third.returncode == 0, third.stderr
    assert "resets 1" in third.stdout and f"digest {_digest(primary)}" in third.stdout


@pytest.mark.slow
def test_replica_stops_at_an_lsn(tmp_path: Path, run_example: Any) -> None:
    url = str(tmp_path / "primary")
    _write(url, 0, 100)
    proc = run_example("replica.py", url, "--until-lsn", "50")
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"up to LSN (\d+)", proc.stdout)
    assert m and int(m.group(1)) >= 50


# -- demo.py --------------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_proves_its_claims_with_small_sizes(tmp_path: Path, run_example: Any) -> None:
    proc = run_example("demo.py", "--updates", "6000", "--no-spark", "--dir", str(tmp_path), timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "[FAIL]" not in out
    for claim in (
        "every acknowledged update survived the crash",
        "the state is exactly the state after a prefix of the updates",
        "the follower caught up to exactly the primary's state",
    ):
        assert claim in out
    assert "this demo proved" in out


# -- async_kv.py --------------------------------------------------------------------------


class AsyncKVService(ExampleService):
    """examples/async_kv.py as a running child process, spoken to over TCP."""

    script = "async_kv.py"
    listening = r"listening on ([\d.]+):(\d+)"

    def __init__(self, url: str, *args: str) -> None:
        super().__init__(url, *args)
        self.host, self.port = self.address.group(1), int(self.address.group(2))

    async def session(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One connection sending ``requests`` in turn; the answers."""
        import asyncio

        reader, writer = await asyncio.open_connection(self.host, self.port)
        answers = []
        for request in requests:
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            answers.append(json.loads(await reader.readline()))
        writer.close()
        await writer.wait_closed()
        return answers

    def ask(self, *requests: dict[str, Any]) -> list[dict[str, Any]]:
        import asyncio

        return asyncio.run(self.session(list(requests)))

    def stop(self, sig: int) -> str:
        self.proc.send_signal(sig)
        out, _ = self.proc.communicate(timeout=30)
        return out


@pytest.mark.slow
def test_async_kv_answers_many_connections_and_survives_kill_9(tmp_path: Path) -> None:
    import asyncio

    url = str(tmp_path / "akv")
    svc = AsyncKVService(url, "--rotate-records", "100")
    try:
        assert "restored 0 keys" in svc.restored

        async def clients() -> list[list[dict[str, Any]]]:
            return await asyncio.gather(*(
                svc.session([{"op": "put", "key": f"c{c}:{i % 4}", "value": {"c": c, "i": i}} for i in range(12)])
                for c in range(40)
            ))

        answers = asyncio.run(clients())
        assert all(a["ok"] and isinstance(a["lsn"], int) for session in answers for a in session)
        got = svc.ask(
            {"op": "del", "key": "c0:0"},
            {"op": "get", "key": "c1:3"},
            {"op": "get", "key": "c0:0"},
            {"op": "put", "key": "bad", "value": {"x": 1}, "extra": "ignored"},
            {"op": "frobnicate"},
        )
        assert got[0]["ok"] and got[1] == {"ok": True, "value": {"c": 1, "i": 11}}
        assert got[2] == {"ok": False, "error": "no such key"}
        assert got[3]["ok"] and not got[4]["ok"]
        # The 480 changes crossed the 100-record trigger: it rotated (or is rotating) while serving.
        stats = wait_until(lambda: (s := svc.ask({"op": "stats"})[0]["stats"])["rotations"] >= 2 and s)
        assert stats["durability"] == "fsync"
    finally:
        svc.stop(signal.SIGKILL)  # every "ok" above was durable before it was sent
    expected = {f"c{c}:{k}": {"c": c, "i": 8 + k} for c in range(40) for k in range(4)}
    del expected["c0:0"]
    expected["bad"] = {"x": 1}

    svc = AsyncKVService(url)
    try:
        assert f"restored {len(expected)} keys" in svc.restored
        keys = svc.ask({"op": "keys"})[0]["keys"]
        assert keys == sorted(expected)
        values = svc.ask(*({"op": "get", "key": k} for k in keys))
        assert {k: v["value"] for k, v in zip(keys, values)} == expected
    finally:
        out = svc.stop(signal.SIGTERM)
    assert svc.proc.returncode == 0 and f"closed cleanly with {len(expected)} keys" in out
    state: dict[str, Any] = {}
    persistlog.restore(
        url, lambda r: state.__setitem__(r["key"], r["value"]) if r["op"] == "put" else state.pop(r["key"], None)
    )
    assert state == expected


# -- live_table.py ------------------------------------------------------------------------


@pytest.mark.spark
def test_live_table_holds_every_record_once_across_a_restart(tmp_path: Path, run_example: Any) -> None:
    proc = run_example("live_table.py", "--out", str(tmp_path), "--seconds", "8", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "starting it again from" in proc.stdout
    assert "every record exactly once: yes" in proc.stdout
    assert "the table's state matches the store: yes" in proc.stdout


# -- rolling_deploy.py ------------------------------------------------------------------------


def test_rolling_deploy_hands_over_between_generations_losing_nothing(tmp_path: Path, run_example: Any) -> None:
    proc = run_example("rolling_deploy.py", str(tmp_path / "counters"), "--generations", "3", "--seconds", "0.7",
                       timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert len(re.findall(r"generation \d: ready \d+ ms after asking", proc.stdout)) == 3, proc.stdout
    m = re.search(r"(\d+) acknowledged increments over 3 generations; lost 0, counted twice 0", proc.stdout)
    assert m and int(m.group(1)) > 0, proc.stdout
    counters: dict[str, int] = {}
    persistlog.restore(str(tmp_path / "counters"), replay=lambda r: counters.__setitem__(r["key"], r["value"]))
    assert sum(counters.values()) == int(m.group(1))


# -- history.py -----------------------------------------------------------------------------


def test_history_shows_a_range_and_the_state_at_an_lsn(tmp_path: Path, run_example: Any) -> None:
    url = str(tmp_path / "accounts")
    _write(url, 0, 120)
    cut: dict[Any, Any] = {}

    def apply(r: dict[str, Any]) -> None:
        if r["op"] == "put":
            cut[r["key"]] = r["value"]
        else:
            cut.pop(r["key"], None)

    persistlog.restore(url, apply, to_lsn=60)
    proc = run_example("history.py", url, "--from-lsn", "40", "--to-lsn", "60")
    assert proc.returncode == 0, proc.stderr
    shown = [int(line.split()[0]) for line in proc.stdout.splitlines() if line.startswith("  ") and line.split()[0].isdigit()]
    assert shown == list(range(40, 61))
    assert f"state as of LSN 60 (from log(s) [1]): {len(cut)} resources" in proc.stdout
    too_far = run_example("history.py", url, "--from-lsn", "5000")
    assert too_far.returncode == 2 and "past the end" in too_far.stderr
    demo = run_example("history.py", "--updates", "120")
    assert demo.returncode == 0 and "state as of LSN" in demo.stdout, demo.stderr


# -- consumers.py ---------------------------------------------------------------------------


def test_consumers_each_get_every_message_and_the_killed_one_resumes(tmp_path: Path, run_example: Any) -> None:
    url = str(tmp_path / "stream")
    proc = run_example("consumers.py", url, "--messages", "2000", "--consumers", "billing,analytics,archive")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every consumer has every message" in proc.stdout
    assert "analytics: killed (SIGKILL)" in proc.stdout
    # It started twice: the second time after its committed position, not from the start.
    starts = re.findall(r"analytics: starting at (\S+)", proc.stdout)
    assert len(starts) == 2 and persistlog.Cursor.parse(starts[1]).next_lsn > 1
    for name in ("billing", "analytics", "archive"):
        seqs = [int(line.split()[0]) for line in (tmp_path / "stream.out" / f"{name}.delivered").read_text().splitlines()]
        assert set(seqs) == set(range(2000)), name
        assert re.search(rf"{name}: 2000 messages from #0, \d+ delivered again after a crash, 0 missing", proc.stdout)
    # What a consumer got twice is only what it delivered after its last commit: one run.
    analytics = [int(line.split()[0]) for line in (tmp_path / "stream.out" / "analytics.delivered").read_text().splitlines()]
    restart = next((i for i in range(1, len(analytics)) if analytics[i] <= analytics[i - 1]), len(analytics))
    assert analytics[:restart] == list(range(restart))
    assert analytics[restart:] == list(range(analytics[restart], 2000)) if restart < len(analytics) else True


# -- audit.py ---------------------------------------------------------------------------------


def test_audit_refuses_a_storage_option_without_a_value_before_starting_spark(tmp_path: Path, run_example: Any) -> None:
    """The example parses ``--storage-option`` with the library's one parser: a word
    without ``=`` is a usage error (exit 2), said before any Spark starts. (The Spark run
    itself is tests/spark_replay/test_spark_replay.py::test_audit_example_runs.)"""
    proc = run_example("audit.py", str(tmp_path / "log"), "--storage-option", "anon")
    assert proc.returncode == 2, proc.stderr
    assert "--storage-option needs KEY=VALUE, got 'anon'" in proc.stderr
    assert proc.stdout == ""

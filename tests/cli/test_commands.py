"""The persistlog command on clean, torn and corrupt destinations: output, JSON and exit
statuses. Most cases call ``persistlog.cli.main(argv)`` in-process; a few run
``python -m persistlog`` as a real child process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import persistlog
import pytest
from childproc import StdoutLines
from cli_logs import (
    batches,
    cli,
    cli_subprocess,
    corrupt_middle,
    flip,
    KV,
    tear_newest,
    tree_digest,
)
from kv_app import restore_state

# -- usage and errors ---------------------------------------------------------------------


@pytest.mark.slow
def test_help_shows_examples_and_exit_statuses() -> None:
    run = cli_subprocess("--help")
    assert run.status == 0
    assert "examples:" in run.out and "exit status:" in run.out
    for command in ("info", "verify", "dump", "tail", "repair", "restore-check"):
        assert command in run.out
        sub = cli(command, "--help")
        assert sub.status == 0 and "examples:" in sub.out, command


@pytest.mark.parametrize(
    "argv, message",
    [
        (["info", "nosuch://bucket/x"], "unknown destination protocol"),
        (["verify", "/nonexistent/persistlog/dir"], "no persistlog log at /nonexistent/persistlog/dir: the directory does not exist"),
        (["dump", "/tmp", "--storage-option", "novalue"], "KEY=VALUE"),
        (["repair", "memory://cli-tests/never"], "no persistlog log at memory://cli-tests/never"),
        (["bogus-command", "x"], ""),
        (["info"], ""),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str) -> None:
    run = cli(*argv)
    assert run.status == 2
    assert run.out == ""
    if message:
        assert message in run.err
        assert len(run.err.strip().splitlines()) == 1, run.err


def test_storage_options_parse_as_json_when_they_can() -> None:
    from persistlog.reading import parse_storage_options

    got = parse_storage_options(["anon=true", "n=3", 'client_kwargs={"region_name": "eu"}', "endpoint_url=http://h:1"])
    assert got == {"anon": True, "n": 3, "client_kwargs": {"region_name": "eu"}, "endpoint_url": "http://h:1"}
    # A dotted key nests, as the Spark job's --storage-option does (one parser serves both).
    assert parse_storage_options(["client_kwargs.endpoint_url=http://h:1"]) == {
        "client_kwargs": {"endpoint_url": "http://h:1"}
    }


# -- info ---------------------------------------------------------------------------------


def test_info_describes_every_log(logdir: str) -> None:
    run = cli("info", logdir)
    assert run.status == 0, run.err
    assert "CURRENT      log 3" in run.out
    assert "format       v3" in run.out
    assert "sealed" in run.out and "no writer holds the lock" in run.out

    data = json.loads(cli("info", logdir, "--json").out)
    assert [lg["seq"] for lg in data["logs"]] == [1, 2, 3]
    assert all(lg["state"] == "sealed" for lg in data["logs"])
    assert data["current"] == 3 and data["restore_from"] == 3 and data["format_versions"] == [3]
    assert all(len(bytes.fromhex(lg["chain_head"])) == 32 for lg in data["logs"])
    # The LSN chain runs through the logs without a gap.
    for a, b in zip(data["logs"], data["logs"][1:]):
        assert b["first_lsn"] == a["last_lsn"] + 1
    assert sum(lg["bytes"] for lg in data["logs"]) == sum(
        os.path.getsize(os.path.join(logdir, n)) for n in os.listdir(logdir) if n.endswith(".plog")
    )
    assert data["logs"][0]["first_commit_time"].endswith("Z")


def test_info_shows_a_live_writer_without_taking_its_lock(logdir: str) -> None:
    kv = KV()
    lg = persistlog.open(logdir, kv.enumerate_all, replay=kv.apply)
    try:
        data = json.loads(cli("info", logdir, "--json").out)
        holder = data["holder"]
        assert holder["pid"] == os.getpid() and holder["alive"] is True and holder["active"] is True
        assert data["logs"][-1]["state"] == "complete"  # open, not yet sealed
        assert "process running" in cli("info", logdir).out
        kv.put(lg, "still", "writable")  # info took nothing from the writer
    finally:
        lg.close()




# -- verify -------------------------------------------------------------------------------


def test_verify_clean(logdir: str) -> None:
    run = cli("verify", logdir)
    assert run.status == 0, run.out + run.err
    assert run.out.strip().endswith("clean")
    data = json.loads(cli("verify", logdir, "--json").out)
    assert data["ok"] is True and data["problems"] == [] and data["records_checked"] > 0


def test_verify_reports_a_torn_tail_with_its_location(logdir: str) -> None:
    segment, offset = tear_newest(logdir)
    run = cli("verify", logdir)
    assert run.status == 1
    assert f"TORN TAIL: log 3 segment {segment} offset {offset}" in run.out
    data = json.loads(cli("verify", logdir, "--json").out)
    assert data["torn"] == 1 and data["corrupt"] == 0
    (problem,) = data["problems"]
    assert (problem["kind"], problem["segment"], problem["offset"]) == ("torn", segment, offset)
    assert cli("verify", logdir, "--torn-ok").status == 0


def test_verify_reports_corruption_with_its_location(logdir: str) -> None:
    victim = corrupt_middle(logdir, log=2)
    run = cli("verify", logdir)
    assert run.status == 1
    assert f"CORRUPT: log 2 segment {victim.segment} offset {victim.offset}" in run.out
    assert "batch payload checksum mismatch" in run.out
    data = json.loads(cli("verify", logdir, "--json", "--torn-ok").out)
    assert data["ok"] is False and data["corrupt"] == 1
    # One flipped bit is one damage site, with what followed from it attached.
    assert data["problems"][0]["offset"] == victim.offset


def test_info_says_where_a_strict_restore_fails(logdir: str) -> None:
    assert json.loads(cli("info", logdir, "--json").out)["restore_fails_at"] is None
    newest = max(int(n[:20]) for n in os.listdir(logdir) if n.endswith(".plog"))
    victim = corrupt_middle(logdir, log=newest)
    run = cli("info", logdir)
    assert run.status == 1
    assert f"FAILS at log {newest} segment {victim.segment} offset {victim.offset}: corruption" in run.out
    assert 'only with recovery="skip"' in run.out
    fails = json.loads(cli("info", logdir, "--json").out)["restore_fails_at"]
    assert (fails["log"], fails["offset"]) == (newest, victim.offset)
    with pytest.raises(persistlog.CorruptLogError) as e:
        persistlog.restore(logdir, lambda r: None)
    assert (e.value.log, e.value.offset) == (newest, victim.offset)


def test_verify_finds_a_gap_in_the_seq_chain(logdir: str) -> None:
    for name in os.listdir(logdir):
        if name.startswith("00000000000000000002-"):
            os.unlink(os.path.join(logdir, name))
    run = cli("verify", logdir)
    assert run.status == 1 and "log 2 missing between logs 1 and 3" in run.out


def _drop_last_segment(logdir: str, seq: int) -> str:
    names = sorted(n for n in os.listdir(logdir) if n.startswith(f"{seq:020d}-"))
    assert len(names) > 1
    os.unlink(os.path.join(logdir, names[-1]))
    return names[-2]


def test_an_interrupted_retention_is_a_warning_not_corruption(logdir: str, expected: dict) -> None:
    """Retention deletes the oldest log last segment first: interrupted, it leaves that log
    unsealed and short of the next. Restore never reads it, so verify only says so."""
    _drop_last_segment(logdir, 1)
    run = cli("verify", logdir)
    assert run.status == 0, run.out
    assert "retention was deleting it when it was interrupted" in run.out and "restore starts at log 3" in run.out
    assert restore_state(logdir)[0] == expected


def test_a_middle_log_cut_short_is_still_corruption(logdir: str) -> None:
    """A log that is not the oldest, ending (unsealed) before the next one starts, lost its
    end: the damage is located in it, with the LSNs the next log says are missing."""
    kept = _drop_last_segment(logdir, 2)
    run = cli("verify", logdir)
    assert run.status == 1 and f"CORRUPT: log 2 segment {kept}" in run.out, run.out
    assert "are missing from its end" in run.out and "only older history is damaged" in run.out


def test_current_naming_an_incomplete_log_is_corruption_a_repair_fixes(logdir: str) -> None:
    from persistlog._format import encoder

    def failing(emit: object) -> None:
        raise RuntimeError("enumeration failed")

    with pytest.raises(persistlog.EnumerateError):
        persistlog.open(logdir, failing, discard_existing=True)  # leaves log 4, incomplete
    Path(logdir, "CURRENT").write_bytes(encoder.pointer(4))
    run = cli("verify", logdir)
    assert run.status == 1 and "CURRENT names log 4, which has no snapshot-complete marker" in run.out
    assert "incomplete" in cli("info", logdir).out
    # Pointing CURRENT back at the newest complete log loses nothing: no --force needed.
    repaired = cli("repair", logdir)
    assert repaired.status == 0 and "point CURRENT at log 3" in repaired.out, repaired.out
    assert cli("verify", logdir).status == 0
    assert restore_state(logdir)[1].logs == [3, 4]


def test_a_damaged_current_is_only_a_warning(logdir: str) -> None:
    flip(os.path.join(logdir, "CURRENT"), 13)
    run = cli("verify", logdir)
    assert run.status == 0 and "CURRENT is damaged" in run.out
    assert "damaged (readers search the logs)" in cli("info", logdir).out


@pytest.mark.slow
def test_verify_exit_statuses_as_a_child_process(logdir: str, tmp_path: Path) -> None:
    assert cli_subprocess("verify", logdir).status == 0
    tear_newest(logdir)
    assert cli_subprocess("verify", logdir).status == 1
    corrupt_middle(logdir, log=2)
    run = cli_subprocess("verify", logdir, "--json")
    assert run.status == 1 and json.loads(run.out)["corrupt"] == 1
    assert cli_subprocess("verify", str(tmp_path / "missing")).status == 2


@pytest.mark.slow
def test_every_command_as_a_child_process(logdir: str) -> None:
    """The JSON of each command parses when it comes through a real pipe, and the exit
    statuses reach the shell."""
    tear_newest(logdir)
    info = cli_subprocess("info", logdir, "--json")
    assert info.status == 1 and json.loads(info.out)["torn"] == 1
    dump = cli_subprocess("dump", logdir, "--json", "--log", "3")
    assert dump.status == 0 and all(json.loads(line)["log"] == 3 for line in dump.out.splitlines())
    tail = cli_subprocess("tail", logdir, "--json")
    assert tail.status == 0 and len(tail.out.splitlines()) == restore_state(logdir)[1].records
    check = cli_subprocess("restore-check", logdir, "--json")
    assert check.status == 0 and len(json.loads(check.out)["torn_tails"]) == 1
    repair = cli_subprocess("repair", logdir, "--json")
    assert repair.status == 0 and json.loads(repair.out)["clean_after"] is True
    assert cli_subprocess("verify", logdir).status == 0


# -- dump ---------------------------------------------------------------------------------


def test_dump_json_lines(logdir: str, expected: dict) -> None:
    run = cli("dump", logdir, "--json")
    assert run.status == 0, run.err
    rows = [json.loads(line) for line in run.out.splitlines()]
    assert [r["lsn"] for r in rows] == list(range(1, len(rows) + 1))  # every LSN, in order
    assert {r["kind"] for r in rows} == {"snapshot", "update"}
    assert set(rows[0]) == {"lsn", "log", "segment", "offset", "kind", "commit_time", "record"}
    # Replaying the newest log's records gives the state.
    state: dict = {}
    for r in rows:
        if r["log"] == 3:
            rec = r["record"]
            if rec["op"] == "put":
                state[rec["key"]] = rec["value"]
            else:
                state.pop(rec["key"], None)
    assert state == expected


def test_dump_selects_a_log_and_an_lsn(logdir: str) -> None:
    everything = [json.loads(line) for line in cli("dump", logdir, "--json").out.splitlines()]
    log2 = [json.loads(line) for line in cli("dump", logdir, "--json", "--log", "2").out.splitlines()]
    assert log2 == [r for r in everything if r["log"] == 2]
    cut = everything[len(everything) * 2 // 3]["lsn"]
    tail = [json.loads(line) for line in cli("dump", logdir, "--json", "--from-lsn", str(cut)).out.splitlines()]
    assert tail == [r for r in everything if r["lsn"] >= cut]
    controls = [json.loads(line) for line in cli("dump", logdir, "--json", "--log", "1", "--control").out.splitlines()]
    assert [c["record"]["t"] for c in controls if c["kind"] == "control"] == ["header", "complete", "seal"]
    missing = cli("dump", logdir, "--log", "9")
    assert missing.status == 2 and "no log 9" in missing.err


def test_dump_human_output(logdir: str) -> None:
    run = cli("dump", logdir, "--log", "3")
    first = run.out.splitlines()[0].split()
    assert first[1] == "3:0" and first[2] == "snapshot" and "UTC" in run.out


def test_dump_passes_over_corruption_and_says_so(logdir: str) -> None:
    victim = corrupt_middle(logdir, log=2)
    run = cli("dump", logdir, "--json")
    assert run.status == 1
    assert f"offset {victim.offset}" in run.err and "checksum" in run.err
    lsns = {json.loads(line)["lsn"] for line in run.out.splitlines()}
    damaged = set(range(victim.first_lsn, victim.first_lsn + victim.count))
    assert not lsns & damaged and max(lsns) > victim.first_lsn + victim.count


# -- tail ---------------------------------------------------------------------------------


def test_tail_prints_what_a_follower_sees_and_exits(logdir: str) -> None:
    run = cli("tail", logdir, "--json")
    assert run.status == 0, run.err
    rows = [json.loads(line) for line in run.out.splitlines()]
    state, result = restore_state(logdir)
    assert len(rows) == result.records and rows[-1]["lsn"] == result.last_lsn
    assert {r["log"] for r in rows} == {3}
    assert set(rows[0]) == {"lsn", "log", "segment", "cursor", "commit_time", "record"}


def test_tail_stops_at_corruption_with_status_1(logdir: str) -> None:
    victim = corrupt_middle(logdir)
    run = cli("tail", logdir, "--json")
    assert run.status == 1 and f"offset {victim.offset}" in run.err
    *rows, last = [json.loads(line) for line in run.out.splitlines()]
    lsns = [r["lsn"] for r in rows]
    assert lsns and max(lsns) < victim.first_lsn  # everything before the damage was printed
    # The error ends the JSON lines too, as one more line.
    assert last["ok"] is False and last["exit_status"] == 1 and f"offset {victim.offset}" in last["error"]


@pytest.mark.slow
def test_tail_follow_prints_new_records_until_interrupted(logdir: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "persistlog", "tail", "-f", logdir, "--json", "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        kv = KV()
        lg = persistlog.open(logdir, kv.enumerate_all, replay=kv.apply)
        try:
            lsn = kv.put(lg, "arrived", "later")
            lg.sync()
        finally:
            lg.close()
        stdout = StdoutLines(proc)
        deadline = time.monotonic() + 20
        seen = None
        while time.monotonic() < deadline:
            line = stdout.readline()
            if not line:
                break
            row = json.loads(line)
            if row["lsn"] == lsn:
                seen = row
                break
        assert seen is not None and seen["record"] == {"op": "put", "key": "arrived", "value": "later"}
        proc.send_signal(signal.SIGINT)
        rest, err = stdout.communicate(timeout=20)
        assert proc.returncode == 130
        # The stop message names the last line written and its cursor, and says a consumer
        # resumes from the cursor of the last line it finished instead.
        last = json.loads(rest.splitlines()[-1]) if rest.strip() else seen
        assert f"stopped after LSN {last['lsn']}, the last record written to stdout" in err
        assert f"--cursor {last['cursor']} resumes right after it" in err and "that line's cursor" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- repair -------------------------------------------------------------------------------


def test_repair_truncates_a_torn_tail_and_keeps_every_intact_record(logdir: str) -> None:
    segment, offset = tear_newest(logdir)
    before_state, before = restore_state(logdir)
    assert before.torn_tail is not None

    dry = cli("repair", logdir, "--dry-run")
    assert dry.status == 0 and "dry run: nothing changed" in dry.out
    assert not os.path.exists(os.path.join(logdir, "broken"))

    run = cli("repair", logdir)
    assert run.status == 0, run.out + run.err
    assert "repaired: verify is clean" in run.out
    assert os.path.getsize(os.path.join(logdir, segment)) == offset
    (copy,) = os.listdir(os.path.join(logdir, "broken"))
    assert copy.startswith(segment + ".")
    assert cli("verify", logdir).status == 0

    after_state, after = restore_state(logdir)
    assert after_state == before_state and after.records == before.records and after.torn_tail is None
    # A writer carries on from where the repair left the log.
    kv = KV()
    kv.data = dict(after_state)
    lg = persistlog.open(logdir, kv.enumerate_all)
    lg.close()
    assert cli("verify", logdir).status == 0


def test_repair_refuses_corruption_without_force(logdir: str) -> None:
    corrupt_middle(logdir)
    digest = tree_digest(logdir)
    for argv in (("repair", logdir), ("repair", logdir, "--dry-run")):
        run = cli(*argv)
        assert run.status == 1
        assert "[FORCE]" in run.out and "cost:" in run.out and "records" in run.out
    assert "refused" in cli("repair", logdir).out
    assert tree_digest(logdir) == digest  # nothing changed

    plan = json.loads(cli("repair", logdir, "--json").out)
    assert plan["refused"] is True and plan["plan"]["needs_force"] is True
    assert plan["plan"]["records_lost"] > 0 and plan["plan"]["bytes_lost"] > 0


def test_forced_repair_keeps_every_record_before_the_damage(logdir: str) -> None:
    everything = [json.loads(line) for line in cli("dump", logdir, "--json").out.splitlines()]
    victim = corrupt_middle(logdir)  # in log 3, the one restore starts from
    run = cli("repair", logdir, "--force", "--json")
    assert run.status == 0, run.out + run.err
    result = json.loads(run.out)
    assert result["done"] is True and result["clean_after"] is True
    assert result["plan"]["lost_from_lsn"] == victim.first_lsn
    assert cli("verify", logdir).status == 0

    kept = [json.loads(line) for line in cli("dump", logdir, "--json").out.splitlines()]
    assert kept == [r for r in everything if r["lsn"] < victim.first_lsn]
    state, restored = restore_state(logdir)
    assert restored.last_lsn == victim.first_lsn - 1
    assert len(os.listdir(os.path.join(logdir, "broken"))) >= 1


def test_forced_repair_of_old_history_leaves_the_state_alone(logdir: str, expected: dict) -> None:
    corrupt_middle(logdir, log=1)
    state, _ = restore_state(logdir)  # restore starts at log 3: unaffected
    assert state == expected
    plan = json.loads(cli("repair", logdir, "--dry-run", "--json").out)["plan"]
    assert [(a["kind"], a["log"]) for a in plan["actions"]] == [("move-log", 1)]
    assert cli("repair", logdir, "--force").status == 0
    assert cli("verify", logdir).status == 0
    assert restore_state(logdir)[0] == expected
    assert not any(n.startswith("00000000000000000001-") for n in os.listdir(logdir))


def test_forced_repair_that_removes_the_complete_marker_moves_current_back(logdir: str, expected: dict) -> None:
    # Damage inside log 3's enumeration: log 3 loses its complete marker, so restore must
    # start from log 2 again, and CURRENT must say so.
    first_snapshot = next(b for b in batches(logdir) if b.log == 3 and b.control is None)
    flip(os.path.join(logdir, first_snapshot.segment), first_snapshot.offset + 45)
    run = cli("repair", logdir, "--force", "--json")
    assert run.status == 0, run.out
    result = json.loads(run.out)
    assert result["plan"]["restore_from"] == 2
    assert any(a["kind"] == "write-current" and a["target"] == 2 for a in result["plan"]["actions"])
    info = json.loads(cli("info", logdir, "--json").out)
    assert info["current"] == 2 and info["restore_from"] == 2
    state, restored = restore_state(logdir)
    assert restored.complete and restored.logs[0] == 2


def test_repair_waits_for_no_writer(logdir: str) -> None:
    tear_newest(logdir)
    kv = KV()
    lg = persistlog.open(logdir, kv.enumerate_all, replay=kv.apply)
    try:
        run = cli("repair", logdir)
        assert run.status == 2 and "live writer" in run.err
    finally:
        lg.close()


def test_repair_is_for_local_destinations_only(clean_memory_fs: None) -> None:
    url = "memory://cli-tests/repair-remote"
    kv = KV()
    lg = persistlog.open(url, kv.enumerate_all)
    kv.put(lg, "a", 1)
    lg.close()
    run = cli("repair", url)
    assert run.status == 2 and "local destinations only" in run.err and "nothing is ever torn" in run.err
    assert cli("verify", url).status == 0 and cli("info", url, "--json").status == 0


# -- restore-check --------------------------------------------------------------------------


def test_restore_check_counts_records_and_keys(logdir: str, expected: dict) -> None:
    run = cli("restore-check", logdir)
    assert run.status == 0, run.err
    assert f"keys live        {len(expected)}" in run.out
    data = json.loads(cli("restore-check", logdir, "--json").out)
    _, result = restore_state(logdir)
    assert data["keys"] == len(expected) and data["records"] == result.records
    assert data["logs"] == [3] and data["last_lsn"] == result.last_lsn and data["complete"] is True
    assert data["resource_store"] is True and data["seconds"] >= 0


def test_restore_check_on_damage(logdir: str) -> None:
    tear_newest(logdir)
    data = json.loads(cli("restore-check", logdir, "--json").out)
    assert len(data["torn_tails"]) == 1  # dropped, as a restore drops it: still exit 0
    assert cli("restore-check", logdir).status == 0
    corrupt_middle(logdir)
    run = cli("restore-check", logdir)
    assert run.status == 1 and "restore failed" in run.err and "checksum" in run.err
    skipped = cli("restore-check", logdir, "--recovery", "skip", "--json")
    assert skipped.status == 1 and len(json.loads(skipped.out)["skipped"]) >= 1


def test_restore_check_of_records_in_another_shape(tmp_path: Path) -> None:
    url = str(tmp_path / "events")
    lg = persistlog.open(url, lambda emit: None)
    lg.update_many([["event", i] for i in range(10)])
    lg.close()
    data = json.loads(cli("restore-check", url, "--json").out)
    assert data["records"] == 10 and data["keys"] is None and data["resource_store"] is False


# -- progress -------------------------------------------------------------------------------


def test_progress_line_only_on_a_terminal() -> None:
    import io

    from persistlog.cli._console import ProgressLine

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        line = ProgressLine("verify", stream=stream)
        line.update("segment 1/3", force=True)
        line.done()
    assert "\rverify: segment 1/3" in tty.getvalue() and pipe.getvalue() == ""


# -- object stores ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.s3
def test_commands_reach_s3_through_storage_options(s3_bucket: str, s3_storage_options: dict) -> None:
    url = f"s3://{s3_bucket}/app"
    kv = KV()
    lg = persistlog.open(url, kv.enumerate_all, storage_options=s3_storage_options)
    for i in range(30):
        kv.put(lg, f"k{i}", i)
    lg.sync()
    lg.close()
    endpoint = s3_storage_options["client_kwargs"]["endpoint_url"]
    options = ["-o", "key=testing", "-o", "secret=testing", "-o", f'client_kwargs={{"endpoint_url": "{endpoint}"}}']
    info = json.loads(cli("info", url, *options, "--json").out)
    assert info["appendable"] is False and info["logs"][0]["records"] == 30
    assert cli("verify", url, *options).status == 0
    rows = cli("dump", url, *options, "--json").out.splitlines()
    assert len(rows) == 30
    assert json.loads(cli("restore-check", url, *options, "--json").out)["keys"] == 30
    assert json.loads(cli("tail", url, *options, "--json").out.splitlines()[-1])["record"]["key"] == "k29"
    repair = cli("repair", url, *options)
    assert repair.status == 2 and "local destinations only" in repair.err

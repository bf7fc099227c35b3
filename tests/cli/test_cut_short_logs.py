"""Logs cut short, and what the tools say about them.

A torn tail is the unfinished last batch of a log that was never sealed, where nothing says
more was written. A log that ends before the next log starts lost its end: that is damage,
with the records the next log's first LSN says are missing, and repair refuses it.
"""

from __future__ import annotations

import json
import os

import persistlog
import pytest
from cli_logs import KV, batches, cli, tear_newest, tree_digest
from kv_app import restore_state


def cut_end(logdir: str, seq: int, into_last: int = 20) -> str:
    """Cut the end of log ``seq``'s last segment off: its trailer, its seal and the last
    ``into_last`` bytes of its last batch; returns that segment's name."""
    seal = next(b for b in batches(logdir) if b.log == seq and b.control == "seal")
    os.truncate(os.path.join(logdir, seal.segment), seal.offset - into_last)
    return seal.segment


def test_a_sealed_log_cut_short_before_the_next_is_damage_not_a_torn_tail(logdir: str, expected: dict[str, object]) -> None:
    everything = batches(logdir)
    name = cut_end(logdir, 2)
    size = os.path.getsize(os.path.join(logdir, name))
    cut = next(b for b in everything if b.segment == name and b.offset < size < b.offset + b.size)
    log3 = next(b for b in everything if b.log == 3)
    missing = log3.first_lsn - cut.first_lsn
    assert missing == cut.count > 0

    run = cli("verify", logdir)
    assert run.status == 1
    assert "TORN TAIL" not in run.out and "left by a crash" not in run.out
    assert f"CORRUPT: log 2 segment {name} offset {cut.offset}" in run.out
    assert f"LSNs {cut.first_lsn}..{log3.first_lsn - 1} ({missing} records) are missing from its end" in run.out
    data = json.loads(cli("verify", logdir, "--json", "--torn-ok").out)
    assert data["ok"] is False and data["torn"] == 0 and data["corrupt"] == 1
    assert data["problems"][0]["records_lost"] == missing

    info = cli("info", logdir)
    assert info.status == 1 and "1 corruption" in info.out

    # A restore starts at log 3 and never reads log 2: the state is whole; repair says that
    # only history goes, and refuses without --force.
    assert restore_state(logdir)[0] == expected
    digest = tree_digest(logdir)
    refused = cli("repair", logdir)
    assert refused.status == 1 and "refused" in refused.out and "nothing acknowledged is lost" not in refused.out
    assert f"plus {missing} records in the damage" in refused.out
    assert tree_digest(logdir) == digest
    plan = json.loads(cli("repair", logdir, "--dry-run", "--json").out)["plan"]
    assert [(a["kind"], a["log"]) for a in plan["actions"]] == [("move-log", 1), ("move-log", 2)]
    assert plan["damaged_records"] == missing and plan["restore_from"] == 3
    assert cli("repair", logdir, "--force").status == 0
    assert cli("verify", logdir).status == 0 and restore_state(logdir)[0] == expected


def test_a_restore_that_reads_a_log_cut_short_refuses_it(logdir: str) -> None:
    """When a restore has to read the log that lost its end, strict mode raises
    CorruptLogError there and skip mode lists it: neither calls it a torn tail."""
    from persistlog._format import encoder

    name = cut_end(logdir, 2)
    with open(os.path.join(logdir, "CURRENT"), "wb") as f:
        f.write(encoder.pointer(2))
    torn_at = json.loads(cli("verify", logdir, "--json").out)["problems"][0]["offset"]
    with pytest.raises(persistlog.CorruptLogError) as info:
        restore_state(logdir)
    err = info.value
    assert (err.log, err.segment, err.offset) == (2, name, torn_at) and "missing from its end" in str(err)
    result = persistlog.restore(logdir, lambda r: None, recovery="skip")
    assert not result.torn_tails
    assert [(s.log, s.segment, s.offset) for s in result.skipped] == [(2, name, torn_at)]
    check = cli("restore-check", logdir)
    assert check.status == 1 and "missing from its end" in check.err


def test_a_sealed_newest_log_cut_inside_its_last_batch_is_damage_with_its_cost(logdir: str) -> None:
    """A clean close sealed the newest log and said so (CLOSED): cut inside its last batch
    later, it lost acknowledged records. Damage, with the records it costs, never a
    crash's torn tail; repair refuses and restore raises."""
    everything = batches(logdir)
    name = cut_end(logdir, 3)
    size = os.path.getsize(os.path.join(logdir, name))
    cut = next(b for b in everything if b.segment == name and b.offset < size < b.offset + b.size)
    last = max(b.first_lsn + b.count - 1 for b in everything)

    run = cli("verify", logdir)
    assert run.status == 1 and f"CORRUPT: log 3 segment {name} offset {cut.offset}" in run.out, run.out
    assert "the clean close that sealed it says it ends before" in run.out and "TORN TAIL" not in run.out
    dry = cli("repair", logdir, "--dry-run")
    assert "refused: this is corruption, not a torn tail" in dry.out and "nothing acknowledged is lost" not in dry.out
    assert cli("info", logdir).status == 1
    with pytest.raises(persistlog.CorruptLogError, match=f"missing from its end"):
        restore_state(logdir)
    assert last >= cut.first_lsn


def test_a_torn_newest_log_without_a_clean_close_is_a_torn_tail_and_repair_names_what_it_drops(logdir: str) -> None:
    """The newest log cut inside its last batch, with nothing saying it was closed (a
    crash, or a log from before CLOSED was written): exactly what a crash leaves. The tools
    say what they know: the unfinished batch's LSNs, which a restore drops too, and not
    that it was left by a crash or that nothing acknowledged is lost."""
    os.remove(os.path.join(logdir, "CLOSED"))
    everything = batches(logdir)
    name = cut_end(logdir, 3)
    size = os.path.getsize(os.path.join(logdir, name))
    cut = next(b for b in everything if b.segment == name and b.offset < size < b.offset + b.size)

    run = cli("verify", logdir)
    assert run.status == 1 and f"TORN TAIL: log 3 segment {name} offset {cut.offset}" in run.out
    assert "left by a crash" not in run.out and "looks the same" in run.out
    dry = cli("repair", logdir, "--dry-run")
    assert dry.status == 0 and "nothing acknowledged is lost" not in dry.out
    last = cut.first_lsn + cut.count - 1
    assert f"drops an unfinished batch of LSNs {cut.first_lsn}..{last}, which a restore drops too" in dry.out
    assert f"cost: 0 records in intact batches, plus {cut.count} records in the damage" in dry.out
    _, result = restore_state(logdir)
    assert result.last_lsn == cut.first_lsn - 1


def test_a_crashed_log_a_later_writer_continued_keeps_its_torn_tail(logdir: str, expected: dict[str, object]) -> None:
    """A crash leaves the log unsealed and torn; the next writer starts its log where the
    intact part ends. Nothing is missing: that torn tail stays a torn tail."""
    tear_newest(logdir)
    kv = KV()
    lg = persistlog.open(logdir, kv.enumerate_all, replay=kv.apply)
    kv.put(lg, "after", "crash")
    lg.close()
    run = cli("verify", logdir)
    assert run.status == 1 and "TORN TAIL: log 3" in run.out and "CORRUPT" not in run.out, run.out
    assert cli("verify", logdir, "--torn-ok").status == 0
    assert cli("repair", logdir).status == 0 and cli("verify", logdir).status == 0

"""``persistlog tail`` cursors: every record carries the cursor that resumes right after it,
so that a consumer reading a pipe resumes after the last line *it* finished (exactly once,
no gap, no duplicate); ``tail -f`` says what its own stop cursor means; a cursor that does
not point at a batch is a bad cursor (exit 2), not damage."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from childproc import StdoutLines
from cli_logs import batches, cli

import persistlog
from persistlog._format import constants as F

RECORDS = 2000


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sealed log of 2,000 records in batches of up to 37 (so most records sit inside
    a batch, not at its end) over several segments."""
    url = str(tmp_path_factory.mktemp("many") / "log")
    lg = persistlog.open(url, lambda emit: None, segment_bytes=16384, rotate_bytes=None)
    for i in range(RECORDS):
        lg.update({"n": i, "pad": "p" * (i % 50)})
        if i % 37 == 36:
            lg.sync()
    lg.close()
    return url


# A consumer that takes its time over each line and saves the cursor of every line it has
# finished; after N lines it stops reading (closing the pipe) or waits to be interrupted.
CONSUMER = textwrap.dedent(
    """
    import json, os, sys, time
    n, saved, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    done = 0
    try:
        for line in sys.stdin:
            row = json.loads(line)
            time.sleep(0.001)                       # the slow part: processing the record
            with open(saved + ".tmp", "w") as f:    # then: this line is finished
                f.write(row["cursor"])
            os.replace(saved + ".tmp", saved)
            done += 1
            if done == n:
                break
        if mode == "interrupted":
            print("ready", flush=True, file=sys.stderr)
            time.sleep(60)
    except KeyboardInterrupt:
        pass
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["closed", "interrupted"])
def test_a_slow_consumer_resumes_after_the_last_line_it_finished(many: str, tmp_path: Path, mode: str) -> None:
    """``tail -f --json | consumer``: the consumer gets 739 of 2,000 lines before it stops;
    restarting tail from the cursor it saved gives exactly LSN 740..2000."""
    saved = str(tmp_path / "consumer.cursor")
    tail = subprocess.Popen(
        [sys.executable, "-m", "persistlog", "tail", "-f", many, "--json", "--interval", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    consumer = subprocess.Popen(
        [sys.executable, "-c", CONSUMER, "739", saved, mode], stdin=tail.stdout, stderr=subprocess.PIPE, text=True
    )
    assert tail.stdout is not None and consumer.stderr is not None
    tail.stdout.close()  # the consumer holds the pipe's only read end
    try:
        if mode == "interrupted":
            assert consumer.stderr.readline().strip() == "ready"
            # Ctrl-C reaches both ends of the pipe.
            consumer.send_signal(signal.SIGINT)
            tail.send_signal(signal.SIGINT)
        consumer.wait(timeout=30)
        try:
            tail.wait(timeout=10)  # a write into the closed pipe ends it
        except subprocess.TimeoutExpired:
            tail.send_signal(signal.SIGINT)  # everything fitted in the pipe: tail was idle
        _, err = tail.communicate(timeout=30)
    finally:
        for proc in (tail, consumer):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    message = err.decode()
    assert "stopped" in message and "last line" in message, message
    # Tail wrote far more into the pipe than the consumer took: it says it cannot tell
    # where the consumer stopped, rather than offering a cursor past it.
    assert "stdout was closed by its reader" in message and "resumes right after" not in message, message
    cursor = Path(saved).read_text()

    rest = cli("tail", many, "--cursor", cursor, "--json")
    assert rest.status == 0, rest.err
    lsns = [json.loads(line)["lsn"] for line in rest.out.splitlines()]
    assert lsns == list(range(740, RECORDS + 1))


@pytest.mark.slow
def test_every_record_cursor_resumes_right_after_its_record(logdir: str) -> None:
    """Across batches, segments, sealed logs and enumerations: resuming from the cursor of
    line k gives lines k+1.. exactly, in JSON and in the text form of --with-cursor."""
    everything = cli("tail", logdir, "--cursor", "1:0:0:1", "--json")
    assert everything.status == 0, everything.err
    rows = [json.loads(line) for line in everything.out.splitlines()]
    assert [r["lsn"] for r in rows] == list(range(1, len(rows) + 1)) and {r["log"] for r in rows} == {1, 2, 3}
    ends = {b.first_lsn + b.count - 1 for b in batches(logdir) if b.control is None}
    inside = [k for k, r in enumerate(rows) if r["lsn"] not in ends]
    at_end = [k for k, r in enumerate(rows) if r["lsn"] in ends]
    assert len(inside) > 100 and len(at_end) > 10
    for k in inside[::40] + at_end[::10] + [len(rows) - 1]:
        rest = cli("tail", logdir, "--cursor", rows[k]["cursor"], "--json")
        assert rest.status == 0, (rows[k], rest.err)
        assert [json.loads(line) for line in rest.out.splitlines()] == rows[k + 1:], rows[k]

    text = cli("tail", logdir, "--cursor", "1:0:0:1", "--with-cursor").out.splitlines()
    assert [line.split()[0] for line in text] == [r["cursor"] for r in rows]
    k = inside[len(inside) // 2]
    rest = cli("tail", logdir, "--cursor", text[k].split()[0], "--with-cursor")
    assert rest.out.splitlines() == text[k + 1:]


@pytest.mark.slow
def test_the_stop_message_names_the_last_line_written_and_what_it_means(logdir: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "persistlog", "tail", "-f", logdir, "--with-cursor", "--interval", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        stdout = StdoutLines(proc)
        deadline = time.monotonic() + 20
        lines: list[str] = []
        while time.monotonic() < deadline and len(lines) < 5:
            lines.append(stdout.readline())
        proc.send_signal(signal.SIGINT)
        rest, err = stdout.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    last = (lines + rest.splitlines())[-1].split()
    cursor, lsn = last[0], last[1]
    assert f"stopped after LSN {lsn}, the last record written to stdout: --cursor {cursor} resumes" in err
    assert "Lines still in a pipe had not reached the consumer" in err


def test_a_cursor_off_a_batch_boundary_is_a_bad_cursor(logdir: str) -> None:
    """A clean log and a cursor that points into the middle of a batch: a usage error that
    says so and where the batches are, not "corrupt" (verify says the log is clean)."""
    log1 = [b for b in batches(logdir) if b.log == 1 and b.segment.endswith("0000000000.plog")]
    first, second = log1[0], log1[1]
    inside = first.offset + 60
    run = cli("tail", logdir, "--cursor", f"1:0:{inside}:5")
    assert run.status == 2, run.err
    assert "not a batch boundary" in run.err and "corrupt" not in run.err
    assert f"the nearest boundaries are at offsets {first.offset} and {second.offset}" in run.err
    assert cli("verify", logdir).status == 0

    data = json.loads(cli("tail", logdir, "--cursor", f"1:0:{inside}:5", "--json", "-f").out)
    assert data["ok"] is False and data["exit_status"] == 2 and "not a batch boundary" in data["error"]

    # At a batch, with an LSN the batch does not hold: a bad cursor too.
    app = next(b for b in log1 if b.control is None and b.count > 1)
    wrong = cli("tail", logdir, "--cursor", f"1:0:{app.offset}:{app.first_lsn + app.count + 5}")
    assert wrong.status == 2 and f"holds LSNs {app.first_lsn}..{app.first_lsn + app.count - 1}" in wrong.err


def test_a_follower_resumes_inside_a_batch(logdir: str) -> None:
    """The library follower takes a record's cursor too: it skips the batch's records
    before it, iterating and replaying alike."""
    app = next(b for b in batches(logdir) if b.log == 2 and b.control is None and b.count > 3)
    segment = F.parse_segment_name(app.segment)
    assert segment is not None
    inside = persistlog.Cursor(2, segment[1], app.offset, app.first_lsn + 2)

    follower = persistlog.follow(logdir, cursor=str(inside))
    first = next(iter(follower))
    follower.stop()
    assert first.first_lsn == app.first_lsn + 2 and len(first.records) == app.count - 2
    assert first.record_cursor(first.first_lsn) == persistlog.Cursor(inside.log, inside.segment, app.offset, app.first_lsn + 3)

    got: list[object] = []
    follower = persistlog.follow(logdir, got.append, cursor=inside)
    follower.poll()
    follower.stop()
    expected = [json.loads(line)["record"] for line in cli("dump", logdir, "--json", "--from-lsn", str(app.first_lsn + 2)).out.splitlines()]
    assert [persistlog_json(r) for r in got] == expected


def persistlog_json(record: object) -> object:
    from persistlog._format.jsonify import to_json

    return json.loads(to_json(record))

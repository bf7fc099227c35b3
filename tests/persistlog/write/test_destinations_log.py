"""The log's behaviour on every destination driver.

One suite, parametrised over a local directory, ``memory://`` and ``s3://`` on a real moto
server: write, rotate, retain, restore equals the model, two-writer conflict, close/reopen
continuity, torn tails (local) and corruption (everywhere). Then S3 specifics through the
real server: a killed writer's lease expires and a new writer takes over; restore from a
secondary once the primary is gone; 5xx answers, dropped connections and delays injected by
a proxy in front of moto (and by ``faulty://``) are retried, in order, losing nothing
acknowledged.
"""

from __future__ import annotations

import errno
import http.client
import http.server
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from batches import batch_spans
from faults import FaultPlan

import persistlog
from child_scripts import PROCS, child_env
from kv_app import App, apply, restore_state
from threads import wait_until
from destinations import open_destination

BATCH_HEADER = 40


# -- helpers ------------------------------------------------------------------------------




class RecordingApp(App):
    """The test app; ``ops`` is every update record in the order ``update()`` returned."""

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        super().__init__(state)
        self.ops: list[dict[str, Any]] = []
        self.acked: list[dict[str, Any]] = []  # updates that returned from update(sync=True) or sync()

    def update(self, record: dict[str, Any], sync: bool = False) -> int:
        assert self.log is not None
        lsn = self.log.update(record, sync=sync)
        self.ops.append(record)
        apply(self.data, record)
        if sync:
            self.acked = list(self.ops)
        return lsn

    def churn(self, count: int, keys: int = 25, sync_every: int = 0) -> None:
        for i in range(count):
            n = len(self.ops)
            if n % 4 == 3:
                rec: dict[str, Any] = {"op": "del", "key": f"k{(n * 7) % keys}"}
            else:
                rec = {"op": "put", "key": f"k{n % keys}", "value": [n, "v" * (n % 23)]}
            self.update(rec, sync=bool(sync_every) and i % sync_every == 0)

    def sync(self) -> None:
        assert self.log is not None
        self.log.sync()
        self.acked = list(self.ops)


@dataclass
class Where:
    kind: str
    url: str
    so: dict[str, Any] | None = None

    @property
    def open_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"storage_options": self.so}
        if self.kind != "local":
            opts["flush_interval"] = 0.02 if self.kind == "memory" else 0.05
        return opts

    def dest(self) -> Any:
        return open_destination(self.url, **(self.so or {}))

    def segments(self) -> list[str]:
        return [n for n in self.dest().list() if n.endswith(".plog")]

    def log_seqs(self) -> list[int]:
        return sorted({int(n[:20]) for n in self.segments()})

    def restore(self, **kw: Any) -> tuple[dict[str, Any], persistlog.RestoreResult]:
        return restore_state(self.url, storage_options=self.so, **kw)

    def records(self) -> list[Any]:
        out: list[Any] = []
        persistlog.restore(self.url, out.append, storage_options=self.so)
        return out

    def sibling(self, name: str) -> Where:
        return Where(self.kind, self.url.rsplit("/", 1)[0] + "/" + name, self.so)


def make_where(kind: str, request: pytest.FixtureRequest, tmp_path: Path, name: str = "log") -> Where:
    if kind == "local":
        return Where(kind, str(tmp_path / name))
    if kind == "memory":
        request.getfixturevalue("clean_memory_fs")
        return Where(kind, f"memory://d{uuid.uuid4().hex[:10]}/{name}")
    bucket = request.getfixturevalue("s3_bucket")
    return Where(kind, f"s3://{bucket}/app/{name}", request.getfixturevalue("s3_storage_options"))


@pytest.fixture(params=["local", "memory", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    return make_where(request.param, request, tmp_path)




def is_complete(where: Where, seq: int) -> bool:
    """Whether log ``seq`` holds its snapshot-complete marker: restoring from a copy of
    the destination holding only that log says so."""
    src = where.dest()
    copy = where.sibling(f"probe-{uuid.uuid4().hex[:6]}")
    dst = copy.dest()
    dst.ensure()
    for n in where.segments():
        if int(n[:20]) == seq:
            dst.create(n, src.read(n))
    return copy.restore()[1].complete


# -- the behaviour suite ----------------------------------------------------------------


@pytest.mark.slow
def test_write_then_restore_equals_the_model(where: Where) -> None:
    app = RecordingApp()
    lg = app.open(where.url, **where.open_options)
    app.churn(300, sync_every=25)
    lg.sync()
    assert where.restore()[0] == app.data  # while the writer is open
    app.churn(40)
    next_lsn = lg.next_lsn
    lg.close()
    state, result = where.restore()
    assert state == app.data
    assert result.found and result.complete and result.next_lsn == next_lsn and result.torn_tails == []
    # The records come back exactly in update() order (one log: no rotation yet).
    assert where.records() == app.ops


@pytest.mark.slow
@pytest.mark.parametrize("retain", [1, 2])
def test_rotation_and_retention_keep_retain_complete_logs(where: Where, retain: int) -> None:
    app = RecordingApp()
    lg = app.open(where.url, retain=retain, segment_bytes=4096, **where.open_options)
    seqs = [lg.seq]
    for r in range(5):
        app.churn(80)
        seqs.append(lg.rotate())
        assert seqs[-1] == seqs[-2] + 1
        assert lg.stats()["complete_logs"][-1] == seqs[-1]
        # Retention may finish in the background.
        wait_until(lambda: where.log_seqs() == seqs[-retain:], 10, lambda: f"{where.log_seqs()} vs {seqs}")
        assert where.restore()[0] == app.data
    app.churn(30)
    lg.close()
    assert where.log_seqs() == seqs[-retain:]
    assert all(is_complete(where, s) for s in seqs[-retain:])
    assert where.restore()[0] == app.data
    assert where.restore()[1].logs == [seqs[-1]]


@pytest.mark.slow
def test_second_writer_gets_writer_conflict_and_first_is_unharmed(where: Where) -> None:
    app = RecordingApp()
    lg = app.open(where.url, **where.open_options)
    app.churn(50)
    with pytest.raises(persistlog.WriterConflict) as e:
        persistlog.open(where.url, lambda emit: None, **where.open_options)
    assert lg.writer_id in str(e.value)
    app.churn(50)
    app.sync()
    assert lg.failed is None
    lg.close()
    assert where.restore()[0] == app.data
    # Closed: the next writer gets in.
    again = RecordingApp(where.restore()[0])
    again.open(where.url, **where.open_options).close()
    assert where.restore()[0] == app.data


@pytest.mark.slow
def test_close_and_reopen_continue_the_chain(where: Where) -> None:
    app = RecordingApp()
    lg = app.open(where.url, retain=2, **where.open_options)
    app.churn(60)
    lg.close()
    seq, next_lsn = lg.seq, lg.next_lsn
    for restart in range(4):
        state, result = where.restore()
        assert state == app.data and result.next_lsn == next_lsn
        app = RecordingApp(state)  # a new process: restore, then open
        lg = app.open(where.url, retain=2, **where.open_options)
        assert lg.seq == seq + 1
        # The new log's enumeration took the LSNs right after the old log's last.
        assert lg.next_lsn == next_lsn + len(state)
        app.churn(40 + restart)
        lg.close()
        seq, next_lsn = lg.seq, lg.next_lsn
    # retain counts the complete logs that earlier processes left.
    assert where.log_seqs() == [seq - 1, seq]
    assert where.restore()[0] == app.data


def _copy_log(src: Where, dst: Where) -> None:
    s, d = src.dest(), dst.dest()
    d.ensure()
    for n in src.segments():
        d.create(n, s.read(n))


def _rewrite(where: Where, name: str, data: bytes) -> None:
    d = where.dest()
    d.delete(name)
    d.create(name, data)


@pytest.mark.slow
def test_torn_tails_and_corruption(where: Where) -> None:
    """A crash leaves a torn tail only where segments grow by append (local): dropped and
    reported. An object is written whole, so a short one is corruption. Damage anywhere
    else raises CorruptLogError naming the segment and offset."""
    app = RecordingApp()
    lg = app.open(where.url, durability="flush", storage_options=where.so, flush_interval=30)
    app.churn(40)
    lg.sync()
    crashed = where.sibling("crashed")
    _copy_log(where, crashed)  # the log as a crash would leave it: unsealed
    lg.close()
    state, result = crashed.restore()
    assert state == app.data and result.torn_tails == []

    names = crashed.segments()
    last = names[-1]
    data = crashed.dest().read(last)
    spans = batch_spans(data)
    if where.kind == "local":
        start, end = spans[-1]
        _rewrite(crashed, last, data + data[start: start + 25])  # a batch header cut short
        state, result = crashed.restore()
        assert state == app.data
        assert [(t.segment, t.offset, t.length) for t in result.torn_tails] == [(last, len(data), 25)]
        _rewrite(crashed, last, data[: end - 3])  # the last batch's payload cut short
        state, result = crashed.restore()
        assert state == _replay(app.ops[:-1])
        assert [(t.segment, t.offset) for t in result.torn_tails] == [(last, start)]
    else:
        _rewrite(crashed, last, data[:-3])
        with pytest.raises(persistlog.CorruptLogError) as e:
            crashed.restore()
        assert e.value.segment == last
    _rewrite(crashed, last, data)

    # A flipped bit in a batch that is not the last: corruption, wherever it is.
    biggest = max(names, key=lambda n: len(crashed.dest().read(n)))
    big = bytearray(crashed.dest().read(biggest))
    start, _ = batch_spans(bytes(big))[0]
    big[start + BATCH_HEADER + 2] ^= 0x10
    _rewrite(crashed, biggest, bytes(big))
    with pytest.raises(persistlog.CorruptLogError) as e:
        crashed.restore()
    assert e.value.segment == biggest and e.value.offset == start
    assert crashed.url in str(e.value)


def _replay(ops: list[dict[str, Any]]) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for r in ops:
        apply(state, r)
    return state


def test_primary_write_failure_is_raised_and_acknowledged_records_survive(clean_memory_fs: None) -> None:
    """A permanent failure of the primary is the app's to see (not retried, not hidden);
    what was acknowledged before it is restorable, and restore yields a prefix."""
    plan = FaultPlan()
    url = f"faulty://p{uuid.uuid4().hex[:8]}/log"
    so = {"target_protocol": "memory", "faults": plan}
    app = RecordingApp()
    lg = app.open(url, storage_options=so, flush_interval=30)
    app.churn(30, sync_every=5)
    plan.fail("pipe_file", nth=plan.calls["pipe_file"] + 3, error=errno.ENOSPC, times=10**6)
    with pytest.raises(persistlog.LogFailedError) as e:
        for _ in range(100):
            app.churn(1, sync_every=1)
    assert "No space left" in str(e.value.__cause__) or e.value.__cause__.errno == errno.ENOSPC  # type: ignore[union-attr]
    assert lg.failed is not None
    with pytest.raises(persistlog.LogFailedError):
        lg.update({"op": "put", "key": "x", "value": 1})
    with pytest.raises(persistlog.LogFailedError, match="not known to be durable"):
        lg.close()  # the failed call's record was accepted, and is not there
    records: list[Any] = []
    persistlog.restore(url, records.append, storage_options={"target_protocol": "memory"})
    assert records == app.ops[: len(records)]  # a prefix, in order...
    assert len(records) >= len(app.acked)  # ...holding everything acknowledged


# -- S3 on the real moto server --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.s3
def test_s3_lease_of_a_killed_writer_expires_then_a_new_writer_takes_over(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    where = make_where("s3", request, tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    cfg = {
        "url": where.url, "storage_options": where.so, "seed": 5, "ops": 60, "sync_every": 1,
        "open": {"lease_ttl": 2, "flush_interval": 0.05}, "hold": True,
        "progress": str(run / "progress"), "result": str(run / "result"),
    }
    stderr = open(run / "stderr", "wb")
    child = subprocess.Popen([sys.executable, str(PROCS / "writer.py"), json.dumps(cfg)],
                             stdout=subprocess.DEVNULL, stderr=stderr, env=child_env())
    try:
        def held() -> bool:
            assert child.poll() is None, (run / "stderr").read_text()
            return (run / "result").exists()

        wait_until(held, 60, "the writer process to finish its operations")
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        killed_at = time.monotonic()
    finally:
        if child.poll() is None:
            child.kill()
        stderr.close()
    written = json.loads((run / "result").read_text())
    # The dead writer never released its lease: an immediate open conflicts...
    with pytest.raises(persistlog.WriterConflict):
        persistlog.open(where.url, lambda emit: None, storage_options=where.so)
    # ...and once the lease (2 s, renewed every 2/3 s) has expired, a new writer takes over.
    state, result = where.restore()
    assert state == written["state"] and result.next_lsn == written["next_lsn"]
    app = RecordingApp(state)

    def take_over() -> persistlog.Log | None:
        try:
            return app.open(where.url, storage_options=where.so, flush_interval=0.05)
        except persistlog.WriterConflict:
            return None

    lg = wait_until(take_over, 20, "the dead writer's lease to expire")
    assert time.monotonic() - killed_at < 15
    assert lg.next_lsn == written["next_lsn"] + len(state)
    app.churn(20)
    lg.close()
    assert where.restore()[0] == app.data


@pytest.mark.slow
@pytest.mark.parametrize("secondary_kind", ["memory", "s3", "local"])
def test_restore_from_a_secondary_after_the_primary_is_deleted(
    secondary_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    primary = tmp_path / "primary"
    sec = make_where(secondary_kind, request, tmp_path, name="secondary")
    app = RecordingApp()
    lg = app.open(str(primary), secondaries=[(sec.url, sec.so or {})], retain=2, segment_bytes=4096)
    for _ in range(3):
        app.churn(100)
        lg.rotate()
    app.churn(25)
    lg.close()
    shutil.rmtree(primary)
    state, result = sec.restore()
    assert state == app.data and result.complete
    assert persistlog.restore(str(primary), lambda r: None).found is False
    # The secondary can become the primary: restore, then open.
    app2 = RecordingApp(state)
    lg2 = app2.open(sec.url, storage_options=sec.so)
    app2.churn(10)
    lg2.close()
    assert sec.restore()[0] == app2.data


# -- injected faults: a proxy in front of moto, and faulty:// ----------------------------------


class FaultProxy:
    """An HTTP proxy between s3fs and the moto server that fails chosen requests.

    ``rule(method, path, n)`` returns None (forward), ``("status", 500|503)``, ``("drop",)``
    (close the connection before forwarding), ``("drop_after",)`` (forward, then close the
    connection without answering: a lost response) or ``("delay", seconds)``.
    """

    def __init__(self, target: str) -> None:
        host, port = target.split("//", 1)[1].split(":")
        self.target = (host, int(port))
        self.rule: Callable[[str, str, int], tuple[Any, ...] | None] = lambda m, p, n: None
        self.count = 0
        self.injected: list[tuple[int, str, str, tuple[Any, ...]]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def handle_one(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy.lock:
                    proxy.count += 1
                    action = proxy.rule(self.command, self.path, proxy.count)
                    if action:
                        proxy.injected.append((proxy.count, self.command, self.path, action))
                if action and action[0] == "delay":
                    time.sleep(action[1])
                    action = None
                if action and action[0] == "status":
                    code = "SlowDown" if action[1] == 503 else "InternalError"
                    msg = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
                    self.send_response(action[1])
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                if action and action[0] == "drop":
                    self._drop()
                    return
                conn = http.client.HTTPConnection(*proxy.target, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                if action and action[0] == "drop_after":
                    self._drop()
                    return
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    lk = k.lower()
                    if lk in ("transfer-encoding", "connection", "server", "date"):
                        continue
                    if lk == "content-length" and self.command != "HEAD":
                        continue
                    self.send_header(k, v)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _drop(self) -> None:
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fault_proxy(moto_server: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(moto_server)
    yield proxy
    proxy.close()


FAULTS = {
    "503": ("status", 503),
    "500": ("status", 500),
    "dropped-connection": ("drop",),
    "delay": ("delay", 0.25),
    "lost-response": ("drop_after",),
}


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.parametrize(
    "fault",
    [
        "503",
        "500",
        "dropped-connection",
        "delay",
        "lost-response",
    ],
)
def test_s3_faults_are_retried_in_order_losing_nothing(
    fault: str, fault_proxy: FaultProxy, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    # botocore's own retries off, so persistlog's retry policy meets the faults (s3fs still
    # retries a few kinds inside each attempt, as in production).
    so = {**s3_storage_options,
          "client_kwargs": {"endpoint_url": fault_proxy.url},
          "config_kwargs": {"retries": {"mode": "standard", "total_max_attempts": 1}}}
    url = f"s3://{s3_bucket}/faults/log"
    action = FAULTS[fault]
    budget = [5]

    segment_puts = [0]

    def rule(method: str, path: str, n: int) -> tuple[Any, ...] | None:
        if fault == "lost-response":  # every other segment PUT
            if not (method == "PUT" and path.endswith(".plog")):
                return None
            segment_puts[0] += 1
            n = segment_puts[0]
        if n <= 4 or n % 2 or budget[0] <= 0:
            return None
        budget[0] -= 1
        return action

    fault_proxy.rule = rule
    app = RecordingApp()
    lg = app.open(url, storage_options=so, flush_interval=30)
    for _ in range(8):
        app.churn(12)
        app.sync()  # one segment object per sync
    lg.close()
    assert budget[0] == 0, fault_proxy.injected  # every fault was injected
    fault_proxy.rule = lambda m, p, n: None
    records: list[Any] = []
    persistlog.restore(url, records.append, storage_options=so)
    assert records == app.ops  # in order, nothing lost


def test_faulty_primary_transient_faults_are_retried(clean_memory_fs: None) -> None:
    plan = (
        FaultPlan()
        .transient("pipe_file", nth=3)
        .transient("pipe_file", nth=6, after=True)  # landed, but the answer was lost
        .transient("pipe_file", nth=9, times=2)
        .delay("pipe_file", 0.1, nth=12, times=3)
        .transient("cat_file", nth=2)
        .transient("ls", nth=3)
        .transient("info", nth=2, times=2)
    )
    url = f"faulty://t{uuid.uuid4().hex[:8]}/log"
    so = {"target_protocol": "memory", "faults": plan}
    app = RecordingApp()
    lg = app.open(url, storage_options=so, flush_interval=30, retain=2)
    for r in range(10):
        app.churn(15, sync_every=7)
        if r in (3, 7):
            lg.rotate()
    app.sync()
    lg.close()
    fired = {op for op, _ in plan.fired}
    assert {"pipe_file", "cat_file", "ls"} <= fired, plan.fired
    records: list[Any] = []
    result = persistlog.restore(url, records.append, storage_options={"target_protocol": "memory"})
    assert _replay(records) == app.data
    assert result.complete and result.next_lsn == lg.next_lsn


@pytest.mark.slow
def test_lease_is_renewed_whatever_the_flush_interval(clean_memory_fs: None) -> None:
    url = "memory://lease-cadence/log"
    first = persistlog.open(url, lambda emit: None, flush_interval=5, lease_ttl=1.0)
    try:
        first.update({"op": "put", "key": "a", "value": 1})
        time.sleep(2.2)  # two lease lifetimes: a live writer must have renewed meanwhile
        try:
            second = persistlog.open(url, lambda emit: None, lease_ttl=30)
        except persistlog.WriterConflict:
            pass
        else:
            second.close()
            pytest.fail("a second writer opened while the first was alive: its lease lapsed")
    finally:
        first.close()

"""An S3 endpoint nobody answers at: every call fails within seconds, saying where and how
often it tried, instead of retrying for minutes in three layers (this driver's policy,
s3fs's and botocore's)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

import persistlog
from destinations import open_destination

pytest.importorskip("s3fs")


def closed_port() -> int:
    """A loopback port with no listener (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def options(port: int, **extra: object) -> dict[str, object]:
    return {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}, **extra}


@pytest.mark.slow
def test_restore_from_a_wrong_endpoint_fails_in_seconds_naming_it() -> None:
    port = closed_port()
    started = time.monotonic()
    with pytest.raises(persistlog.DestinationError) as info:
        persistlog.restore("s3://bucket/app", lambda r: None, storage_options=options(port))
    assert time.monotonic() - started < 30  # each call: 6 tries within its 20 s bound
    text = str(info.value)
    assert f"http://127.0.0.1:{port}" in text and "gave up after 6 tries" in text


@pytest.mark.slow
def test_the_retry_options_are_read_by_the_driver_not_fsspec() -> None:
    port = closed_port()
    dest = open_destination("s3://bucket/app", **options(port, persistlog={"tries": 2, "retry_seconds": 15}))
    assert (dest.retry_policy.tries, dest.retry_policy.seconds) == (2, 15.0)
    started = time.monotonic()
    with pytest.raises(OSError, match="gave up after 2 tries"):
        dest.read("CURRENT")
    assert time.monotonic() - started < 10
    with pytest.raises(ValueError, match="persistlog.tries must be an integer >= 1"):
        open_destination("s3://bucket/app", **options(port, persistlog={"tries": 0}))
    with pytest.raises(ValueError, match='takes a dict with "tries" and "retry_seconds"'):
        open_destination("s3://bucket/app", **options(port, persistlog={"retries": 2}))


@pytest.mark.slow
def test_info_on_a_wrong_endpoint_exits_2_within_seconds() -> None:
    port = closed_port()
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "persistlog", "info", "s3://bucket/app", "-o", "key=k", "-o", "secret=s",
         "-o", f"client_kwargs.endpoint_url=http://127.0.0.1:{port}", "-o", "persistlog.tries=2"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"127.0.0.1:{port}" in proc.stderr + proc.stdout
    assert time.monotonic() - started < 20

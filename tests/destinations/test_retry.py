"""Retries of the object-store driver, driven by the fault-injecting filesystem."""

from __future__ import annotations

import errno
import uuid
from typing import Any

import pytest
from faults import FaultPlan

from destinations import open_destination
from destinations._retry import RetryPolicy, is_transient
from destinations.objectstore import ObjectStoreDestination


def _faulty(plan: FaultPlan) -> tuple[ObjectStoreDestination, list[float]]:
    dest = open_destination(
        f"faulty://t{uuid.uuid4().hex[:8]}/log", target_protocol="memory", faults=plan
    )
    assert isinstance(dest, ObjectStoreDestination)
    waits: list[float] = []
    dest.retry_policy = RetryPolicy(sleep=waits.append)
    dest.ensure()
    return dest, waits


def test_transient_failures_are_retried(clean_memory_fs: None) -> None:
    plan = (
        FaultPlan()
        .transient("pipe_file", nth=1, times=2)
        .transient("ls", nth=1, error=TimeoutError)
    )
    plan.fail("cat_file", nth=1, error=OSError(errno.EBUSY, "503 SlowDown"))
    dest, waits = _faulty(plan)
    dest.create("a", b"payload")
    assert dest.list() == ["a"]
    assert dest.read("a") == b"payload"
    assert dest.stats()["PUT"] == 3 and dest.stats()["LIST"] == 2 and dest.stats()["GET"] == 2
    assert len(waits) == 4
    assert all(0 < w <= 2.0 for w in waits)


@pytest.mark.parametrize("error", [errno.EIO, errno.ENOSPC, PermissionError, FileNotFoundError])
def test_permanent_failures_are_not_retried(clean_memory_fs: None, error: Any) -> None:
    dest, waits = _faulty(FaultPlan().fail("pipe_file", nth=1, error=error))
    with pytest.raises(OSError):
        dest.create("a", b"x")
    assert waits == []
    assert dest.stats()["PUT"] == 1
    assert dest.list() == []


def test_gives_up_after_the_policy_tries(clean_memory_fs: None) -> None:
    dest, waits = _faulty(FaultPlan().transient("pipe_file", nth=1, times=100))
    with pytest.raises(ConnectionResetError):
        dest.replace("CURRENT", b"x")
    assert dest.stats()["PUT"] == 6
    assert len(waits) == 5
    assert max(waits) <= 2.0


def test_create_whose_lost_response_landed_is_ours(clean_memory_fs: None) -> None:
    # The first PUT lands but its answer is lost; the retry meets our own object.
    dest, waits = _faulty(FaultPlan().transient("pipe_file", nth=1, after=True))
    dest.create("seg", b"ours")
    assert dest.read("seg") == b"ours"
    assert len(waits) == 1


def test_create_conflict_after_a_retry_is_still_a_conflict(clean_memory_fs: None) -> None:
    dest, _ = _faulty(FaultPlan())
    dest.create("seg", b"theirs")
    plan = dest.fs.faults
    plan.transient("pipe_file", nth=plan.calls["pipe_file"] + 1)
    with pytest.raises(FileExistsError):
        dest.create("seg", b"ours")
    assert dest.read("seg") == b"theirs"


def test_delays_are_capped_exponential_with_jitter() -> None:
    delays = list(RetryPolicy(tries=8, base=0.05, cap=2.0).delays())
    assert len(delays) == 7
    for n, d in enumerate(delays):
        top = min(2.0, 0.05 * 2**n)
        assert top / 2 <= d <= top


def test_error_classification() -> None:
    from botocore.exceptions import ClientError, EndpointConnectionError

    def client_error(code: str, status: int) -> OSError:
        err = OSError(errno.EIO, code)
        err.__cause__ = ClientError(
            {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
        )
        return err

    assert is_transient(client_error("InternalError", 500))
    assert is_transient(client_error("SlowDown", 503))
    assert is_transient(client_error("ConditionalRequestConflict", 409))
    assert not is_transient(client_error("PreconditionFailed", 412))
    assert not is_transient(client_error("AccessDenied", 403))
    assert not is_transient(PermissionError("403"))
    assert not is_transient(FileNotFoundError("bucket"))
    assert not is_transient(FileExistsError("exists"))
    assert is_transient(EndpointConnectionError(endpoint_url="http://127.0.0.1:9"))
    assert is_transient(ConnectionResetError())
    assert is_transient(TimeoutError())
    assert is_transient(OSError(errno.EBUSY, "SlowDown"))
    assert not is_transient(OSError(errno.EIO, "disk"))
    assert not is_transient(ValueError("bug"))

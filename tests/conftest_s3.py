"""Fixtures for destination tests: a real S3 protocol (moto server) and a clean memory://.

Self-contained so that ``tests/conftest.py`` only re-exports it. The moto server runs in a
thread of the test process, bound to 127.0.0.1 on a free port, once per session; every test
gets its own bucket.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Iterator

import pytest


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """The endpoint URL of a moto S3 server shared by the session."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    # The server logs every request through werkzeug; keep test output readable.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ["AWS_ACCESS_KEY_ID"] = "testing"
    os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3_storage_options(moto_server: str) -> dict[str, Any]:
    """storage_options reaching the moto server (no region: moto does not need one)."""
    return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": moto_server}}


@pytest.fixture
def s3_bucket(s3_storage_options: dict[str, Any]) -> str:
    """A fresh, empty bucket name on the moto server."""
    import fsspec

    bucket = f"test-{uuid.uuid4().hex[:16]}"
    fs = fsspec.filesystem("s3", **s3_storage_options)
    fs.call_s3("create_bucket", Bucket=bucket)
    return bucket


class MotoRequests:
    """Every request the test run's moto server receives, as the server sees it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def __call__(self, request: Any, body: Any = None) -> None:
        self.seen.append((request.method, request.path, request.query_string.decode()))

    def take(self) -> list[tuple[str, str, str]]:
        seen, self.seen = self.seen, []
        return seen


@pytest.fixture
def s3_requests(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> MotoRequests:
    from moto.moto_api import recorder

    spy = MotoRequests()
    # moto hands every request it serves to its recorder first: count them there.
    monkeypatch.setattr(recorder, "_record_request", spy)
    return spy


@pytest.fixture
def clean_memory_fs() -> Iterator[None]:
    """Empty fsspec's process-global memory:// store before and after the test."""
    from fsspec.implementations.memory import MemoryFileSystem

    def clear() -> None:
        MemoryFileSystem.store.clear()
        MemoryFileSystem.pseudo_dirs[:] = [""]

    clear()
    yield
    clear()

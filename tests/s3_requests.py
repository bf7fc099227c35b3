"""Counting the HTTP requests an S3 destination really sends, at botocore's ``before-send``
event: what the store bills, counted below every layer of persistlog and s3fs."""

from __future__ import annotations

from collections import Counter
from typing import Any

import fsspec.asyn


class S3Requests:
    """Counts, by S3 operation (``HeadObject``, ``ListObjectsV2``, ``GetObject``...), the
    requests the botocore client of ``dest`` (an S3 ``ObjectStoreDestination``) sends.

    The destination should have an s3fs instance of its own (``skip_instance_cache``),
    so that nothing else's requests are counted."""

    def __init__(self, dest: Any) -> None:
        fs = dest.fs
        client = fsspec.asyn.sync(fs.loop, fs.set_session)
        self.counts: Counter[str] = Counter()
        client.meta.events.register("before-send.s3", self._count)

    def _count(self, request: Any = None, event_name: str = "", **_kwargs: Any) -> None:
        self.counts[event_name.rsplit(".", 1)[-1]] += 1

    def snapshot(self) -> Counter[str]:
        return Counter(self.counts)

    def since(self, before: Counter[str]) -> Counter[str]:
        return self.counts - before

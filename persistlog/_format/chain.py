"""The hash chain of format version 2 (docs/FORMAT.md, "Hash chain").

Every batch of a chained log starts its stored payload with a 32-byte *link*: the SHA-256
of the batch before it, whole (header and stored bytes, link included). The chain runs on
across segments and logs: the first batch of a log (its header) links to the head of the
log before it. The seal links to the head and leaves it where it is: the next log was
started (and linked to that head) before the seal was written.

The writer's end is the segment writer's ``head`` (``_write.segment_writer``): the hash of the
last batch it holds, what the next batch links to. The reading end is in
``reader.LogScanner``, which checks every link as it reads.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import cbor2

from . import constants as F

#: The link of the first batch of a chain: a log with no chained log before it.
GENESIS = bytes(F.LINK_SIZE)


def batch_hash(*parts: bytes | memoryview) -> bytes:
    """The SHA-256 of a whole batch, given as its parts in order."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.digest()


#: A batch at least this big is hashed off the reading thread (:func:`hash_soon`): below
#: it, handing the work over costs more than it saves.
OFFLOAD_BYTES = 128 * 1024

_hasher: ThreadPoolExecutor | None = None
_hasher_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _hasher
    _hasher = None  # the parent's thread does not exist in the child


os.register_at_fork(after_in_child=_reset_after_fork)


def hash_soon(*parts: bytes) -> bytes | Future[bytes]:
    """:func:`batch_hash` of ``parts``: at once for a small batch; for a big one, a future
    computed by one process-wide thread while the caller goes on. SHA-256 lets go of the
    GIL as it hashes, so a reader decodes one batch while the batch is being hashed, and
    the chain costs a reader little more wall time than no chain (docs/DESIGN.md, "Hash
    chain"). The caller takes the result before it compares the next link."""
    if sum(len(p) for p in parts) < OFFLOAD_BYTES:
        return batch_hash(*parts)
    global _hasher
    hasher = _hasher
    if hasher is None:
        with _hasher_lock:
            hasher = _hasher
            if hasher is None:
                hasher = _hasher = ThreadPoolExecutor(1, thread_name_prefix="persistlog-hash")
    try:
        return hasher.submit(batch_hash, *parts)
    except RuntimeError:  # at interpreter exit concurrent.futures takes no more work
        return batch_hash(*parts)


def head_after(batch: bytes) -> bytes | None:
    """The chain head after ``batch`` (one whole framed batch), None if it carries no link."""
    (flags,) = F.U16.unpack_from(batch, F.BATCH_FLAGS_OFFSET)
    if not flags & F.FLAG_LINKED:
        return None
    return batch_hash(batch)


def link_of(batch: bytes) -> bytes | None:
    """The link ``batch`` (one whole framed batch) carries, None if it carries none."""
    (flags,) = F.U16.unpack_from(batch, F.BATCH_FLAGS_OFFSET)
    if not flags & F.FLAG_LINKED:
        return None
    return bytes(batch[F.BATCH_HEADER_SIZE:F.BATCH_HEADER_SIZE + F.LINK_SIZE])


def segment_version(first_batch: bytes) -> int:
    """The segment format version of a log whose first batch is ``first_batch`` (its
    header batch, written by this process): 1 unchained, else the header record's ``v``
    (3 in a log whose batches may share values, 2 before)."""
    if link_of(first_batch) is None:
        return F.FORMAT_VERSION
    header = cbor2.loads(bytes(first_batch[F.BATCH_HEADER_SIZE + F.LINK_SIZE:]))
    version = header.get("v") if isinstance(header, dict) else None
    return F.SHARED_VERSION if version == F.SHARED_VERSION else F.CHAINED_VERSION

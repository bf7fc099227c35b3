"""Helpers of the Spark replay tests: writing histories, and damaging logs byte by byte."""

from __future__ import annotations

import os
import random
from typing import Any

import persistlog
from batches import batch_offsets as batch_spans
from persistlog._format import decoder
from persistlog._format import constants as F


# -- logs -----------------------------------------------------------------------------------


def segment_paths(path: str) -> list[str]:
    """Full paths of the segment files in ``path``, in (seq, segment) order."""
    names = sorted(n for n in os.listdir(path) if F.parse_segment_name(n) is not None)
    return [os.path.join(path, n) for n in names]


def restored_records(url: str, **options: Any) -> list[Any]:
    """Every record ``persistlog.restore`` replays, in order."""
    out: list[Any] = []
    persistlog.restore(url, replay=out.append, **options)
    return out


def store_state(url: str, **options: Any) -> tuple[dict[Any, Any], int]:
    """The dict a ResourceStore restores from ``url``, and the LSN it is as of."""
    data: dict[Any, Any] = {}

    def apply(r: Any) -> None:
        if isinstance(r, dict) and r.get("op") == "put":
            data[r.get("key")] = r.get("value")
        elif isinstance(r, dict) and r.get("op") == "del":
            data.pop(r.get("key"), None)

    result = persistlog.restore(url, replay=apply, **options)
    return data, result.last_lsn




def unseal(segment_path: str) -> int:
    """Cut a sealed log's last segment back to before its seal, as if its writer had died;
    returns the new size."""
    with open(segment_path, "rb") as f:
        data = f.read()
    seal_at = decoder.parse_trailer(data[-F.TRAILER_SIZE :])
    assert seal_at is not None, f"{segment_path} is not sealed"
    with open(segment_path, "r+b") as f:
        f.truncate(seal_at)
    # A writer that died wrote no CLOSED note either (its clean close did, in fact).
    closed = os.path.join(os.path.dirname(segment_path), F.CLOSED_NAME)
    if os.path.exists(closed):
        os.remove(closed)
    return seal_at


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ 0xFF]))


def change_batch(path: str, offset: int) -> None:
    """Change the last byte of the batch at ``offset`` of segment file ``path`` (the small
    integer ending its last record) in place, with its checksums fixed: only the hash chain
    can tell. A writer appending to the file goes on unaware."""
    from tests.persistlog import tamper

    with open(path, "rb") as f:
        data = f.read()
    spans = batch_spans(path)
    index = [o for o, _size, _kind in spans].index(offset)
    batch = tamper.parse(os.path.basename(path), data).batches[index]
    assert batch.body[-1] < 0x17, "the batch does not end with a small integer"
    batch.body = batch.body[:-1] + bytes([batch.body[-1] ^ 1])
    raw = batch.to_bytes()
    assert len(raw) == spans[index][1]
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(raw)


def write_store_history(
    url: str,
    *,
    rounds: int = 4,
    ops_per_round: int = 60,
    keys: int = 25,
    retain: int = 2,
    seed: int = 7,
    **options: Any,
) -> list[tuple[int, dict[Any, Any]]]:
    """Run a ResourceStore through restarts, rotations and retention; returns
    ``[(lsn, state as of lsn), ...]`` after every change, in order."""
    rng = random.Random(seed)
    history: list[tuple[int, dict[Any, Any]]] = []
    for rnd in range(rounds):
        store = persistlog.ResourceStore.open(url, retain=retain, rotate_bytes=None, **options)
        try:
            for i in range(ops_per_round):
                key: Any = rng.choice([f"user:{rng.randrange(keys)}", rng.randrange(keys)])
                if key in store and rng.random() < 0.3:
                    del store[key]
                else:
                    store[key] = {"n": i, "round": rnd, "blob": bytes([i % 256]), "tags": ["a", i]}
                history.append((store.log.next_lsn - 1, store.to_dict()))
                if i == ops_per_round // 2:
                    store.log.rotate()
        finally:
            store.close()
    return history

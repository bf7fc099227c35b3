"""A follower's first sync, and a restore, racing a rotation between listing the logs and
reading CURRENT."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import persistlog
from kv_app import apply
from follower_harness import Writer
from destinations import open_destination
from faults import FaultPlan


# -- races with the writer -------------------------------------------------------------------


class _OnFirstRead(FaultPlan):
    """Runs ``hook`` just before the first read of a file (the reader's look at CURRENT,
    which comes right after its listing): the writer moving on between the two."""

    def __init__(self, hook: Callable[[], None]) -> None:
        super().__init__()
        self.hook: Callable[[], None] | None = hook

    def run(self, op: str, call: Callable[[], Any]) -> Any:
        if op == "cat_file" and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return super().run(op, call)


def _rotation_between_listing_and_current(clean: None) -> tuple[str, Callable[[], None], dict[str, Any]]:
    """A destination where log 2 has only its header segment; the returned hook adds the
    segment with log 2's complete marker and moves CURRENT to 2, as a writer finishing a
    rotation would."""
    ref_url = "memory://race-ref/log"
    w = Writer(ref_url, flush_interval=30)
    for i in range(8):
        w.put(f"k{i}", i)
    w.log.rotate()
    state = dict(w.data)
    ref = open_destination(ref_url)
    names = [n for n in ref.list() if n.endswith(".plog")]
    blobs = {n: ref.read(n) for n in names}
    current2 = ref.read("CURRENT")
    w.close()
    dest = open_destination("memory://race/log")
    dest.ensure()
    log1 = [n for n in names if n.startswith(f"{1:020d}")]
    log2 = [n for n in names if n.startswith(f"{2:020d}")]
    assert len(log2) >= 2, names
    for n in log1 + log2[:1]:
        dest.create(n, blobs[n])
    # CURRENT naming log 1 (FORMAT.md: magic, version, reserved, seq, CRC-32).
    import struct
    import zlib

    head = struct.pack("<8sHHQ", b"PLOGCURR", 1, 0, 1)
    dest.replace("CURRENT", head + struct.pack("<I", zlib.crc32(head)))

    def writer_moves_on() -> None:
        for n in log2[1:]:
            dest.create(n, blobs[n])
        dest.replace("CURRENT", current2)

    return "faulty://race/log", writer_moves_on, state


def test_follower_initial_sync_racing_a_rotation(clean_memory_fs: None) -> None:
    """CURRENT may name a log whose complete marker was written after the follower listed
    the destination: the follower must not call that corruption."""
    url, hook, state = _rotation_between_listing_and_current(None)
    got: dict[str, Any] = {}
    f = persistlog.follow(url, lambda r: apply(got, r),
                          storage_options={"target_protocol": "memory", "faults": _OnFirstRead(hook)})
    f.poll()
    assert got == state


def test_restore_racing_a_rotation(clean_memory_fs: None) -> None:
    url, hook, state = _rotation_between_listing_and_current(None)
    got: dict[str, Any] = {}
    persistlog.restore(url, lambda r: apply(got, r),
                       storage_options={"target_protocol": "memory", "faults": _OnFirstRead(hook)})
    assert got == state

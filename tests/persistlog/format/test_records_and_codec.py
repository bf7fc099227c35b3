"""What ``update()`` takes: records that cannot be encoded are refused before anything is
written, ``update_many`` keeps order, the ``Codec`` round-trips registered classes and leaves
unknown tags inert, and calls at the limits (oversize ``update_many``, deep records,
unencodable metadata) are refused whole or read back."""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Callable
from typing import Any

import cbor2
import pytest
from kv_app import App, apply, restore_state
from log_files import app_batches, segment_files

import persistlog
from persistlog._format.codec import array_header_len


# -- the update API ---------------------------------------------------------------------


class Unregistered:
    pass


def _cyclic() -> list[Any]:
    x: list[Any] = [1]
    x.append(x)
    return x


@pytest.mark.parametrize(
    "bad",
    [object(), Unregistered(), lambda: 1, datetime.datetime(2024, 1, 1), {"nested": [1, {"deep": object()}]},
     {"key": {1, 2}, "fn": print}, _cyclic()],
    ids=["object", "class", "lambda", "naive datetime", "deeply nested", "builtin function", "cyclic"],
)
def test_unencodable_records_raise_type_error_before_anything_is_written(log_dir: str, bad: Any) -> None:
    app = App({"a": 1})
    lg = app.open(log_dir, durability="flush")
    app.put("b", 2)
    before = lg.next_lsn
    size = sum(os.path.getsize(p) for p in segment_files(log_dir))
    with pytest.raises(TypeError):
        lg.update({"op": "put", "key": "x", "value": bad})
    with pytest.raises(TypeError):
        lg.update({"op": "put", "key": "y", "value": bad}, sync=True)
    with pytest.raises(TypeError):  # the whole call is refused, good records too
        lg.update_many([{"op": "put", "key": "g1", "value": 1}, {"op": "put", "key": "x", "value": bad},
                        {"op": "put", "key": "g2", "value": 2}])
    assert lg.next_lsn == before
    assert sum(os.path.getsize(p) for p in segment_files(log_dir)) == size
    app.put("c", 3)  # the Log is still fine
    lg.sync()
    assert restore_state(log_dir)[0] == {"a": 1, "b": 2, "c": 3}
    assert lg.next_lsn == before + 1
    lg.close()


def test_update_many_returns_the_last_lsn_and_logs_in_order(log_dir: str) -> None:
    app = App({})
    lg = app.open(log_dir, durability="fsync")
    first = lg.next_lsn
    last = lg.update_many({"op": "put", "key": i % 3, "value": i} for i in range(10))
    assert last == first + 9
    assert lg.update_many([]) is None  # nothing logged, no LSN
    lg.close()
    assert restore_state(log_dir)[0] == {0: 9, 1: 7, 2: 8}


# -- Codec ------------------------------------------------------------------------------


@dataclasses.dataclass
class Order:
    id: int
    total: str
    lines: list[Any] = dataclasses.field(default_factory=list)


def test_codec_registered_dataclass_round_trip(log_dir: str) -> None:
    codec = persistlog.Codec()
    codec.register("shop.Order", Order)
    lg = persistlog.open(log_dir, lambda emit: emit(Order(1, "9.99")), codec=codec, durability="fsync")
    lg.update(Order(2, "1.00", [Order(3, "0.5")]))
    lg.close()
    seen: list[Any] = []
    persistlog.restore(log_dir, seen.append, codec=codec)
    assert seen == [Order(1, "9.99"), Order(2, "1.00", [Order(3, "0.5")])]
    # Without the registration the records stay neutral tags: no class is ever built.
    raw: list[Any] = []
    persistlog.restore(log_dir, raw.append)
    assert all(isinstance(r, cbor2.CBORTag) and r.tag == 27 for r in raw)
    assert raw[0].value[0] == "shop.Order"
    # A reader whose codec maps the name to something else of its own is fine too; another
    # registered name does not make it construct this one.
    other = persistlog.Codec()
    other.register("shop.Other", Order)
    raw = []
    persistlog.restore(log_dir, raw.append, codec=other)
    assert all(isinstance(r, cbor2.CBORTag) for r in raw)


def test_codec_unregistered_class_is_a_type_error_at_update(log_dir: str) -> None:
    codec = persistlog.Codec()
    codec.register("shop.Order", Order)
    lg = persistlog.open(log_dir, lambda emit: None, codec=codec)
    before = lg.next_lsn
    with pytest.raises(TypeError, match="Unregistered|register"):
        lg.update({"x": Unregistered()})
    assert lg.next_lsn == before
    lg.close()
    with pytest.raises(TypeError):
        codec.register("plain", Unregistered)  # not a dataclass, no encode/decode
    with pytest.raises(ValueError):
        codec.register("shop.Order", Order)  # the name is taken


def test_codec_unknown_tags_stay_inert(log_dir: str) -> None:
    lg = persistlog.open(log_dir, lambda emit: None, durability="fsync")
    lg.update(cbor2.CBORTag(35, "^(a+)+$"))  # a regular expression: never compiled
    lg.update(cbor2.CBORTag(36, "Content-Type: text/plain\n\nhello"))  # MIME: never parsed
    lg.update(cbor2.CBORTag(50000, {"x": 1}))
    lg.update(cbor2.CBORTag(27, ["os.system", ["echo pwned"]]))  # never constructed
    lg.close()
    seen: list[Any] = []
    persistlog.restore(log_dir, seen.append)
    assert [type(r) for r in seen] == [cbor2.CBORTag] * 4
    assert [r.tag for r in seen] == [35, 36, 50000, 27]
    assert seen[0].value == "^(a+)+$"
    assert list(seen[3].value[:1]) == ["os.system"] and list(seen[3].value[1]) == ["echo pwned"]


def test_codec_custom_encode_decode(log_dir: str) -> None:
    class Money:
        def __init__(self, cents: int) -> None:
            self.cents = cents

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Money) and other.cents == self.cents

    codec = persistlog.Codec()
    codec.register("Money", Money, encode=lambda m: m.cents, decode=Money)
    lg = persistlog.open(log_dir, lambda emit: None, codec=codec)
    lg.update({"price": Money(250)})
    lg.close()
    seen: list[Any] = []
    persistlog.restore(log_dir, seen.append, codec=codec)
    assert seen == [{"price": Money(250)}]


def test_replay_of_records_in_lsn_order_with_apply(log_dir: str) -> None:
    """The helper the other tests rely on agrees with ResourceStore's convention."""
    state: dict[Any, Any] = {}
    for r in ({"op": "put", "key": 1, "value": "a"}, {"op": "del", "key": 1}, {"op": "put", "key": 2, "value": "b"}):
        apply(state, r)
    assert state == {2: "b"}


# -- limits at the edges: oversize calls, deep records, bad metadata ---------------------


@pytest.mark.slow
def test_update_many_larger_than_a_batch_is_refused_whole(log_dir: str) -> None:
    lg = persistlog.open(log_dir, lambda emit: None, durability="fsync", rotate_bytes=None)
    lg.update({"op": "put", "key": "before", "value": 1})
    big = "x" * (22 * 1024 * 1024)
    with pytest.raises(ValueError, match="exceeds the .* bytes one batch holds"):
        lg.update_many([{"op": "put", "key": k, "value": big} for k in "abc"])
    del big
    lg.update({"op": "put", "key": "after", "value": 2})
    lg.close()
    state, result = restore_state(log_dir)
    assert state == {"before": 1, "after": 2}
    assert result.records == 2  # nothing of the refused call was written


@pytest.mark.slow
def test_big_update_many_is_one_batch_even_beside_buffered_records(log_dir: str) -> None:
    """A call that does not fit beside what is buffered goes into a batch of its own
    (what was buffered is written first), so a crash cannot keep half of it."""
    lg = persistlog.open(
        log_dir, lambda emit: None, rotate_bytes=None, flush_interval=3600.0, batch_bytes=32 * 1024 * 1024
    )
    buffered = lg.update_many([{"op": "put", "key": i, "value": "s" * (1 << 20)} for i in range(25)])
    chunk = "y" * (15 * 1024 * 1024)
    last = lg.update_many([{"op": "put", "key": k, "value": chunk} for k in "abc"])
    lg.close()
    del chunk
    assert app_batches(log_dir) == [(1, buffered), (last - 2, 3)]


def test_a_tag_whose_content_means_nothing_reads_back_as_that_tag(log_dir: str) -> None:
    # cbor2 writes these as given but refuses to decode them ("error decoding string-form
    # date"): the log must not become unreadable for one odd value an app logged.
    odd = [cbor2.CBORTag(1004, ""), cbor2.CBORTag(0, "not a date"), cbor2.CBORTag(1, "x"),
           cbor2.CBORTag(37, b"short"), cbor2.CBORTag(25, 7), cbor2.CBORTag(258, 5)]
    when = datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc)
    records = [{"op": "put", "key": i, "value": [v, when, {1, 2}]} for i, v in enumerate(odd)]
    records.append({"op": "put", "key": "k", "value": {frozenset({1}): cbor2.CBORTag(1004, "2025-13-45")}})
    lg = persistlog.open(log_dir, lambda emit: None)
    lg.update_many(records)
    lg.close()
    got: list[Any] = []
    result = persistlog.restore(log_dir, got.append)
    assert got == records and result.records == len(records) and not result.skipped


def test_deeply_nested_records_are_read_back(log_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Readers accept any depth cbor2's encoder can write (FORMAT.md, "Records"), as writers
    # did before they refused records deeper than MAX_RECORD_DEPTH: such a writer is this
    # one without its depth check.
    def unchecked(self: persistlog.Codec, fp: Any) -> Callable[[Any], int]:
        encode = self.encoder(fp).encode
        return lambda record: (encode(record), fp.tell())[1]

    monkeypatch.setattr(persistlog.Codec, "record_encoder", unchecked)
    lg = persistlog.open(log_dir, lambda emit: None, durability="fsync")
    depths = (199, 200, 201, 1000, 3000)
    for depth in depths:
        value: Any = 1
        for _ in range(depth):
            value = [value]
        lg.update({"op": "put", "key": depth, "value": value})
    lg.close()
    state, _ = restore_state(log_dir)
    assert sorted(state) == list(depths)


def test_open_with_unencodable_metadata_is_a_type_error(log_dir: str) -> None:
    with pytest.raises(TypeError):
        persistlog.open(log_dir, lambda emit: None, metadata=object())


@pytest.mark.parametrize("n", [0, 1, 23, 24, 255, 256, 65535, 65536])
def test_array_header_len_is_the_header_cbor2_writes(n: int) -> None:
    # update_many() encodes its records as one array and keeps the items after the header.
    assert array_header_len(n) == len(cbor2.dumps([0] * n)) - n

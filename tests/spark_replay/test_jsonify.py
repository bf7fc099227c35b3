"""The CBOR -> JSON rule of docs/JSON.md: exact examples, losslessness, and the fast path."""

from __future__ import annotations

import datetime
import decimal
import fractions
import ipaddress
import json
import math
import uuid
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from persistlog._format.jsonify import JsonRecords, PlainRecords, from_json, plain_loads, to_json, to_jsonable

UTC = datetime.timezone.utc

# Every example of docs/JSON.md's table, as (value, text).
EXAMPLES: list[tuple[Any, str]] = [
    (None, "null"),
    (True, "true"),
    (42, "42"),
    (2**70, "1180591620717411303424"),
    (1.5, "1.5"),
    (1.0, "1.0"),
    (-0.0, "-0.0"),
    ("héllo", '"héllo"'),
    ([1, "a"], '[1,"a"]'),
    ({"a": 1, "b": [True]}, '{"a":1,"b":[true]}'),
    (math.nan, '{"$float":"NaN"}'),
    (math.inf, '{"$float":"Infinity"}'),
    (-math.inf, '{"$float":"-Infinity"}'),
    (b"\x00\xff", '{"$bytes":"AP8="}'),
    (datetime.datetime(2025, 1, 31, 12, 0, 0, 5, tzinfo=UTC), '{"$datetime":"2025-01-31T12:00:00.000005+00:00"}'),
    (datetime.date(2025, 1, 31), '{"$date":"2025-01-31"}'),
    (decimal.Decimal("1.10"), '{"$decimal":"1.10"}'),
    (uuid.UUID("12345678-1234-5678-1234-567812345678"), '{"$uuid":"12345678-1234-5678-1234-567812345678"}'),
    (fractions.Fraction(1, 3), '{"$fraction":"1/3"}'),
    (ipaddress.ip_address("192.0.2.1"), '{"$ip":"192.0.2.1"}'),
    (ipaddress.ip_network("192.0.2.0/24"), '{"$ipnetwork":"192.0.2.0/24"}'),
    ({3, 1, 2}, '{"$set":[1,2,3]}'),
    ({1: "a", "b": 2}, '{"$map":[[1,"a"],["b",2]]}'),
    ({(1, 2): "pair"}, '{"$map":[[[1,2],"pair"]]}'),
    ({"$bytes": "not bytes"}, '{"$escape":{"$bytes":"not bytes"}}'),
    ({"$a": 1, "b": 2}, '{"$a":1,"b":2}'),
    (cbor2.CBORTag(1000, [1, b"x"]), '{"$tag":[1000,[1,{"$bytes":"eA=="}]]}'),
    (cbor2.CBORSimpleValue(7), '{"$simple":7}'),
    (cbor2.undefined, '{"$undefined":true}'),
    (10**4300, '{"$bigint":"' + hex(10**4300) + '"}'),
    (-(10**4300) + 1, "-" + "9" * 4300),
]


def fast_json(value: Any) -> str:
    """The fast path, as the Spark reader takes it: a batch decoded at once, then each
    record written."""
    jr = JsonRecords()
    records = jr.loads(b"\x9f" + cbor2.dumps(value) + b"\xff")
    (record,) = records
    return to_json(record) if isinstance(records, PlainRecords) else jr.dumps(record)


def test_the_fast_path_is_taken_for_plain_records() -> None:
    jr = JsonRecords()
    records = jr.loads(b"\x9f" + cbor2.dumps({"a": [1, b"x", {"b": None}]}) + b"\xff")
    assert not isinstance(records, PlainRecords)
    assert jr.dumps(records[0]) == '{"a":[1,{"$bytes":"eA=="},{"b":null}]}'
    assert isinstance(jr.loads(b"\x9f" + cbor2.dumps({1: 2}) + b"\xff"), PlainRecords)


@pytest.mark.parametrize("value,text", EXAMPLES, ids=[t[:60] for _, t in EXAMPLES])
def test_examples_of_the_rule(value: Any, text: str) -> None:
    decoded = plain_loads(cbor2.dumps(value))
    assert to_json(decoded) == text
    assert _canonical(from_json(text)) == _canonical(decoded)
    assert fast_json(value) == text


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not plain JSON")


def test_output_is_plain_json_that_any_parser_reads() -> None:
    """Each text parses as strict JSON (no NaN or Infinity literals, no trailing data) into
    the tree that ``to_jsonable`` gives, and a standard serializer writes that tree back as
    the same text."""
    for value, text in EXAMPLES:
        tree = json.loads(text, parse_constant=_no_constants)
        assert tree == to_jsonable(plain_loads(cbor2.dumps(value)))
        assert json.dumps(tree, ensure_ascii=False, separators=(",", ":"), allow_nan=False) == text


def test_unknown_marker_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"\$nope"):
        from_json('{"$nope": 1}')


def test_no_json_form_for_foreign_objects() -> None:
    with pytest.raises(TypeError, match="object"):
        to_jsonable(object())


def test_records_deeper_than_python_recurses() -> None:
    """Readers accept 10,000 levels; every JSON path writes them, by the same rule."""
    value: Any = {"$k": [1.5, b"x"]}
    for i in range(6000):
        value = [value] if i % 2 else {"k": value}
    encoded = cbor2.dumps(value)
    text = to_json(plain_loads(encoded))
    assert text == '[{"k":' * 3000 + '{"$escape":{"$k":[1.5,{"$bytes":"eA=="}]}}' + "}]" * 3000
    assert fast_json(value) == text
    assert c_texts(encoded, 1) is None  # past the C path's depth: the Python path's


def test_set_text_does_not_depend_on_iteration_order() -> None:
    a = to_json(plain_loads(cbor2.dumps({"x", "y", "z", 1})))
    b = to_json(plain_loads(cbor2.dumps({1, "z", "y", "x"})))
    assert a == b


# -- losslessness, for any CBOR value --------------------------------------------------------

_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.datetimes(timezones=st.just(UTC))
    | st.dates()
    | st.decimals(allow_nan=False, places=3)
    | st.uuids()
    | st.fractions(max_denominator=100)
)
_hashable = st.text(max_size=4) | st.integers() | st.binary(max_size=4) | st.booleans()
_values = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    | st.dictionaries(st.sampled_from(["$bytes", "$map", "$x", "$escape"]), inner, max_size=1)
    | st.dictionaries(_hashable, inner, max_size=3)
    | st.frozensets(_hashable, max_size=3)
    | st.builds(cbor2.CBORTag, st.integers(min_value=1000, max_value=2**32), inner),
    max_leaves=12,
)


def _canonical(value: Any) -> bytes:
    return cbor2.dumps(value, canonical=True)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(_values)
def test_to_json_is_lossless_and_the_fast_path_agrees(value: Any) -> None:
    encoded = cbor2.dumps(value)
    decoded = plain_loads(encoded)
    text = to_json(decoded)
    assert _canonical(from_json(text)) == _canonical(decoded)
    assert fast_json(value) == text


# -- the C path: straight from CBOR bytes to the same text ------------------------------------

from persistlog._format import jsonify  # noqa: E402
from persistlog._format.jsonify import texts_from_cbor  # noqa: E402


def c_texts(encoded: bytes, count: int) -> list[str] | None:
    """The C path's texts of ``count`` records, or None where it steps aside."""
    got = texts_from_cbor(encoded, count)
    if got is None:
        return None
    data, offsets = got
    assert len(offsets) == 4 * (count + 1)
    cuts = [int.from_bytes(offsets[i : i + 4], "little") for i in range(0, len(offsets), 4)]
    return [data[a:b].decode("utf-8") for a, b in zip(cuts, cuts[1:])]


def python_texts(encoded: bytes, count: int) -> list[str] | None:
    """What the Python path makes of the same bytes: None where it finds them damaged."""
    try:
        items = plain_loads(b"\x9f" + encoded + b"\xff")
    except Exception:  # noqa: BLE001 - damaged bytes
        return None
    if not isinstance(items, list) or len(items) != count:
        return None
    return [to_json(item) for item in items]


def test_the_c_path_is_built() -> None:
    # setup.py builds it wherever a C compiler is (the README's set-up does); without it
    # everything works, only the Spark reader is slower.
    assert jsonify._c_records is not None


def _plain(value: Any) -> bool:
    """Whether the C path must handle ``value`` itself (the common subset)."""
    if isinstance(value, dict):
        return all(type(k) is str for k in value) and all(_plain(v) for v in value.values())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if type(value) is int:
        return -(2**64) <= value < 2**64
    return value is None or type(value) in (bool, float, str, bytes) or value is cbor2.undefined


@pytest.mark.parametrize("value,text", EXAMPLES, ids=[t[:60] for _, t in EXAMPLES])
def test_examples_of_the_rule_through_the_c_path(value: Any, text: str) -> None:
    got = c_texts(cbor2.dumps(value), 1)
    if _plain(value):
        assert got == [text]
    else:
        assert got is None  # tags, sets, other keys, big integers: the Python path's


_plain_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=8)
    | st.binary(max_size=8)
    | st.just(cbor2.undefined)
)
_plain_values = st.recursive(
    _plain_leaves,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    | st.dictionaries(st.sampled_from(["$bytes", "$map", "$x", "$", "a"]), inner, max_size=2),
    max_leaves=16,
)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.lists(_plain_values, max_size=6))
def test_the_c_path_handles_the_common_subset_exactly(records: list[Any]) -> None:
    encoded = b"".join(cbor2.dumps(r) for r in records)
    assert c_texts(encoded, len(records)) == [to_json(plain_loads(cbor2.dumps(r))) for r in records]


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(_values, min_size=1, max_size=4))
def test_the_c_path_agrees_or_steps_aside(records: list[Any]) -> None:
    encoded = b"".join(cbor2.dumps(r) for r in records)
    got = c_texts(encoded, len(records))
    assert got is None or got == python_texts(encoded, len(records))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF))
def test_half_and_single_floats(half: int, single: int) -> None:
    encoded = bytes([0xF9]) + half.to_bytes(2, "big") + bytes([0xFA]) + single.to_bytes(4, "big")
    assert c_texts(encoded, 2) == python_texts(encoded, 2)


def test_what_the_c_path_leaves_to_python() -> None:
    cases = {
        "repeated key": bytes.fromhex("a2616101616102"),
        "tag": bytes.fromhex("c11a00000000"),
        "indefinite array": bytes.fromhex("9f01ff"),
        "indefinite text": bytes.fromhex("7f6161ff"),
        "invalid UTF-8": bytes.fromhex("61ff"),
        "encoded surrogate": bytes.fromhex("63eda080"),
        "overlong UTF-8": bytes.fromhex("62c0af"),
        "simple value": bytes.fromhex("f820"),
        "truncated": bytes.fromhex("6261"),
        "length past the end": bytes.fromhex("5bffffffffffffffff00"),
        "array past the end": bytes.fromhex("9bffffffffffffffff"),
        "map past the end": bytes.fromhex("bbffffffffffffffff"),
        "reserved info": bytes.fromhex("1c"),
        "lone break": bytes.fromhex("ff"),
        "trailing bytes": bytes.fromhex("0101"),
        "too deep": bytes.fromhex("81" * 300 + "00"),
        "wider than 64 keys": cbor2.dumps({f"k{i}": i for i in range(65)}),
    }
    for name, encoded in cases.items():
        assert texts_from_cbor(encoded, 1) is None, name
    wide = {f"k{i}": i for i in range(64)}
    assert c_texts(cbor2.dumps(wide), 1) == [to_json(wide)]
    assert texts_from_cbor(b"", 1) is None
    assert texts_from_cbor(b"\x01", -1) is None


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(
    st.lists(_plain_values, min_size=1, max_size=3),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(0, 4),
)
def test_damaged_bytes_never_give_text_python_would_not(records: list[Any], flips: list[tuple[int, int]], count: int) -> None:
    data = bytearray(b"".join(cbor2.dumps(r) for r in records))
    for at, byte in flips:
        data[at % len(data)] = byte
    encoded = bytes(data)
    got = c_texts(encoded, count)
    assert got is None or got == python_texts(encoded, count)


def _resource_columns(records: list[Any]) -> list[list[str | None]]:
    """op, key, key_json and value as ResourceStore replays records (the Python path's
    rule): a string key is itself in ``key``, any other key its JSON text."""
    ops: list[str | None] = []
    keys: list[str | None] = []
    key_jsons: list[str | None] = []
    values: list[str | None] = []
    for r in records:
        op = r.get("op") if isinstance(r, dict) else None
        live = op in ("put", "del")
        key = r.get("key") if live else None
        ops.append(op if live else None)
        keys.append((key if isinstance(key, str) else to_json(key)) if live else None)
        key_jsons.append(to_json(key) if live else None)
        values.append(to_json(r.get("value")) if op == "put" else None)
    return [ops, keys, key_jsons, values]


def _column(n: int, text: bytes, offsets: bytes, valid: bytes) -> list[str | None]:
    import pyarrow as pa

    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text), pa.py_buffer(valid)).to_pylist()


_store_records = st.lists(
    st.fixed_dictionaries(
        {"op": st.sampled_from(["put", "del", "putx", "", "PUT"])},
        optional={
            "key": _plain_values | st.text(max_size=300) | st.text(min_size=24, max_size=30),
            "value": _plain_values,
            "other": _plain_values,
        },
    )
    | _plain_values,
    max_size=6,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(_store_records)
def test_the_c_path_reads_the_resource_convention_as_the_store_does(records: list[Any]) -> None:
    from persistlog._format.jsonify import resource_texts_from_cbor

    encoded = b"".join(cbor2.dumps(r) for r in records)
    got = resource_texts_from_cbor(encoded, len(records))
    assert got is not None
    text, offsets, *columns = got
    assert c_texts(encoded, len(records)) == [to_json(plain_loads(cbor2.dumps(r))) for r in records]
    decoded = [plain_loads(cbor2.dumps(r)) for r in records]
    assert [_column(len(records), *c) for c in columns] == _resource_columns(decoded)


def test_the_key_column_shows_a_string_key_as_itself() -> None:
    from persistlog._format.jsonify import resource_texts_from_cbor

    records = [
        {"op": "put", "key": "user:3", "value": 1},
        {"op": "put", "key": 1, "value": 2},
        {"op": "put", "key": "1", "value": 3},
        {"op": "del", "key": True},
        {"op": "del"},
        {"op": "put", "key": 'caf\u00e9 "q"' + "x" * 300, "value": None},
        {"op": "put", "key": [1, "a"], "value": 4},
        {"op": "other", "key": "k"},
    ]
    encoded = b"".join(cbor2.dumps(r) for r in records)
    got = resource_texts_from_cbor(encoded, len(records))
    assert got is not None
    _text, _offsets, *columns = got
    ops, keys, key_jsons, values = [_column(len(records), *c) for c in columns]
    assert keys == ["user:3", "1", "1", "true", "null", 'caf\u00e9 "q"' + "x" * 300, '[1,"a"]', None]
    assert key_jsons == ['"user:3"', "1", '"1"', "true", "null", '"caf\u00e9 \\"q\\"' + "x" * 300 + '"', '[1,"a"]', None]
    assert [ops, keys, key_jsons, values] == _resource_columns(records)

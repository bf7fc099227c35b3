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

from persistlog._jsonify import JsonRecords, PlainRecords, from_json, plain_loads, to_json, to_jsonable

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


@pytest.mark.parametrize("value,text", EXAMPLES, ids=[t for _, t in EXAMPLES])
def test_examples_of_the_rule(value: Any, text: str) -> None:
    decoded = plain_loads(cbor2.dumps(value))
    assert to_json(decoded) == text
    assert _canonical(from_json(text)) == _canonical(decoded)
    assert fast_json(value) == text


def test_output_is_plain_json_that_any_parser_reads() -> None:
    for value, text in EXAMPLES:
        json.loads(text)  # strict: no NaN literals, no trailing data


def test_unknown_marker_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"\$nope"):
        from_json('{"$nope": 1}')


def test_no_json_form_for_foreign_objects() -> None:
    with pytest.raises(TypeError, match="object"):
        to_jsonable(object())


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


@settings(max_examples=300, deadline=None)
@given(_values)
def test_to_json_is_lossless_and_the_fast_path_agrees(value: Any) -> None:
    encoded = cbor2.dumps(value)
    decoded = plain_loads(encoded)
    text = to_json(decoded)
    assert _canonical(from_json(text)) == _canonical(decoded)
    assert fast_json(value) == text

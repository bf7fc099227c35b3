"""The writer's C encoder for the common subset of records (``_cbor_json.encode_subset``,
used by ``update()`` where the accelerator is built) writes exactly the bytes cbor2
writes, and leaves everything else to cbor2: a log reads the same whichever wrote it."""

from __future__ import annotations

import collections
import enum
import io
import math
import struct
from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from persistlog import Codec
from persistlog._format import constants as F
from hypothesis_profiles import active_profile

try:
    from persistlog import _cbor_json
except ImportError:  # built without a C compiler
    _cbor_json = None

pytestmark = pytest.mark.skipif(_cbor_json is None, reason="the C accelerator is not built")


def encode_subset(value: Any, limit: int) -> bytes | None:
    result: bytes | None = _cbor_json.encode_subset(value, limit)
    return result

LIMIT = F.MAX_RECORD_DEPTH

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
)
keys = (
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=8) | st.floats(allow_nan=False)
)
subset = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=6)
    | st.lists(inner, max_size=6).map(tuple)
    | st.dictionaries(keys.filter(lambda k: not isinstance(k, int) or -(2**63) <= k < 2**64), inner, max_size=6),
    max_leaves=30,
)


@active_profile(max_examples=300)
@given(value=subset)
def test_a_value_of_the_subset_encodes_to_cbor2s_bytes(value: Any) -> None:
    assert encode_subset(value, LIMIT) == cbor2.dumps(value)


class Color(enum.IntEnum):
    RED = 1


class Text(str):
    pass


class Opaque:
    """An object the Codec cannot log; its repr stays the same from run to run (a test id)."""

    def __repr__(self) -> str:
        return "Opaque()"


# cbor2 refuses the first, the Codec the second.
UNLOGGABLE = ["lone \udc80 surrogate", Opaque()]
OUTSIDE = [
    float("nan"),
    struct.unpack(">d", bytes.fromhex("fff8000000000001"))[0],  # a NaN with a payload
    2**64,
    -(2**63) - 1,
    *UNLOGGABLE,
    Color.RED,
    Text("a str subclass"),
    bytearray(b"x"),
    {1, 2},
    frozenset(),
    collections.OrderedDict(a=1),
    cbor2.CBORTag(1, 2),
    cbor2.undefined,
]


@pytest.mark.parametrize("value", OUTSIDE, ids=repr)
def test_anything_else_is_left_to_cbor2_whole(value: Any) -> None:
    assert encode_subset(value, LIMIT) is None
    assert encode_subset({"ok": [1, "x"], "deep": [[value]]}, LIMIT) is None


def test_nesting_past_the_limit_is_left_to_the_depth_check() -> None:
    value: Any = 1
    for _ in range(LIMIT):
        value = [value]
    assert encode_subset(value, LIMIT) == cbor2.dumps(value)
    assert encode_subset([value], LIMIT) is None
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    assert encode_subset(cyclic, LIMIT) is None


LOGGABLE_OUTSIDE = [v for v in OUTSIDE if not any(v is u for u in UNLOGGABLE)]
records = st.one_of(
    subset, st.sampled_from(LOGGABLE_OUTSIDE), st.dictionaries(st.text(max_size=4), st.sampled_from(LOGGABLE_OUTSIDE))
)


@active_profile(max_examples=100)
@given(values=st.lists(records, max_size=12))
def test_the_record_encoder_writes_what_cbor2_writes_whichever_encodes_each_record(values: list[Any]) -> None:
    fp = io.BytesIO()
    encode = Codec().record_encoder(fp)
    ends = [encode(v) for v in values]
    expected = b"".join(cbor2.dumps(v) for v in values)
    assert fp.getvalue() == expected
    assert ends == [len(b"".join(cbor2.dumps(v) for v in values[: i + 1])) for i in range(len(values))]


def test_floats_are_written_as_cbor2_writes_them() -> None:
    for x in (0.0, -0.0, 1.5, 1e300, -1e-300, 5e-324, math.inf, -math.inf, 0.1):
        assert encode_subset(x, LIMIT) == cbor2.dumps(x), x


@pytest.mark.parametrize("value", [[1, "lone \udc80 surrogate"], {"a": Opaque()}], ids=repr)
def test_a_value_cbor2_refuses_raises_as_cbor2_raises_it(value: Any) -> None:
    codec = Codec()
    with pytest.raises(Exception) as direct:
        codec.encode(value)
    with pytest.raises(type(direct.value)):
        codec.record_encoder(io.BytesIO())(value)

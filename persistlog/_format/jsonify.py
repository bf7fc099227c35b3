"""Records as JSON text, losslessly: the rule ``docs/JSON.md`` specifies.

CBOR has types JSON lacks. Values JSON can hold exactly are written as plain JSON; every
other value becomes an object with a single ``"$"``-prefixed key naming its type, and a map
that could be mistaken for such a marker is escaped. :func:`from_json` inverts
:func:`to_json`, so no information is lost.

Two paths produce the same text. :func:`to_json` walks an already-decoded value in Python.
The Spark reader (and ``persistlog dump --json``) use :class:`JsonRecords`, which leaves
the walk to C and checks the few cases where C would differ: several times faster. Tests
check that both paths agree.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import fractions
import ipaddress
import json
import math
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import cbor2

from .codec import _SAFE_SEMANTIC, _keep_tag, plain_loads
from .constants import MAX_CBOR_DEPTH

__all__ = [
    "JsonRecords", "PlainRecords", "from_json", "from_jsonable", "key_text", "plain_loads", "resource_texts_from_cbor",
    "texts_from_cbor", "to_json", "to_jsonable",
]

_IP_ADDRESS = (ipaddress.IPv4Address, ipaddress.IPv6Address)
_IP_NETWORK = (ipaddress.IPv4Network, ipaddress.IPv6Network)
_IP_INTERFACE = (ipaddress.IPv4Interface, ipaddress.IPv6Interface)

# Interfaces subclass addresses: test them first.
_SIMPLE_MARKERS: tuple[tuple[type | tuple[type, ...], str, Callable[[Any], Any]], ...] = (
    ((bytes, bytearray, memoryview), "$bytes", lambda v: base64.b64encode(v).decode("ascii")),
    (datetime.datetime, "$datetime", lambda v: v.isoformat()),
    (datetime.date, "$date", lambda v: v.isoformat()),
    (decimal.Decimal, "$decimal", str),
    (uuid.UUID, "$uuid", str),
    (fractions.Fraction, "$fraction", str),
    (_IP_INTERFACE, "$ipinterface", str),
    (_IP_ADDRESS, "$ip", str),
    (_IP_NETWORK, "$ipnetwork", str),
)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _float(value: float) -> Any:
    if math.isfinite(value):
        return value
    return {"$float": "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}


def _map(value: Mapping[Any, Any], convert: Callable[[Any], Any]) -> Any:
    if all(type(k) is str for k in value):
        out = {k: convert(v) for k, v in value.items()}
        if len(out) == 1 and next(iter(out)).startswith("$"):
            return {"$escape": out}
        return out
    return {"$map": [[convert(k), convert(v)] for k, v in value.items()]}


def _set(value: set[Any] | frozenset[Any], convert: Callable[[Any], Any]) -> Any:
    # Sets have no order; sorting by the elements' JSON makes equal sets equal text.
    items = sorted((convert(v) for v in value), key=_dumps)
    return {"$set": items}


# Integers of more than 4300 decimal digits are written in hex: decimal conversion costs
# quadratic time, which is why Python refuses it past that length by default (hex costs
# linear time). A fixed bound, so that the text never depends on the interpreter.
_DECIMAL_LIMIT = 10**4300


def _int(value: int) -> Any:
    if -_DECIMAL_LIMIT < value < _DECIMAL_LIMIT:
        return value
    return {"$bigint": hex(value)}


def to_jsonable(value: Any) -> Any:
    """``value`` (as a persistlog reader decodes it) as plain JSON data, by the JSON.md rule.

    Raises ``TypeError`` for a value CBOR decoding never produces.
    """
    t = type(value)
    if value is None or t is str or t is bool:
        return value
    if t is int:
        return _int(value)
    if t is float:
        return _float(value)
    if t is list or t is tuple:
        return [to_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return _map(value, to_jsonable)
    if isinstance(value, (set, frozenset)):
        return _set(value, to_jsonable)
    if isinstance(value, cbor2.CBORTag):
        return {"$tag": [value.tag, to_jsonable(value.value)]}
    for types, marker, encode in _SIMPLE_MARKERS:
        if isinstance(value, types):
            return {marker: encode(value)}
    if isinstance(value, cbor2.CBORSimpleValue):
        return {"$simple": value.value}
    if value is cbor2.undefined:
        return {"$undefined": True}
    # Subclasses of the JSON types (IntEnum, str enums...) only come from app code.
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return _int(int(value))
    if isinstance(value, float):
        return _float(float(value))
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    raise TypeError(f"no JSON form for a {t.__module__}.{t.__qualname__}")


def to_json(value: Any) -> str:
    """``value`` as compact JSON text (UTF-8, no ASCII escaping), by the JSON.md rule."""
    try:
        return _dumps(to_jsonable(value))
    except RecursionError:
        # Readers accept records nested up to MAX_CBOR_DEPTH levels, deeper than Python's
        # recursion goes: write those without recursing.
        return _deep_to_json(value)


def _deep_to_json(value: Any) -> str:
    """:func:`to_json`'s text, written with an explicit stack instead of recursion.

    Containers (arrays, maps, tags) are opened and closed on the stack; everything else
    is a leaf that :func:`to_json` writes. Sets are the exception: their elements are
    ordered by their text, so each element is written by a call of its own (sets nest only
    as deep as their hashable elements do).
    """
    out: list[str] = []
    # Each entry is text to write, or a value still to write.
    stack: list[Any] = [_Value(value)]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        v = item.value
        if isinstance(v, (list, tuple)):
            parts: list[Any] = ["["]
            for i, x in enumerate(v):
                if i:
                    parts.append(",")
                parts.append(_Value(x))
            parts.append("]")
        elif isinstance(v, Mapping):
            if all(type(k) is str for k in v):
                prefix = '{"$escape":{' if len(v) == 1 and next(iter(v)).startswith("$") else "{"
                parts = [prefix]
                for i, (k, x) in enumerate(v.items()):
                    parts.append(("," if i else "") + _dumps(k) + ":")
                    parts.append(_Value(x))
                parts.append("}}" if prefix != "{" else "}")
            else:
                parts = ['{"$map":[']
                for i, (k, x) in enumerate(v.items()):
                    parts += ["," if i else "", "[", _Value(k), ",", _Value(x), "]"]
                parts.append("]}")
        elif isinstance(v, cbor2.CBORTag):
            parts = ['{"$tag":[' + _dumps(v.tag) + ",", _Value(v.value), "]}"]
        elif isinstance(v, (set, frozenset)):
            parts = ['{"$set":[' + ",".join(sorted(_deep_to_json(x) for x in v)) + "]}"]
        else:
            parts = [_dumps(to_jsonable(v))]
        stack.extend(reversed(parts))
    return "".join(out)


class _Value:
    """A value still to be written on :func:`_deep_to_json`'s stack (text is a ``str``)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


# -- the inverse --------------------------------------------------------------------------

def _hashable(value: Any) -> Any:
    """Map keys and set elements back in a hashable form (arrays as tuples)."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return cbor2.frozendict({k: _hashable(v) for k, v in value.items()})
    if isinstance(value, set):
        return frozenset(value)
    return value


_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

_DECODERS: dict[str, Callable[[Any], Any]] = {
    "$bytes": lambda v: base64.b64decode(v, validate=True),
    "$datetime": datetime.datetime.fromisoformat,
    "$date": datetime.date.fromisoformat,
    "$decimal": decimal.Decimal,
    "$uuid": uuid.UUID,
    "$fraction": fractions.Fraction,
    "$ip": ipaddress.ip_address,
    "$ipnetwork": ipaddress.ip_network,
    "$ipinterface": ipaddress.ip_interface,
    "$float": lambda v: _FLOATS[v],
    "$bigint": lambda v: int(v, 16),
    "$simple": cbor2.CBORSimpleValue,
    "$undefined": lambda v: cbor2.undefined,
}


def from_jsonable(value: Any) -> Any:
    """The value :func:`to_jsonable` was given (arrays come back as lists, and as tuples
    where they were map keys or set elements). Raises ``ValueError`` on an unknown marker."""
    if isinstance(value, list):
        return [from_jsonable(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        return {k: from_jsonable(v) for k, v in value.items()}
    ((key, inner),) = value.items()
    if not key.startswith("$"):
        return {key: from_jsonable(inner)}
    if key == "$escape":
        return {k: from_jsonable(v) for k, v in inner.items()}
    if key == "$map":
        return {_hashable(from_jsonable(k)): from_jsonable(v) for k, v in inner}
    if key == "$set":
        return {_hashable(from_jsonable(v)) for v in inner}
    if key == "$tag":
        return cbor2.CBORTag(inner[0], from_jsonable(inner[1]))
    decode = _DECODERS.get(key)
    if decode is None:
        raise ValueError(f"unknown JSON marker {key!r}")
    return decode(inner)


def from_json(text: str) -> Any:
    """Parse text written by :func:`to_json` back into the value."""
    return from_jsonable(json.loads(text))


# -- the fast paths ---------------------------------------------------------------------------

try:
    from .._cbor_json import records as _c_records
except ImportError:  # built without a C compiler: the Python paths give the same text
    _c_records = None


def texts_from_cbor(payload: bytes, count: int) -> tuple[bytes, bytes] | None:
    """The JSON text of each of the ``count`` records making up ``payload`` (a batch's CBOR
    sequence), straight from the bytes: ``(text, offsets)``, the records' UTF-8 texts end
    to end and ``count + 1`` little-endian int32 offsets into them (an Arrow string
    array's buffers).

    ``None`` when the C accelerator is not built, or the records hold anything beyond the
    common subset it handles (tags, maps keyed by other than distinct strings, ...) or are
    damaged: decode them and use :class:`JsonRecords` (or :func:`to_json`) then. Where it
    answers, the text is exactly :func:`to_json`'s.
    """
    if _c_records is None:
        return None
    result: tuple[bytes, bytes] | None = _c_records(payload, count)
    return result


# A column of texts as Arrow holds one: (texts end to end, offsets, validity bitmap).
NullableTexts = tuple[bytes, bytes, bytes]


ResourceTexts = tuple[bytes, bytes, NullableTexts, NullableTexts, NullableTexts, NullableTexts]


def resource_texts_from_cbor(payload: bytes, count: int) -> ResourceTexts | None:
    """:func:`texts_from_cbor`, and the ResourceStore convention's ``op``, ``key``,
    ``key_json`` and ``value`` columns read as ResourceStore replays them (a put has a key
    and a value, a del a key, anything else none of them), each ``(text, offsets,
    validity bitmap)``: :func:`key_text` and :func:`to_json` of the key, ``to_json`` of
    the value."""
    if _c_records is None:
        return None
    result: ResourceTexts | None = _c_records(payload, count, True)
    return result


def key_text(key: Any, key_json: str) -> str:
    """A key as the ``key`` column shows it: a string key itself (so that it filters as
    the string it is), any other key as its JSON text ``key_json``."""
    return key if type(key) is str else key_json



class PlainRecords(list):  # type: ignore[type-arg]
    """Records :meth:`JsonRecords.loads` had to decode without its guarantees (a map with
    keys other than strings): convert each with :func:`to_json`."""


def _strict_loads(data: bytes) -> Any:
    return cbor2.loads(
        data,
        tag_hook=_keep_tag,
        semantic_decoders=_SAFE_SEMANTIC,
        max_depth=MAX_CBOR_DEPTH + 1,  # the array wrapping the records
        strict_hashable_types=True,
    )


class JsonRecords:
    """Turns records into JSON text several times faster than :func:`to_json`.

    ``loads`` decodes a batch (give it to ``Batch.records(loads)``); :meth:`dumps` writes
    one of its records, or any part of one, as the exact text :func:`to_json` gives.

    The speed comes from letting C do both halves: cbor2 decodes, the ``json`` module's C
    encoder writes, and Python only sees the values JSON lacks. Two things the C encoder
    would get wrong are ruled out: a map key that is not a string (it would turn ``1`` into
    ``"1"``) is refused while decoding (cbor2's ``strict_hashable_types``; such a batch comes
    back as :class:`PlainRecords`), and a map that needs ``$escape`` is caught after
    encoding: every ``{"$`` in the text must be a marker this encoder wrote itself, else the
    record is redone by :func:`to_json`. Non-finite floats, sets and nested oddities are
    redone the same way. An instance is not thread-safe: use one per thread.
    """

    def __init__(self) -> None:
        self._markers = 0
        self._unsure = False
        c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
        c_encode_basestring = getattr(json.encoder, "c_encode_basestring", None)
        if c_make_encoder is not None and c_encode_basestring is not None:
            # Built once: json.dumps builds a new C encoder per call, a third of the cost.
            # Arguments: markers (None: no cycle check; decoded CBOR has no cycles),
            # default, string encoder, indent, separators, sort_keys, skipkeys, allow_nan.
            encode = c_make_encoder(None, self._default, c_encode_basestring, None, ":", ",", False, False, False)
            join = "".join
            self._encode: Callable[[Any], str] = lambda value: join(encode(value, 0))
        else:  # interpreters without the C accelerator
            self._encode = json.JSONEncoder(
                ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False,
                default=self._default,
            ).encode

    @staticmethod
    def loads(data: bytes) -> Any:
        """Decode a CBOR item; a :class:`PlainRecords` list if it needed the plain decoder."""
        try:
            return _strict_loads(data)
        except cbor2.CBORDecodeError:
            items = plain_loads(data)  # damaged bytes raise here as they would anywhere
            return PlainRecords(items) if isinstance(items, list) else items

    def dumps(self, value: Any) -> str:
        """``to_json(value)`` for a value (or part of one) that :meth:`loads` returned."""
        self._markers = 0
        self._unsure = False
        try:
            text = self._encode(value)
        except (TypeError, ValueError, RecursionError):
            return to_json(value)  # non-finite floats; byte-string map keys; deep records
        if self._unsure or ('{"$' in text and text.count('{"$') != self._markers):
            return to_json(value)
        return text

    def _default(self, value: Any) -> Any:
        for types, marker, encode in _SIMPLE_MARKERS:
            if isinstance(value, types):
                self._markers += 1
                return {marker: encode(value)}
        if isinstance(value, cbor2.CBORTag):
            self._markers += 1
            return {"$tag": [value.tag, value.value]}
        if isinstance(value, cbor2.CBORSimpleValue) or value is cbor2.undefined:
            self._markers += 1
            return to_jsonable(value)
        # Sets (ordered by their elements' text) and anything rarer: let to_json do it.
        self._unsure = True
        return None

"""Records as CBOR: the app's objects in, plain values out, never an arbitrary class.

CBOR's own types (dict, list, str, bytes, int, float, bool, None) and cbor2's semantic types
(aware datetime, date, Decimal, Fraction, UUID, set, IP addresses, big integers) round-trip
as they are. Other classes go through an explicit :class:`Codec` registration and are
written as CBOR tag 27 ``[name, fields]`` (IANA "object with type name and constructor
arguments"), so readers without the registration still see a neutral ``CBORTag``.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import cbor2

from .constants import MAX_CBOR_DEPTH, MAX_RECORD_DEPTH

# Payloads are decoded as one array wrapping the records: one level more than a record.
SEQUENCE_DEPTH = MAX_CBOR_DEPTH + 1

OBJECT_TAG = 27

T = TypeVar("T")


def _neutral_tag(tag: int) -> Callable[[Any, bool], cbor2.CBORTag]:
    def keep(value: Any, immutable: bool) -> cbor2.CBORTag:
        return cbor2.CBORTag(tag, value)

    return keep


# cbor2 would compile regular expressions (tag 35), parse MIME messages (tag 36) and build
# shared, possibly cyclic structures (tags 28/29) from untrusted bytes; keep all of them as
# inert tags instead. persistlog never writes them.
_SAFE_SEMANTIC = {tag: _neutral_tag(tag) for tag in (28, 29, 35, 36)}

# The tags cbor2 decodes to a value of its own (dates, bignums, decimals, UUIDs, sets...).
_NATIVE_TAGS = (0, 1, 2, 3, 4, 5, 25, 28, 29, 30, 35, 36, 37, 52, 54, 100, 256, 258, 260, 261, 1004, 55799)


def _meaning_or_tag(tag: int) -> Callable[[Any, bool], Any]:
    def decode(value: Any, immutable: bool) -> Any:
        try:
            meant = cbor2.loads(cbor2.dumps(cbor2.CBORTag(tag, value)), semantic_decoders=_SAFE_SEMANTIC)
        except (cbor2.CBORError, ValueError, TypeError, OverflowError):
            return cbor2.CBORTag(tag, value)
        return frozenset(meant) if immutable and isinstance(meant, set) else meant

    return decode


# A second reading, for bytes whose checksum holds but which cbor2 refuses: an app logged a
# CBORTag whose content has no meaning under its number (CBORTag(1004, "") is no date).
# Such a tag reads back as the inert tag it was, the rest of the batch as usual: every
# record a writer logged must read back. String references (25, 256) are never written by
# persistlog's encoder, so there they are only tags an app made: inert too.
_LENIENT_SEMANTIC = {
    **{tag: _meaning_or_tag(tag) for tag in _NATIVE_TAGS},
    **{tag: _neutral_tag(tag) for tag in (25, 256)},
    **_SAFE_SEMANTIC,
}


class RecordRefused(Exception):
    """A registered type's decode (or upgrade) function refused its fields: the app's
    problem, never damage. The decoder turns it into :class:`CodecError` with the record's
    position; ``cause`` is the app's exception."""

    def __init__(self, type_name: str, version: int, cause: BaseException | str) -> None:
        super().__init__(type_name, version, cause)
        self.type_name = type_name
        self.version = version
        self.cause = cause


def _decode(data: bytes, tag_hook: Callable[[cbor2.CBORTag, bool], Any]) -> Any:
    try:
        return cbor2.loads(data, tag_hook=tag_hook, semantic_decoders=_SAFE_SEMANTIC, max_depth=SEQUENCE_DEPTH)
    except cbor2.CBORDecodeError as e:
        if isinstance(e.__cause__, RecordRefused):
            raise e.__cause__ from None
        # Damage fails this reading too, with the same error.
        return cbor2.loads(data, tag_hook=tag_hook, semantic_decoders=_LENIENT_SEMANTIC, max_depth=SEQUENCE_DEPTH)


class RecordTooDeep(ValueError):
    """A value nests deeper than :data:`MAX_RECORD_DEPTH`: refused before anything is written."""

    def __init__(self, what: str = "record") -> None:
        super().__init__(
            f"{what} not logged: it nests more than {MAX_RECORD_DEPTH} levels deep (lists, tuples, "
            "dicts, sets and tags, registered classes' values included)"
        )


class RecordContainsItself(TypeError):
    """A value holds itself: no depth limit would let it be encoded (CBOR has no cycles)."""

    def __init__(self, what: str = "record") -> None:
        super().__init__(f"{what} not logged: it contains itself, and CBOR has no cycles")


def too_deep(value: Any, what: str = "record") -> Exception:
    """The error for ``value``, found nested deeper than ``MAX_RECORD_DEPTH``: TypeError if
    it contains itself (:class:`RecordContainsItself`), else :class:`RecordTooDeep`."""
    if _contains_itself(value, MAX_RECORD_DEPTH + 1):
        return RecordContainsItself(what)
    return RecordTooDeep(what)


def _contains_itself(value: Any, limit: int, budget: int = 1_000_000) -> bool:
    """Whether a container on a path at most ``limit`` deep holds itself; looks at no more
    than ``budget`` values (shared sub-values are seen once per path)."""
    path: list[int] = []
    on_path: set[int] = set()
    stack: list[Iterator[Any]] = []
    node = value
    while budget > 0:
        budget -= 1
        children = None if type(node) in _SCALARS else _children(node)
        if children is not None:
            if id(node) in on_path:
                return True
            if len(stack) > limit:
                return False
            stack.append(iter(children))
            path.append(id(node))
            on_path.add(id(node))
        while stack:
            node = next(stack[-1], _END)
            if node is not _END:
                break
            stack.pop()
            on_path.discard(path.pop())
        else:
            return False
    return False


_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})
_END = object()


def _children(value: Any) -> Any:
    """What cbor2's encoder recurses into for ``value``: an iterable, or None for a leaf."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return value
    if isinstance(value, dict):
        return _keys_and_values(value)
    if isinstance(value, (str, int, float, bytes, bytearray)):
        return None
    if isinstance(value, cbor2.CBORTag):
        return (value.value,)
    if isinstance(value, Mapping):
        return _keys_and_values(value)
    if isinstance(value, Sequence):
        return value
    return None


def _keys_and_values(mapping: Mapping[Any, Any]) -> Iterator[Any]:
    for key, value in list(mapping.items()):
        yield key
        yield value


def _nesting_depth(value: Any, limit: int) -> int:
    """The pure-Python twin of ``_cbor_json.nesting_depth`` (see it), for builds without
    a C compiler: the same answer, without recursion, only slower."""
    if type(value) in _SCALARS:
        return 0
    # The common record, a dict of scalars, without a walk (map and issuperset loop in C).
    if type(value) is dict and limit > 0:
        if _SCALARS.issuperset(map(type, value)) and _SCALARS.issuperset(map(type, value.values())):
            return 1
    deepest = 0
    stack: list[Iterator[Any]] = []
    node = value
    while True:
        children = None if type(node) in _SCALARS else _children(node)
        if children is not None:
            if len(stack) == limit:
                return limit + 1
            stack.append(iter(children))
            deepest = max(deepest, len(stack))
        while stack:
            node = next(stack[-1], _END)
            if node is not _END:
                break
            stack.pop()
        else:
            return deepest


try:
    from .._cbor_json import depth_checked as _c_depth_checked
    from .._cbor_json import nesting_depth as _c_nesting_depth
except ImportError:  # built without a C compiler (or before the functions existed)
    _c_depth_checked = _c_nesting_depth = None

#: ``nesting_depth(value, limit)``: how many levels deep ``value`` nests, ``limit + 1``
#: once deeper than ``limit``.
nesting_depth: Callable[[Any, int], int] = _c_nesting_depth or _nesting_depth


def check_depth(value: Any, what: str = "record", limit: int = MAX_RECORD_DEPTH) -> None:
    """Raise :class:`RecordTooDeep` (a ValueError) if ``value`` nests deeper than ``limit``
    (TypeError if that is because it contains itself).

    cbor2's encoder recurses on the C stack without a guard, so a deep enough value would
    crash the interpreter instead of raising: every value is measured before it is encoded.
    """
    if nesting_depth(value, limit) > limit:
        raise too_deep(value, what)


class Codec:
    """Maps app classes to stable names so they can be logged and read back.

    >>> codec = Codec()
    >>> @codec.register("shop.Order")
    ... @dataclasses.dataclass
    ... class Order:
    ...     id: int
    ...     total: str

    Unregistered objects make ``Log.update()`` raise ``TypeError`` before anything is
    written. On reading, a tag-27 object whose name is not registered stays a
    ``cbor2.CBORTag`` (``tag.value == [name, fields]``): decoding never constructs a class
    the app did not register. A registered class that cannot be built from what was
    logged (a field added, dropped or renamed since) raises :class:`CodecError` naming the
    type, the LSN and the place: the bytes are intact, so it is never damage. Versions
    and upgrade functions (``register(..., version=2, upgrade={1: fn})``) let a class
    change and still read what older code logged.
    """

    def __init__(self) -> None:
        self._by_type: dict[type, tuple[str, Callable[[Any], Any], int]] = {}
        # name -> (decode, current version, upgrade functions by the version they read)
        self._by_name: dict[str, tuple[Callable[[Any], Any], int, dict[int, Callable[[Any], Any]]]] = {}
        # Levels taken by registered objects being encoded on this thread (see _default).
        self._nesting = threading.local()
        self.encode: Callable[[Any], bytes] = functools.partial(cbor2.dumps, default=self._default)

    def register(
        self,
        name: str,
        cls: type | None = None,
        *,
        encode: Callable[[Any], Any] | None = None,
        decode: Callable[[Any], Any] | None = None,
        version: int = 1,
        upgrade: Mapping[int, Callable[[Any], Any]] | None = None,
    ) -> Any:
        """Register ``cls`` under ``name``; usable as a class decorator.

        Dataclasses need nothing else: their fields are written as a map and passed back
        as keyword arguments. For other classes give ``encode(obj) -> value`` (any
        loggable value) and ``decode(value) -> obj``.

        When the class changes, raise ``version`` (records are written with it) and give,
        for each older version ``v``, ``upgrade[v](fields) -> fields`` turning what version
        ``v`` wrote into what version ``v + 1`` writes (for a dataclass, a dict of field
        names). Reading a record of version ``v`` runs ``upgrade[v]``, ``upgrade[v + 1]``...
        then ``decode``. Records logged before any version was given are version 1.
        """
        if not isinstance(name, str) or not name:
            raise TypeError("Codec.register needs a non-empty name string first")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"Codec.register({name!r}): version must be an integer >= 1, not {version!r}")
        steps = dict(upgrade or {})
        missing = [v for v in range(1, version) if v not in steps]
        extra = sorted(v for v in steps if not (isinstance(v, int) and 1 <= v < version))
        if missing or extra or not all(callable(f) for f in steps.values()):
            raise ValueError(
                f"Codec.register({name!r}, version={version}) needs upgrade={{v: fn}} with a callable "
                f"for each older version 1..{version - 1}: missing {missing}, unexpected {extra}"
            )
        if cls is None:
            return functools.partial(
                self._register_decorator, name, encode=encode, decode=decode, version=version, upgrade=steps
            )
        self._register(name, cls, encode, decode, version, steps)
        return cls

    def _register_decorator(
        self,
        name: str,
        cls: type[T],
        *,
        encode: Callable[[Any], Any] | None,
        decode: Callable[[Any], Any] | None,
        version: int,
        upgrade: dict[int, Callable[[Any], Any]],
    ) -> type[T]:
        self._register(name, cls, encode, decode, version, upgrade)
        return cls

    def _register(
        self,
        name: str,
        cls: type,
        encode: Callable[[Any], Any] | None,
        decode: Callable[[Any], Any] | None,
        version: int,
        upgrade: dict[int, Callable[[Any], Any]],
    ) -> None:
        if not isinstance(cls, type):
            raise TypeError(f"Codec.register({name!r}, ...) needs a class, got {cls!r}")
        if name in self._by_name:
            raise ValueError(f"codec name {name!r} is already registered")
        if encode is None or decode is None:
            if not dataclasses.is_dataclass(cls):
                raise TypeError(
                    f"{cls.__qualname__} is not a dataclass: pass encode= and decode= to register it"
                )
            fields = [f.name for f in dataclasses.fields(cls)]
            encode = encode or (lambda obj: {f: getattr(obj, f) for f in fields})
            decode = decode or (lambda value: cls(**value))
        self._by_type[cls] = (name, encode, version)
        self._by_name[name] = (decode, version, upgrade)

    def encoder(self, fp: Any) -> cbor2.CBOREncoder:
        """A streaming encoder writing records to ``fp`` (the Log's batch buffer)."""
        return cbor2.CBOREncoder(fp, default=self._default)

    def record_encoder(self, fp: Any) -> Callable[[Any], int]:
        """``encode(record)`` writing to ``fp`` (the Log's batch buffer) and returning
        ``fp.tell()`` after it, which first refuses with :class:`RecordTooDeep` a record
        nested deeper than ``MAX_RECORD_DEPTH``: one call on the writer's hot path, in C
        where it is built (which encodes a record of the common subset itself, writing
        the bytes cbor2 writes: see ``encode_subset``)."""
        encode, tell = self.encoder(fp).encode, fp.tell
        if _c_depth_checked is not None:
            checked: Callable[[Any], int] = _c_depth_checked(encode, MAX_RECORD_DEPTH, too_deep, tell, fp.write)
            return checked

        def encode_checked(record: Any) -> int:
            check_depth(record)
            encode(record)
            return int(tell())

        return encode_checked

    @property
    def names(self) -> Mapping[str, Callable[[Any], Any]]:
        """Registered names and their decode functions (a copy)."""
        return {name: entry[0] for name, entry in self._by_name.items()}

    def _default(self, encoder: cbor2.CBOREncoder, value: Any) -> None:
        entry = self._by_type.get(type(value))
        if entry is None:
            raise TypeError(_unloggable(value))
        name, enc, version = entry
        fields = enc(value)
        # What enc() returns is seen only now, inside cbor2's recursion, and may hold more
        # registered objects: the levels of every registered object being encoded on this
        # thread count against one allowance, so that a chain of them (a linked list of
        # dataclasses) cannot recurse without bound. With the record's own levels, checked
        # before encoding, cbor2 recurses at most twice MAX_RECORD_DEPTH deep.
        nesting = self._nesting
        used: int = getattr(nesting, "used", 0)
        room = max(MAX_RECORD_DEPTH - used - 2, 0)  # 2: the tag and its [name, fields] array
        depth = nesting_depth(fields, room)
        if depth > room:
            raise RecordTooDeep()
        nesting.used = used + 2 + depth
        try:
            # Version 1 keeps the two-item form every earlier record has.
            encoder.encode(cbor2.CBORTag(OBJECT_TAG, [name, fields] if version == 1 else [name, fields, version]))
        finally:
            nesting.used = used

    def _tag_hook(self, tag: cbor2.CBORTag, immutable: bool) -> Any:
        # cbor2 6 calls tag hooks with (tag, immutable).
        if tag.tag == OBJECT_TAG and self._by_name:
            value = tag.value
            if isinstance(value, (list, tuple)) and len(value) in (2, 3) and isinstance(value[0], str):
                entry = self._by_name.get(value[0])
                if entry is not None:
                    return self._build(value[0], entry, value)
        return tag

    @staticmethod
    def _build(
        name: str, entry: tuple[Callable[[Any], Any], int, dict[int, Callable[[Any], Any]]], value: Any
    ) -> Any:
        """A registered object from its tag's ``[name, fields(, version)]``, upgraded from
        the version it was written with; the app's refusal is :class:`RecordRefused`."""
        decode, current, upgrade = entry
        written = value[2] if len(value) == 3 else 1
        if not isinstance(written, int) or isinstance(written, bool) or written < 1:
            raise RecordRefused(name, 0, f"its version {written!r} is not a positive integer")
        if written > current:
            raise RecordRefused(
                name, written, f"it was written by version {written}; this Codec registers version {current}"
            )
        fields = _thaw(value[1])
        try:
            for v in range(written, current):
                fields = upgrade[v](fields)
            return decode(fields)
        except Exception as e:
            raise RecordRefused(name, written, e) from e

    def loads(self, data: bytes) -> Any:
        """Decode one CBOR item (or an indefinite array of records) safely."""
        return _decode(data, self._tag_hook)


def _thaw(value: Any) -> Any:
    """cbor2 hands tag contents over as immutable containers; registered classes get the
    ordinary ones that the same value decodes to anywhere else."""
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    if isinstance(value, cbor2.frozendict):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, frozenset):
        return {_thaw(v) for v in value}
    return value


def _unloggable(value: Any) -> str:
    return f"cannot log an object of type {type(value).__module__}.{type(value).__qualname__}"


def encode_error(exc: BaseException) -> Exception:
    """The error ``update()`` raises for a record cbor2 refused: a TypeError, or the
    ValueError of a record nested too deep."""
    if isinstance(exc, (RecordTooDeep, RecordContainsItself)):
        return exc
    if isinstance(exc, RecursionError):  # registered classes' encode functions recursing
        return RecordTooDeep()
    cause = exc.__cause__ if isinstance(exc.__cause__, TypeError) else exc
    return TypeError(
        f"record not logged: {cause}; records must be CBOR values (dict, list, str, bytes, "
        "int, float, bool, None, aware datetime, Decimal, UUID, set...) or classes "
        "registered with persistlog.Codec"
    )


def _keep_tag(tag: cbor2.CBORTag, immutable: bool) -> cbor2.CBORTag:
    return tag


def plain_loads(data: bytes) -> Any:
    """Decode control records and pointers: no tags are given meaning beyond cbor2's safe set."""
    return _decode(data, _keep_tag)


def records_list(records: Iterable[Any], call: str, single: str) -> list[Any]:
    """The records given to ``call`` (``update_many()``, ``emit.many()``) as a list;
    ``single`` is the call that takes one record."""
    if isinstance(records, (str, bytes, bytearray, memoryview, Mapping)):
        # Each would iterate into characters, ints or keys: never what was meant.
        raise TypeError(
            f"{call} takes an iterable of records (a list...), not a {type(records).__name__}; "
            f"for one record use {single}"
        )
    if isinstance(records, list):
        return records
    try:
        return list(records)
    except TypeError:
        raise TypeError(f"{call} takes an iterable of records, not a {type(records).__name__}") from None


def array_header_len(n: int) -> int:
    """Bytes of a definite-length CBOR array header for ``n`` items (``update_many()``
    encodes its list as one array and keeps the items)."""
    return 1 if n < 24 else 2 if n < 0x100 else 3 if n < 0x10000 else 5 if n < 0x100000000 else 9

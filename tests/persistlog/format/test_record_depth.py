"""No record crashes the interpreter: values nested deeper than the format's limit are
refused with ValueError before anything is written (docs/FORMAT.md, "Records").

cbor2's encoder recurses on the C stack without a guard, so the dangerous cases run in a
child process: a SIGSEGV there fails the test instead of killing pytest.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import types
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

import persistlog
from persistlog._format import codec as _codec
from persistlog._format import constants as F
from childproc import run_json
from hypothesis_profiles import active_profile

LIMIT = F.MAX_RECORD_DEPTH


def nested(n: int, wrap: Any = lambda x: [x]) -> Any:
    value: Any = 1
    for _ in range(n):
        value = wrap(value)
    return value


# Every way a value reaches the encoder, each given a list nested 9,000 deep (cbor2's
# encoder dies past about 7,000 on the main thread), then the log is closed and restored.
ENTRY_POINTS = """
    import json, sys
    import persistlog

    url, how = sys.argv[1], sys.argv[2]
    deep = 1
    for _ in range(9000):
        deep = [deep]
    out = {}
    if how == "metadata":
        try:
            persistlog.open(url, lambda emit: None, metadata={"m": deep})
        except ValueError as e:
            out["error"] = str(e)
    else:
        rotating = []

        def enumerate_all(emit):
            if rotating:
                emit({"k": deep})

        lg = persistlog.open(url, enumerate_all)
        lg.update({"before": 1})
        try:
            if how == "update":
                lg.update({"k": deep})
            elif how == "update_many":
                lg.update_many([{"ok": 1}, {"k": deep}])
            elif how == "emit":
                rotating.append(True)
                lg.rotate()
        except (ValueError, persistlog.EnumerateError) as e:
            out["error"] = f"{type(e).__name__}: {e}; cause {e.__cause__}"
            out["value_error"] = isinstance(e, ValueError) or isinstance(e.__cause__, ValueError)
        lg.update({"after": 1})
        lg.close()
        records = []
        persistlog.restore(url, records.append)
        out["records"] = records
    print(json.dumps(out))
"""


@pytest.mark.parametrize("how", ["update", "update_many", "emit", "metadata"])
def test_a_list_nested_9000_deep_is_refused_and_nothing_is_written(tmp_path: Path, how: str) -> None:
    url = str(tmp_path / "log")
    out = run_json(ENTRY_POINTS, url, how)
    assert f"more than {LIMIT} levels deep" in out["error"]
    assert how == "metadata" or out["value_error"] is True
    if how == "metadata":
        assert not (tmp_path / "log").exists()  # refused before the destination was touched
    elif how == "emit":
        # The rotation failed on the enumeration; the log went on writing.
        assert out["error"].startswith("EnumerateError")
        assert out["records"] == [{"before": 1}, {"after": 1}]
    else:
        assert out["records"] == [{"before": 1}, {"after": 1}]


def test_the_limit_is_exact(tmp_path: Path) -> None:
    url = str(tmp_path / "log")
    lg = persistlog.open(url, lambda emit: None)
    lg.update(nested(LIMIT))
    with pytest.raises(ValueError, match="levels deep"):
        lg.update(nested(LIMIT + 1))
    lg.update_many([nested(LIMIT)])
    with pytest.raises(ValueError, match="levels deep"):
        lg.update_many([1, nested(LIMIT + 1)])
    lg.close()
    got: list[Any] = []
    persistlog.restore(url, got.append)
    assert got == [nested(LIMIT), nested(LIMIT)]


def test_a_value_that_contains_itself_is_a_type_error(tmp_path: Path) -> None:
    """No depth would let a cycle be encoded: it is a value CBOR cannot hold (TypeError),
    found without recursing, and told apart from a value that is only deep."""
    cyclic: list[Any] = []
    cyclic.append([{"again": cyclic}])
    shared = [1]
    url = str(tmp_path / "log")
    lg = persistlog.open(url, lambda emit: None)
    for bad in ({"k": cyclic}, nested(LIMIT - 2, lambda x: [x, cyclic])):
        with pytest.raises(TypeError, match="contains itself"):
            lg.update(bad)
        with pytest.raises(TypeError, match="contains itself"):
            lg.update_many([bad])
    with pytest.raises(ValueError, match="levels deep"):
        lg.update(nested(LIMIT + 1, lambda x: [x, shared]))  # deep, shared, no cycle
    lg.close()
    got: list[Any] = []
    persistlog.restore(url, got.append)
    assert got == []


@dataclasses.dataclass
class Node:
    value: Any
    next: Any


CHAIN = """
    import dataclasses, json, sys
    import persistlog

    codec = persistlog.Codec()

    @codec.register("test.Node")
    @dataclasses.dataclass
    class Node:
        value: object
        next: object

    url, length = sys.argv[1], int(sys.argv[2])
    head = None
    for i in range(length):
        head = Node(i, head)
    lg = persistlog.open(url, lambda emit: None, codec=codec)
    out = {}
    try:
        lg.update({"list": head})
    except ValueError as e:
        out["error"] = str(e)
    lg.update({"short": Node(1, Node(2, None))})
    lg.close()
    records = []
    persistlog.restore(url, records.append, codec=codec)
    out["records"] = len(records)
    out["short"] = records[-1]["short"].next.value
    print(json.dumps(out))
"""


@pytest.mark.slow
def test_registered_classes_cannot_recurse_without_bound(tmp_path: Path) -> None:
    """A Codec's encode functions are called from inside cbor2's recursion, where no check
    made beforehand can see what they return: a linked list of 5,000 dataclasses would
    recurse 15,000 levels deep."""
    out = run_json(CHAIN, str(tmp_path / "log"), "5000")
    assert "levels deep" in out["error"]
    assert out["records"] == 1 and out["short"] == 2  # the log went on, nothing of it written


def test_a_short_chain_of_registered_objects_is_logged(tmp_path: Path) -> None:
    codec = persistlog.Codec()
    codec.register("test.Node", Node)
    head = None
    for i in range(20):
        head = Node(i, head)
    url = str(tmp_path / "log")
    lg = persistlog.open(url, lambda emit: None, codec=codec)
    lg.update({"list": head})
    lg.close()
    got: list[Any] = []
    persistlog.restore(url, got.append, codec=codec)
    assert got == [{"list": head}]


NO_ACCELERATOR = """
    import json, sys
    import persistlog
    from persistlog._format import codec as _codec

    deep = 1
    for _ in range(9000):
        deep = {"k": deep}
    lg = persistlog.open(sys.argv[1], lambda emit: None)
    try:
        lg.update(deep)
        error = None
    except ValueError as e:
        error = str(e)
    lg.close()
    print(json.dumps({"error": error, "pure": _codec.nesting_depth is _codec._nesting_depth}))
"""


@pytest.mark.slow
def test_without_the_c_accelerator_the_python_check_refuses_too(tmp_path: Path) -> None:
    out = run_json(NO_ACCELERATOR, str(tmp_path / "log"), hide=["persistlog._cbor_json"])
    assert out["pure"] is True
    assert "levels deep" in out["error"]


# -- the measure itself -----------------------------------------------------------------------


def _mapping(x: Any) -> Any:
    return types.MappingProxyType({"k": x})


CONTAINERS = {
    "list": lambda x: [x],
    "tuple": lambda x: (1, x),
    "dict value": lambda x: {"a": 1, "b": x},
    "set": lambda x: frozenset([x]),
    "tag": lambda x: cbor2.CBORTag(1000, x),
    "deque (a Sequence)": lambda x: collections.deque([x]),
    "mappingproxy (a Mapping)": _mapping,
}


@pytest.mark.parametrize("kind", sorted(CONTAINERS))
def test_every_kind_of_container_counts(kind: str) -> None:
    wrap = CONTAINERS[kind]
    for measure in (_codec.nesting_depth, _codec._nesting_depth):
        assert measure(nested(40, wrap), 1000) == 40
        assert measure(nested(5000, wrap), LIMIT) == LIMIT + 1


def test_dict_keys_count() -> None:
    for measure in (_codec.nesting_depth, _codec._nesting_depth):
        assert measure({nested(39, lambda x: (x,)): 1}, 1000) == 40
        assert measure({"a": 1, nested(5000, lambda x: (x,)): 1}, LIMIT) == LIMIT + 1


plain = st.recursive(
    st.integers(-(2**63), 2**64 - 1) | st.text(max_size=3) | st.booleans() | st.none() | st.binary(max_size=3),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=3), children, max_size=3)
    | st.builds(lambda v: cbor2.CBORTag(1000, v), children),
    max_leaves=30,
)


@active_profile()
@given(plain)
def test_the_measure_is_the_depth_cbor2s_decoder_counts(value: Any) -> None:
    depth = _codec.nesting_depth(value, 1000)
    assert _codec._nesting_depth(value, 1000) == depth
    data = cbor2.dumps(value)
    cbor2.loads(data, max_depth=depth)
    # The decoder counts the levels above the deepest item; an empty container as the
    # deepest item is one level more here (the encoder still recurses into it).
    if depth >= 2:
        with pytest.raises(cbor2.CBORDecodeError, match="nesting depth"):
            cbor2.loads(data, max_depth=depth - 2)


@active_profile()
@given(plain, st.integers(0, 12))
def test_c_and_python_agree_under_any_limit(value: Any, limit: int) -> None:
    # The C walk answers shallow records of dicts, lists and tuples without its general
    # walk: a limit below, at and above that shortcut's reach must not change the answer.
    assert _codec.nesting_depth(value, limit) == _codec._nesting_depth(value, limit)


@pytest.mark.parametrize("depth", range(12))
@pytest.mark.parametrize("limit", [0, 1, 6, 7, 8, 9, 10, 256])
def test_records_around_the_shortcuts_reach(depth: int, limit: int) -> None:
    for wrap in (lambda x: [x], lambda x: {"k": x, "n": 1}, lambda x: ("t", x)):
        assert _codec.nesting_depth(nested(depth, wrap), limit) == min(depth, limit + 1)
    # A set the shortcut leaves to the general walk, at every level.
    with_sets = nested(depth, lambda x: {"s": {1, 2}, "v": x})
    assert _codec.nesting_depth(with_sets, limit) == _codec._nesting_depth(with_sets, limit) == min(depth + 1 if depth else 0, limit + 1)


def test_the_limit_fits_the_readers_and_the_json_fast_path() -> None:
    """Everything a writer logs reads back (readers accept MAX_CBOR_DEPTH), and takes the
    JSON fast path of _cbor_json.c, which hands deeper records over to Python."""
    assert LIMIT * 2 <= F.MAX_CBOR_DEPTH  # a record's levels plus registered objects' levels
    source = (Path(persistlog.__file__).parent / "_cbor_json.c").read_text()
    match = re.search(r"#define MAX_DEPTH (\d+)", source)
    assert match is not None and int(match.group(1)) == LIMIT

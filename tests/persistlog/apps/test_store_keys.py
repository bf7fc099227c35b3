"""ResourceStore keys keep their type across a close and a reopen."""

from __future__ import annotations

from typing import Any

import pytest

import persistlog

KEYS: list[Any] = [
    "user:1",
    7,
    ("user", 1),
    (("tenant", 3), ("user", (1, 2))),
    frozenset({"a", "b"}),
    frozenset({("x", 1), ("y", 2)}),
    ("mixed", frozenset({1, 2}), ("deep", ("deeper", 3))),
    (),
]


def test_tuple_and_frozenset_keys_come_back_as_themselves(log_dir: str) -> None:
    s = persistlog.ResourceStore.open(log_dir)
    for i, key in enumerate(KEYS):
        s[key] = {"n": i}
    del s[("user", 1)]
    s[("user", 1)] = "ada"
    s.close()

    for _ in range(2):  # a reopen, then a reopen of what the reopen's enumeration wrote
        s = persistlog.ResourceStore.open(log_dir)
        assert s.to_dict() == {**{k: {"n": i} for i, k in enumerate(KEYS)}, ("user", 1): "ada"}
        for key in KEYS:
            (back,) = [k for k in s.keys() if k == key]
            assert type(back) is type(key)
        assert s[("user", 1)] == "ada"
        del s[(("tenant", 3), ("user", (1, 2)))]
        s[(("tenant", 3), ("user", (1, 2)))] = {"n": 3}
        s.close()


@pytest.mark.parametrize("key", [[1, 2], {"a": 1}, {1, 2}, ("ok", [1]), bytearray(b"x")])
def test_a_key_that_cannot_be_a_dict_key_is_refused_before_it_is_logged(log_dir: str, key: Any) -> None:
    s = persistlog.ResourceStore.open(log_dir)
    s["a"] = 1
    before = s.log.next_lsn
    with pytest.raises(TypeError, match="unhashable"):
        s[key] = "x"
    with pytest.raises(TypeError):
        s.setdefault(key, "x")
    assert s.log.next_lsn == before
    s["c"] = 3
    s.close()
    s = persistlog.ResourceStore.open(log_dir)  # opens: nothing unhashable was logged
    assert s.to_dict() == {"a": 1, "c": 3}
    s.close()

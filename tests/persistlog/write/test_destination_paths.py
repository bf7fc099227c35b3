"""Destination paths: sibling directories never mix (retention included), and names with
dots, spaces, hidden parts or non-ASCII letters work, as paths and as ``file://`` URLs."""

from __future__ import annotations

from typing import Any

import pytest
from kv_app import App, restore_state


# -- destinations and paths -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_sibling_directories_never_mix(tmp_path: Any, kind: str, clean_memory_fs: None) -> None:
    if kind == "local":
        first, second = str(tmp_path / "x" / "log"), str(tmp_path / "x" / "log2")
    else:
        first, second = "memory://x/log", "memory://x/log2"
    apps = []
    for url, tag in ((first, "one"), (second, "two")):
        app = App({tag: 0})
        lg = app.open(url, retain=1)
        for i in range(3):
            app.put(f"{tag}{i}", i)
            lg.rotate()  # retention runs in each: it must not touch the sibling
        lg.close()
        apps.append(app)
    for url, app in zip((first, second), apps, strict=True):
        assert restore_state(url)[0] == app.data
    assert restore_state(first)[0] == apps[0].data  # after the sibling's retention too


@pytest.mark.parametrize("name", ["with space/log dir", "dots.in.name/log.v1.d", ".hidden/.log", "ünïcode/log"])
def test_paths_with_dots_and_spaces(tmp_path: Any, name: str) -> None:
    url = str(tmp_path / name)
    app = App({"a": 1})
    lg = app.open(url, durability="fsync")
    app.put("b.c d", "e f.g")
    lg.rotate()
    lg.close()
    assert restore_state(url)[0] == app.data
    assert restore_state("file://" + url)[0] == app.data

"""A class owns its state: no module writes another class's ``_private`` fields.

A write ``obj._field = ...`` (or ``+=``, or ``setattr(obj, "_field", ...)``) where ``obj``
is not ``self``/``cls`` is allowed only when a class of the same module assigns
``self._field`` itself: a module's classes may work together (a runtime and its jobs),
but one module never reaches into the fields of a class defined in another (the rotator
asks the Log to move its batch cut; it does not set it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(p for pkg in ("persistlog", "spark_replay", "destinations") for p in (ROOT / pkg).rglob("*.py"))


def _own_fields(tree: ast.Module) -> set[str]:
    """The private fields the module's own classes assign on ``self`` or ``cls``."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name):
            if node.value.id in ("self", "cls") and node.attr.startswith("_"):
                own.add(node.attr)
    return own


def _foreign_writes(tree: ast.Module) -> list[str]:
    own = _own_fields(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            name = node.attr
            target = ast.unparse(node.value)
            if name.startswith("_") and not name.startswith("__") and target not in ("self", "cls") and name not in own:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                name = node.args[1].value
                if name.startswith("_") and not name.startswith("__") and name not in own:
                    found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_writes_another_modules_private_fields(path: Path) -> None:
    assert _foreign_writes(ast.parse(path.read_text())) == []


def test_the_check_sees_a_foreign_write() -> None:
    tree = ast.parse("class A:\n    def f(self, lg):\n        lg._cut = 1\n        self._own = 2\n        other._own = 3\n")
    assert _foreign_writes(tree) == ["line 3: lg._cut"]

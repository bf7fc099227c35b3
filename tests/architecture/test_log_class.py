"""The Log is one class in one place, and each module's ``__all__`` names what it defines."""

from __future__ import annotations

import ast
import inspect
from types import MemberDescriptorType
from pathlib import Path

import pytest

import persistlog

ROOT = Path(__file__).resolve().parents[2]


def test_log_stands_alone() -> None:
    # One class a reader follows top to bottom: no base class holding half of it.
    assert persistlog.Log.__mro__ == (persistlog.Log, object)


@pytest.mark.parametrize(
    "name",
    # Instance attributes (``__slots__`` entries) are data, not members the class defines.
    [n for n, m in vars(persistlog.Log).items() if not n.startswith("_") and not isinstance(m, MemberDescriptorType)],
)
def test_each_public_member_of_log_is_defined_and_documented_in_it(name: str) -> None:
    member = inspect.getattr_static(persistlog.Log, name)
    function = member.fget if isinstance(member, property) else member
    assert function.__qualname__ == f"Log.{name}", "defined elsewhere and attached to Log"
    assert inspect.getdoc(function), f"Log.{name} has no docstring"


def test_open_builds_the_log_through_its_constructor() -> None:
    # open() hands the Log everything it needs; no private field is set after construction.
    tree = ast.parse(inspect.getsource(persistlog.open))
    poked = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr.startswith("_")
    ]
    assert poked == []


def _defined_names(tree: ast.Module) -> set[str]:
    """Names a module binds itself at top level: functions, classes, assignments."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


# What a module's __all__ lists from elsewhere on purpose: the Spark scan takes the plain
# decoder from where it takes the JSON text.
REEXPORTED = {"_format/jsonify.py": {"plain_loads"}}

PACKAGE = ROOT / "persistlog"
# The private modules: those at the top named with an underscore, and every module of a
# private subpackage (docs/INTERNALS.md, "Module map").
PRIVATE_MODULES = sorted(
    [*PACKAGE.glob("_[!_]*.py"), *(p for p in PACKAGE.glob("_[!_]*/*.py") if p.name != "__init__.py")]
)


@pytest.mark.parametrize("path", PRIVATE_MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_a_private_modules_all_names_only_what_it_defines(path: Path) -> None:
    tree = ast.parse(path.read_text())
    exported: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            exported = list(ast.literal_eval(node.value))
    assert not set(exported) - _defined_names(tree) - REEXPORTED.get(path.relative_to(PACKAGE).as_posix(), set())

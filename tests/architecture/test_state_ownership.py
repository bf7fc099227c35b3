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


# -- reads ----------------------------------------------------------------------------------
#
# A class's ``_private`` fields are read only by its own module too: the Log's fronts
# (``Log``, ``AsyncLog``) and the loop commit call the methods of the Log's parts (batch
# buffer, batch writer, rotator, writer lease), and the rotator talks to the parts, not to
# the Log. Checked for the fields of every class of these modules (the Log and its parts).

GUARDED = (
    "persistlog/_write/log.py",
    "persistlog/_write/batch_buffer.py",
    "persistlog/_write/batch_writer.py",
    "persistlog/_write/writer_lease.py",
    "persistlog/_write/rotation.py",
    "persistlog/_write/group_commit.py",
    "persistlog/_aio/loop_commit.py",
    "persistlog/_aio/async_log.py",
    "persistlog/_write/segment_writer.py",
)


def _slots(tree: ast.Module) -> set[str]:
    """The private names the module's classes declare in ``__slots__``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__slots__" for t in item.targets
                ):
                    value = ast.literal_eval(item.value)
                    names.update(n for n in value if n.startswith("_") and not n.startswith("__"))
    return names


def _fields(tree: ast.Module) -> set[str]:
    """The private fields the module's own classes keep: assigned on ``self``/``cls`` or
    declared in ``__slots__``."""
    return _own_fields(tree) | _slots(tree)


def test_every_guarded_module_exists() -> None:
    # A path left behind by a move would guard nothing, silently.
    assert [rel for rel in GUARDED if not (ROOT / rel).exists()] == []


def guarded_fields(root: Path) -> dict[str, set[str]]:
    """Each guarded field name, with the modules whose classes keep it."""
    owners: dict[str, set[str]] = {}
    for rel in GUARDED:
        path = root / rel
        if path.exists():
            for name in _fields(ast.parse(path.read_text())):
                owners.setdefault(name, set()).add(rel)
    return owners


def _imported_fields(tree: ast.Module, path: Path, root: Path) -> set[str]:
    """The private fields kept by the classes of the unguarded modules this one imports
    from: a read of one of those names may be of such a class (``follower._stop`` of a
    ``Follower``), which this check leaves alone."""
    fields: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            parts = (node.module or "").split(".") if node.module else []
        else:
            base, parts = root, (node.module or "").split(".")
        target = base.joinpath(*parts) if parts else base
        for candidate in (target.with_suffix(".py"), target / "__init__.py"):
            rel = candidate.relative_to(root).as_posix() if candidate.is_relative_to(root) else None
            if candidate.exists() and rel not in GUARDED:
                fields |= _fields(ast.parse(candidate.read_text()))
    return fields


def foreign_reads(
    tree: ast.Module, guarded: dict[str, set[str]], elsewhere: frozenset[str] | set[str] = frozenset()
) -> list[str]:
    """Reads ``obj._field`` (or ``getattr(obj, "_field")``) of a guarded field that no class
    of this module keeps (nor of the unguarded modules it imports from, ``elsewhere``),
    where ``obj`` is not ``self``/``cls``."""
    own = _fields(tree) | elsewhere
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            name = node.attr
            if name in guarded and name not in own and ast.unparse(node.value) not in ("self", "cls"):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                name = node.args[1].value
                target = ast.unparse(node.args[0])
                if name in guarded and name not in own and target not in ("self", "cls"):
                    found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_reads_the_private_fields_of_the_log_or_its_parts(path: Path) -> None:
    tree = ast.parse(path.read_text())
    assert foreign_reads(tree, guarded_fields(ROOT), _imported_fields(tree, path, ROOT)) == []


def test_the_check_sees_a_foreign_read() -> None:
    guarded = {"_written_lsn": {"persistlog/_write/batch_writer.py"}, "_pos": {"persistlog/_write/batch_buffer.py"}}
    tree = ast.parse(
        "class C:\n"
        "    def f(self, lg):\n"
        "        a = lg._written_lsn\n"
        "        b = getattr(lg, '_pos', 0)\n"
        "        c = self._written_lsn\n"
        "        d = lg._other\n"
    )
    assert foreign_reads(tree, guarded) == ["line 3: lg._written_lsn", "line 4: getattr(lg, '_pos', 0)"]

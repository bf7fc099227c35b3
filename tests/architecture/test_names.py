"""Names with one meaning: "log" is a log (a ``Log``, or a generation of logs), a module's
logger is ``logger``, and no module binds ``open`` over the builtin (``persistlog.open``
is ``_api.open_log``, bound to its public name by the package's ``__init__`` alone)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(p for pkg in ("persistlog", "spark_replay", "destinations") for p in (ROOT / pkg).rglob("*.py"))


def _module_level_names(tree: ast.Module) -> dict[str, ast.AST]:
    """The names a module binds at its top level (assignments, imports, defs, classes)."""
    bound: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[node.name] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    bound[target.id] = node
    return bound


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_binds_open_or_names_its_logger_log(path: Path) -> None:
    bound = _module_level_names(ast.parse(path.read_text(), str(path)))
    public_open = path == ROOT / "persistlog" / "__init__.py"
    assert public_open or "open" not in bound, f"{path.name} binds `open` over the builtin"
    assert "log" not in bound, f"{path.name} binds `log` at its top level (a logger is `logger`)"


def test_the_public_open_is_the_api_entry_point() -> None:
    import persistlog
    from persistlog import _api

    assert persistlog.open is _api.open_log

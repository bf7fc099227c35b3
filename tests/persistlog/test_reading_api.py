"""The public read API, ``persistlog.reading``: each name exported once and sorted, named
in the module's own reference, with a docstring of its own, and fully annotated."""

from __future__ import annotations

import __future__
import ast
import inspect
import types
from pathlib import Path
from typing import Any

import pytest

import persistlog
from persistlog import reading

ROOT = Path(__file__).resolve().parents[2]


def _callables() -> list[tuple[str, Any]]:
    return [(n, getattr(reading, n)) for n in reading.__all__ if callable(getattr(reading, n))]


def test_all_is_sorted_and_lists_exactly_the_public_names() -> None:
    public = {
        name
        for name, value in vars(reading).items()
        if not name.startswith("_")
        and not isinstance(value, (types.ModuleType, __future__._Feature))
    }
    assert reading.__all__ == sorted(reading.__all__)
    assert len(set(reading.__all__)) == len(reading.__all__)
    assert set(reading.__all__) == public


@pytest.mark.parametrize("name", reading.__all__)
def test_every_name_is_in_the_modules_reference(name: str) -> None:
    assert reading.__doc__ is not None
    assert f"``{name}``" in reading.__doc__, f"{name} is exported but not described in persistlog.reading's docstring"


@pytest.mark.parametrize("name,value", _callables(), ids=[n for n, _ in _callables()])
def test_every_class_and_function_has_a_docstring_of_its_own(name: str, value: Any) -> None:
    doc = value.__doc__
    assert doc and doc.strip(), f"{name} has no docstring"
    if isinstance(value, type):
        # A dataclass without a docstring gets its signature as one.
        assert not doc.startswith(f"{value.__name__}("), f"{name} has only the docstring dataclass made"


def _unannotated(fn: Any, owner: str) -> list[str]:
    sig = inspect.signature(fn)
    missing = [
        f"{owner}({p.name})"
        for i, p in enumerate(sig.parameters.values())
        if p.annotation is inspect.Parameter.empty and not (i == 0 and p.name in ("self", "cls"))
    ]
    if sig.return_annotation is inspect.Signature.empty:
        missing.append(f"{owner} -> ?")
    return missing


def test_every_function_and_public_method_is_fully_annotated() -> None:
    missing: list[str] = []
    for name, value in _callables():
        if isinstance(value, type):
            for attr, member in vars(value).items():
                if isinstance(member, property) and member.fget is not None:
                    missing += _unannotated(member.fget, f"{name}.{attr}")
                elif isinstance(member, (staticmethod, classmethod)):
                    missing += _unannotated(member.__func__, f"{name}.{attr}")
                elif isinstance(member, types.FunctionType) and (not attr.startswith("_") or attr == "__init__"):
                    if member.__qualname__.startswith(value.__qualname__):  # not one a decorator made
                        missing += _unannotated(member, f"{name}.{attr}")
        elif isinstance(value, types.FunctionType):
            missing += _unannotated(value, name)
    assert missing == []


def test_names_persistlog_exports_are_not_exported_again() -> None:
    # One place per name: readers take the errors, Cursor, TornTail... from persistlog.
    assert set(reading.__all__).isdisjoint(persistlog.__all__)


def _imported(path: Path, package: str) -> list[str]:
    """Every module (and ``module.name``) a file of ``package`` imports, made absolute."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found += [module] + [f"{module}.{a.name}" for a in node.names]
    return found


@pytest.mark.parametrize("package", ["spark_replay", "persistlog.cli"])
def test_spark_and_the_cli_import_only_public_persistlog_modules(package: str) -> None:
    offenders = []
    for path in (ROOT / package.replace(".", "/")).rglob("*.py"):
        for target in _imported(path, package):
            parts = target.split(".")
            if parts[0] == "persistlog" and len(parts) > 1 and (
                (parts[1].startswith("_") and not parts[1].startswith("__")) or (package == "spark_replay" and parts[1] == "cli")
            ):
                offenders.append(f"{path.relative_to(ROOT)}: {target}")
    assert offenders == []

"""The public surface is exactly ``persistlog.__all__``, kept sorted (as httpx checks its own)."""

from __future__ import annotations

import types

import persistlog


def test_all_is_sorted_and_lists_exactly_the_public_names() -> None:
    public = {
        name
        for name, value in vars(persistlog).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert persistlog.__all__ == sorted(persistlog.__all__)
    assert len(set(persistlog.__all__)) == len(persistlog.__all__)
    assert set(persistlog.__all__) == public


def test_exported_classes_and_functions_belong_to_persistlog() -> None:
    for name in persistlog.__all__:
        value = getattr(persistlog, name)
        if isinstance(value, (type, types.FunctionType)):
            assert value.__module__ == "persistlog", name


def test_the_package_says_its_version_as_the_cli_does() -> None:
    import importlib.metadata

    assert persistlog.__version__ == importlib.metadata.version("persistlog")
    assert "__version__" not in persistlog.__all__  # a module attribute, not an export

"""The architecture, checked: one-way dependencies and the format kept in one place."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORMAT_MODULES = {"persistlog/_format/constants.py", "persistlog/_format/encoder.py", "persistlog/_format/decoder.py"}


@pytest.mark.slow
def test_dependencies_point_one_way() -> None:
    # spark_replay -> persistlog -> destinations, never back (import-linter contract in setup.cfg).
    linter = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(linter)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "KEPT" in proc.stdout


def test_format_knowledge_lives_in_the_format_modules() -> None:
    offenders = []
    pattern = re.compile(r"^\s*(import struct|from struct|import zlib|from zlib)|crc32\(|struct\.(pack|unpack)", re.M)
    for package in ("persistlog", "spark_replay"):
        for path in (ROOT / package).rglob("*.py"):
            if path.relative_to(ROOT).as_posix() in FORMAT_MODULES:
                continue
            if pattern.search(path.read_text()):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == [], f"framing/checksum code outside {sorted(FORMAT_MODULES)}: {offenders}"


def test_no_pickle_anywhere() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for package in ("persistlog", "destinations", "spark_replay")
        for p in (ROOT / package).rglob("*.py")
        if re.search(r"^\s*(import pickle|from pickle|import cloudpickle|import dill)", p.read_text(), re.M)
    ]
    assert offenders == []


def test_destinations_import_neither_core_nor_spark() -> None:
    for path in (ROOT / "destinations").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import) (persistlog|spark_replay)\b", text, re.M), path


@pytest.mark.slow
def test_public_api_is_typed_strictly() -> None:
    pytest.importorskip("mypy")  # a test extra; an install without it skips this check
    # The packages come from setup.cfg's [mypy] section: persistlog, destinations, spark_replay.
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_public_read_path_contract_names_every_private_module() -> None:
    # import-linter has no "persistlog._*": setup.cfg lists the private modules and
    # subpackages (a subpackage forbids everything in it), and this keeps the list whole, so
    # that a new private module or subpackage is forbidden to Spark and the CLI too.
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    contract = cfg["importlinter:contract:public-read-path"]
    listed = set(contract["forbidden_modules"].split())
    private = {
        f"persistlog.{p.stem}"
        for p in (ROOT / "persistlog").glob("_*.py")
        if not p.stem.startswith("__")
    } | {f"persistlog.{p.parent.name}" for p in (ROOT / "persistlog").glob("_*/__init__.py")}
    assert listed == private
    # Every other module is public: the package itself, reading, the CLI.
    public = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "persistlog").rglob("*.py")
        if not any(part.startswith("_") and not part.startswith("__") for part in p.relative_to(ROOT).parts)
    }
    assert {p for p in public if not p.startswith("persistlog/cli/")} == {
        "persistlog/__init__.py",
        "persistlog/__main__.py",
        "persistlog/reading.py",
    }
    assert set(contract["source_modules"].split()) == {"spark_replay", "persistlog.cli"}


def test_the_core_tests_mirror_the_subpackages() -> None:
    # tests/persistlog/<job>/ holds the tests of persistlog/_<job>/ (docs/INTERNALS.md, "Tests").
    folders = {
        p.name
        for p in (ROOT / "tests" / "persistlog").iterdir()
        if p.is_dir() and p.name not in {"procs", "__pycache__"}
    }
    subpackages = {p.parent.name.lstrip("_") for p in (ROOT / "persistlog").glob("_*/__init__.py")}
    assert folders, "no test folders under tests/persistlog"
    assert folders <= subpackages, sorted(folders - subpackages)
    for folder in folders:
        assert list((ROOT / "tests" / "persistlog" / folder).glob("test_*.py")), folder

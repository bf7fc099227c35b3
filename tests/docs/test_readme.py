"""Every ```python block of README.md runs, so the README cannot drift from the code.

The convention a README block is written to (keep it when adding one):

- Blocks run in file order. Blocks under the same ``## `` heading share one namespace, as
  in a notebook: a later block may use what an earlier one of its section defined.
  Nothing is skipped: a block that cannot run as written is a README bug.
- An absolute path in a string literal (``"/var/lib/app"``, ``"/mnt/backup"``,
  ``"/tmp/out"``...) is rewritten into a fresh temporary directory; the same path is the
  same directory everywhere in the file.
- ``s3://bucket/...`` is rewritten to a fresh bucket on the test run's moto S3 server,
  which the process's ``AWS_ENDPOINT_URL`` and keys point boto at, so the
  ``storage_options`` the block shows work unchanged.
- ``memory://`` is emptied before the file runs.
- ``spark_replay.local_session()`` returns the test run's shared local Spark session.
- A block must finish by itself (close what it opens; no endless loops).
"""

from __future__ import annotations

import os
import re
import sys
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
# An absolute path opening a string literal, up to the end of the literal.
_PATH = re.compile(r"""(?P<q>["'])(?P<path>/(?:[A-Za-z0-9._-]+/?)+)(?P=q)""")
_S3 = re.compile(r"s3://bucket\b")


class Block:
    def __init__(self, section: str, line: int, code: str) -> None:
        self.section = section
        self.line = line
        self.code = code

    def __repr__(self) -> str:
        return f"README.md:{self.line} ({self.section})"


def readme_blocks(text: str) -> list[Block]:
    """The ```python blocks of ``text``, each with its ``## `` section and line number."""
    blocks = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()]
        headings = re.findall(r"^## (.+)$", before, re.MULTILINE)
        blocks.append(Block(headings[-1] if headings else "", before.count("\n") + 2, m.group(1)))
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


class Substitutions:
    """The rewrites of the convention above, the same for every block of one run."""

    def __init__(self, tmp: Path, bucket: str) -> None:
        self.tmp = tmp
        self.bucket = bucket
        self.paths: dict[str, str] = {}

    def _path(self, m: re.Match[str]) -> str:
        path = m.group("path")
        if path not in self.paths:
            self.paths[path] = str(self.tmp / path.strip("/").replace("/", "__"))
        return f"{m.group('q')}{self.paths[path]}{m.group('q')}"

    def apply(self, code: str) -> str:
        code = _S3.sub(f"s3://{self.bucket}", code)
        return _PATH.sub(self._path, code)


class Run:
    def __init__(self, subs: Substitutions) -> None:
        self.subs = subs
        self.modules: dict[str, types.ModuleType] = {}
        self.failed: list[Block] = []


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory: pytest.TempPathFactory, moto_server: str) -> Iterator[Run]:
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs[:] = [""]
    saved = os.environ.get("AWS_ENDPOINT_URL")
    os.environ["AWS_ENDPOINT_URL"] = moto_server
    bucket = f"readme-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("s3", key="testing", secret="testing", client_kwargs={"endpoint_url": moto_server}).call_s3(
        "create_bucket", Bucket=bucket
    )
    run = Run(Substitutions(tmp_path_factory.mktemp("readme"), bucket))
    try:
        yield run
    finally:
        for module in run.modules.values():
            sys.modules.pop(module.__name__, None)
        if saved is None:
            os.environ.pop("AWS_ENDPOINT_URL", None)
        else:
            os.environ["AWS_ENDPOINT_URL"] = saved
        MemoryFileSystem.store.clear()


@pytest.fixture(scope="module")
def shared_spark() -> Iterator[Any]:
    """The run's local Spark session (the one tests/spark_replay uses, if it started)."""
    pytest.importorskip("pyspark")
    from sparksession import shared_session

    yield shared_session()


def test_the_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 5
    sections = {b.section for b in BLOCKS}
    assert "A tour of the API" in sections and "Replaying logs in Spark" in sections


def test_substitutions_follow_the_convention(tmp_path: Path) -> None:
    subs = Substitutions(tmp_path, "b-1")
    code = 'open("/var/lib/app/state"); x = "/var/lib/app/state"; s = "s3://bucket/app"; y = "a/b"'
    out = subs.apply(code)
    target = str(tmp_path / "var__lib__app__state")
    assert out == f'open("{target}"); x = "{target}"; s = "s3://b-1/app"; y = "a/b"'


@pytest.mark.parametrize(
    "block",
    # Blocks that use spark_replay run in the shared Spark session: they are Spark tests.
    [pytest.param(b, marks=[pytest.mark.spark] if "spark_replay" in b.code else []) for b in BLOCKS],
    ids=repr,
)
def test_readme_block_runs(block: Block, readme_run: Run, request: pytest.FixtureRequest) -> None:
    earlier = [b for b in readme_run.failed if b.section == block.section]
    if earlier:
        pytest.fail(f"an earlier block of this section failed: {earlier[0]!r}")
    if "spark_replay" in block.code:
        request.getfixturevalue("shared_spark")
    module = readme_run.modules.get(block.section)
    if module is None:
        # A real module per section: dataclasses and pickling-free codecs look classes up
        # through sys.modules.
        module = types.ModuleType(f"readme_section_{len(readme_run.modules)}")
        sys.modules[module.__name__] = module
        readme_run.modules[block.section] = module
    code = readme_run.subs.apply(block.code)
    try:
        exec(compile(code, f"README.md:{block.line}", "exec"), module.__dict__)
    except BaseException:
        readme_run.failed.append(block)
        raise

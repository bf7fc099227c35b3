"""The code README.md teaches, taken from its ```python blocks as written.

README's own blocks run once each (``tests/docs/test_readme.py``); the guarantee tests run
the same functions again under conditions a reader's service meets and the tour does not
show: small rotation triggers, every durability mode, crashes, pauses and Ctrl-C.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def _blocks() -> list[str]:
    return _FENCE.findall(README.read_text(encoding="utf-8"))


def readme_functions(*names: str, inside: str | None = None) -> str:
    """The source of the functions ``names`` as README.md first defines them (at a block's
    top level or inside one of its functions; with ``inside``, only within the function of
    that name, e.g. the asyncio tour's ``main``), in the order asked, ready to ``exec`` in a
    namespace that holds what they use (``state``, ``log``...)."""
    found: dict[str, str] = {}
    for block in _blocks():
        tree = ast.parse(block)
        roots = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == inside] if inside is not None else [tree]
        for node in (n for root in roots for n in ast.walk(root) if n is not root):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
                if node.name not in found:
                    source = ast.get_source_segment(block, node)
                    assert source is not None
                    # The segment's first line starts at the def; the others keep the block's
                    # indentation, which goes.
                    first, *rest = source.splitlines()
                    indent = node.col_offset
                    found[node.name] = "\n".join([first, *(line[indent:] for line in rest)])
    missing = [n for n in names if n not in found]
    if missing:
        raise LookupError(f"README.md defines no function {missing}" + (f" inside {inside}" if inside else ""))
    return "\n\n".join(found[n] for n in names) + "\n"


def readme_lines(first: str, last: str) -> str:
    """The lines of the first README.md block that runs from a line starting with ``first``
    to the next line starting with ``last`` (both stripped of indentation; comments stay),
    dedented, ready to ``exec``: README's inline steps, such as ``update_many`` and the loop
    that applies its batch."""
    for block in _blocks():
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith(first):
                for j in range(i, len(lines)):
                    if j > i and lines[j].strip().startswith(last):
                        return textwrap.dedent("\n".join(lines[i:j + 1])) + "\n"
    raise LookupError(f"README.md has no lines from {first!r} to {last!r}")

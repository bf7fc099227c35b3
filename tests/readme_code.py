"""The code README.md teaches, taken from its ```python blocks as written.

README's own blocks run once each (``tests/docs/test_readme.py``); the guarantee tests run
the same functions again under conditions a reader's service meets and the tour does not
show: small rotation triggers, every durability mode, crashes, pauses and Ctrl-C.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def readme_functions(*names: str) -> str:
    """The source of the functions ``names`` as README.md first defines them (at a block's
    top level or inside one of its functions), in the order asked, ready to ``exec`` in a
    namespace that holds what they use (``state``, ``log``...)."""
    found: dict[str, str] = {}
    for block in _FENCE.findall(README.read_text(encoding="utf-8")):
        tree = ast.parse(block)
        for node in ast.walk(tree):
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
        raise LookupError(f"README.md defines no function {missing}")
    return "\n\n".join(found[n] for n in names) + "\n"

"""What a command line hands a reader of logs: storage options as ``KEY=VALUE`` words, and
the error that bad input from a command line is.

The CLI (``persistlog ...``) and the Spark replay job (``python -m spark_replay``) parse
``--storage-option`` with the one :func:`parse_storage_options` and report bad input as
:class:`UsageError` (one line, exit status 2). Both are public through
:mod:`persistlog.reading`.
"""

from __future__ import annotations

import json
from typing import Any


class UsageError(Exception):
    """Bad input from the command line: reported in one line, exit status 2."""


def parse_storage_options(items: list[str]) -> dict[str, Any]:
    """``["anon=true", "client_kwargs.endpoint_url=http://h"]`` ->
    ``{"anon": True, "client_kwargs": {"endpoint_url": "http://h"}}``: VALUE is parsed as JSON
    when it can be, and a dotted KEY nests (fsspec options such as ``client_kwargs`` are
    dicts). The one parser of ``--storage-option`` for the CLI and the Spark job; a word
    without ``=`` is a :class:`UsageError`."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--storage-option needs KEY=VALUE, got {item!r}")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        node = options
        *parents, leaf = key.split(".")
        for name in parents:
            child = node.setdefault(name, {})
            if not isinstance(child, dict):
                raise UsageError(f"--storage-option {key}: {name} is already set to a value")
            node = child
        node[leaf] = value
    return options

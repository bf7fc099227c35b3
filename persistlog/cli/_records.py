"""Records as output lines, shared by ``dump`` and ``tail``.

Records are written in persistlog's lossless JSON form (``docs/JSON.md``): with
``--json`` one JSON object per line, otherwise a column layout for people with the same
JSON text at the end of the line.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

from ..reading import to_json
from ._console import fmt_time, iso_time


class RecordWriter:
    """Writes records to ``stream`` as JSON lines (``as_json``) or columns."""

    def __init__(self, stream: TextIO, as_json: bool) -> None:
        self.stream = stream
        self.as_json = as_json
        self.written = 0

    def write(
        self,
        *,
        lsn: int | None,
        log: int,
        segment: int,
        commit_us: int,
        record: Any,
        kind: str | None = None,
        offset: int | None = None,
        cursor: str | None = None,
    ) -> None:
        """One line. ``cursor`` (``tail``: the cursor that resumes right after this record)
        is a field with ``--json`` and, given, the first word of a text line."""
        text = to_json(record)
        if self.as_json:
            head: dict[str, Any] = {"lsn": lsn, "log": log, "segment": segment}
            if offset is not None:
                head["offset"] = offset
            if kind is not None:
                head["kind"] = kind
            if cursor is not None:
                head["cursor"] = cursor
            head["commit_time"] = iso_time(commit_us)
            # The record's JSON is already text: splice it in rather than parse it back.
            prefix = json.dumps(head, separators=(",", ":"))[:-1]
            self.stream.write(f'{prefix},"record":{text}}}\n')
        else:
            where = f"{log}:{segment}"
            lsn_text = "-" if lsn is None else str(lsn)
            kind_text = f"  {kind:<8}" if kind is not None else ""
            cursor_text = f"{cursor}  " if cursor is not None else ""
            self.stream.write(f"{cursor_text}{lsn_text:>10}  {where:<8}{kind_text}  {fmt_time(commit_us)}  {text}\n")
        self.written += 1

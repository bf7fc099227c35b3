"""How the child processes report to the test: JSON files replaced atomically, so the
parent never reads half of one."""

from __future__ import annotations

import json
import os
from typing import Any


def dump(path: str, value: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)

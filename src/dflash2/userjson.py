"""Reading a user's JSON text (a --messages file, a prompt line, a checkpoint's config.json).

Contract: `parse_json(text, where)` returns the decoded value, or raises a one-line `DFlash2Error`
that starts with `where`: invalid JSON (with the line and column), or JSON nested too deeply for
the parser (Python's `json` recurses once per level and raises `RecursionError` beyond the
interpreter's recursion limit, about a thousand levels).
"""
from __future__ import annotations

import json
import sys
from typing import Any

from dflash2.errors import DFlash2Error


def parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DFlash2Error(f"{where} is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except RecursionError:
        raise DFlash2Error(f"{where} is nested too deeply to read (more than about {sys.getrecursionlimit()} "
                           "levels of lists or objects)") from None

"""Reading a user's JSON text (a --messages file, a prompt line, a checkpoint's config.json).

Contract: `parse_json(text, where)` returns the decoded value, or raises a one-line `DFlash2Error`
that starts with `where`: invalid JSON (with the line and column), or JSON nested too deeply for
the parser (Python's `json` recurses once per level and raises `RecursionError` beyond the
interpreter's recursion limit, about a thousand levels), an integer of more digits than Python
converts (4300), or a string that is not Unicode text (JSON may escape a lone surrogate, "\\ud800",
which no tokenizer can encode). `lone_surrogate(value)` finds such a string anywhere in a decoded
value (the server's rule too).
"""
from __future__ import annotations

import json
import sys
from typing import Any

from dflash2.errors import DFlash2Error


def parse_json(text: str, where: str) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise DFlash2Error(f"{where} is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except ValueError as err:   # an integer of more than 4300 digits
        raise DFlash2Error(f"{where} cannot be read: {str(err).split(';')[0]}") from None
    except RecursionError:
        raise DFlash2Error(f"{where} is nested too deeply to read (more than about {sys.getrecursionlimit()} "
                           "levels of lists or objects)") from None
    found = lone_surrogate(value)
    if found is not None:
        raise DFlash2Error(f"{where} holds a string that is not Unicode text (a lone surrogate {found[0]!a} at "
                           f"character {found[1]})")
    return value


def lone_surrogate(value: Any) -> tuple[str, int] | None:
    """(the surrogate, its index in its string) for the first string of `value` (keys included)
    that is not Unicode text, else None. Iterative: a deeply nested value cannot overflow it."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as err:
                return item[err.start], err.start
    return None

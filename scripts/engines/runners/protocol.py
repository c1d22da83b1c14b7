"""The one protocol of the engine runners beside this file, each run by path in its own virtual
environment (they import nothing of dflash2; their directory is on `sys.path` when run):

    PYTHON RUNNER.py RESULT.json  < request.json

`answer(run, argv, name)` reads the request (JSON) from stdin and writes `run(request)` to RESULT.json,
or {"ok": false, "error": one line, "traceback": its last 4000 characters} when it raised (the
caller reports failures in its results, so everything is caught); exit status 0 when ok, 1 when
not, 2 on a wrong command line.
"""
from __future__ import annotations

import json
import sys
import traceback
from typing import Callable


def answer(run: Callable[[dict], dict], argv: list[str], name: str) -> int:
    if len(argv) != 1:
        print(f"usage: {name} RESULT.json < request.json", file=sys.stderr)
        return 2
    try:
        result = run(json.load(sys.stdin))
    except BaseException as err:
        result = {"ok": False, "error": " ".join(f"{type(err).__name__}: {err}".split())[:600],
                  "traceback": traceback.format_exc()[-4000:]}
    with open(argv[0], "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    return 0 if result["ok"] else 1

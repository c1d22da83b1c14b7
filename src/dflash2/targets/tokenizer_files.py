"""A converted target's tokenizer files, recorded so that opening them is quick.

Contract: `record_added_tokens(directory)` -> bool copies the added tokens of
`directory/tokenizer.json` into `directory/tokenizer_config.json` as `added_tokens_decoder` (id ->
the token's fields, as transformers serialises an `AddedToken`), atomically, when the config lacks
them. transformers reads them from the config first; without them its `from_pretrained` parses
the whole tokenizer.json in Python to find them (0.4 s for SmolLM2's 3.5 MB, at every start)
before the Rust tokenizer parses the file again. Either way it builds the same tokenizer (the same
added tokens with the same fields). True when it wrote; a directory without those files, one
whose files do not parse, or one that cannot be written (checked before the parse) is left as it is
(False).
Only for directories dflash2 made (the built-in targets' cache, conversions): never a user's.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from dflash2.files.atomic import write_json

CONFIG, TOKENIZER = "tokenizer_config.json", "tokenizer.json"
FIELD = "added_tokens_decoder"


def record_added_tokens(directory: str | Path) -> bool:
    directory = Path(directory)
    try:
        config = json.loads((directory / CONFIG).read_text(encoding="utf-8"))
        if not isinstance(config, dict) or FIELD in config or not os.access(directory, os.W_OK):
            return False    # recorded already, or cannot be (then no start pays for parsing the file twice)
        added = json.loads((directory / TOKENIZER).read_text(encoding="utf-8")).get("added_tokens")
        if not isinstance(added, list) or not all(isinstance(t, dict) and isinstance(t.get("id"), int) for t in added):
            return False
        config[FIELD] = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}
        write_json(directory / CONFIG, config)
    except (OSError, ValueError, RecursionError):
        return False
    return True

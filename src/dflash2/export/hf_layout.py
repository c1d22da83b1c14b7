"""The published safetensors layout: `config.json` + `model.safetensors` (docs/spec.md §2.2 names).

Contract: `write_checkpoint(model, config_dict, directory, dtype)` writes the draft's own tensors,
exactly the names and shapes of docs/spec.md §2.2 (no `model.` prefix, no embedding table, no LM head),
cast to `dtype`, with safetensors metadata `{"format": "pt"}`, and the given config. It writes into
`directory` as it is (the caller makes that a temporary directory swapped in atomically) and
returns the files written.
"""
from __future__ import annotations

import json
from pathlib import Path

from dflash2.runtime.dtypes import DTYPES
from dflash2.model.draft import DFlash2DraftModel
from dflash2.files.weights import save_safetensors


def write_checkpoint(model: DFlash2DraftModel, config_dict: dict, directory: Path, dtype: str) -> list[Path]:
    torch_dtype = DTYPES[dtype]
    state = {name: tensor.detach().to(torch_dtype).contiguous() for name, tensor in model.state_dict().items()}
    config_file, weights_file = directory / "config.json", directory / "model.safetensors"
    config_file.write_text(json.dumps(config_dict, indent=2) + "\n")
    save_safetensors(state, weights_file)
    return [config_file, weights_file]

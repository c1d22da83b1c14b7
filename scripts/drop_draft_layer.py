"""A shallower draft from a trained one: the same checkpoint without one of its layers.

Usage: PYTHONPATH=src python scripts/drop_draft_layer.py DRAFT LAYER OUT

Writes to OUT (a new directory; an existing one is refused) the draft of DRAFT with layer LAYER
(0-based) removed: every other tensor as it was (the context projection, the remaining layers, the
final norm, the selector, the draft vocabulary), `num_hidden_layers` and `layer_types` one shorter,
in DRAFT's dtype. The result is a starting point for training (`draft.init_from=OUT
draft.num_layers=N-1`, TRAINING.md section 5, "Draft depth"), not a draft to ship as it is.
"""
from __future__ import annotations

import sys
from pathlib import Path

from torch import nn

from dflash2.argparsing import run_command
from dflash2.errors import require
from dflash2.files.weights import safetensors_header
from dflash2.model.draft import DFlash2DraftModel


def main(argv: list[str]) -> None:
    require(len(argv) == 3, "usage: drop_draft_layer.py DRAFT LAYER OUT")
    source, layer, out = Path(argv[0]), argv[1], Path(argv[2])
    require(layer.isdigit(), f"LAYER must be a layer index (0, 1, ...), got '{layer}'")
    require(not out.exists(), f"'{out}' exists; give a new directory")
    bf16 = any(dtype == "BF16" for dtype, _ in safetensors_header(source / "model.safetensors", "DRAFT").values())
    draft = DFlash2DraftModel.from_pretrained(source)
    n = draft.config.num_hidden_layers
    require(int(layer) < n and n > 1, f"'{source}' has layers 0..{n - 1}; cannot drop layer {layer}")
    keep = [i for i in range(n) if i != int(layer)]
    draft.layers = nn.ModuleList(draft.layers[i] for i in keep)
    draft.config.num_hidden_layers = len(keep)
    draft.config.layer_types = [draft.config.layer_types[i] for i in keep]
    (draft.bfloat16() if bf16 else draft).save_pretrained(out)
    check = DFlash2DraftModel.from_pretrained(out)
    print(f"wrote {out}: {check.config.num_hidden_layers} layers (layer {layer} of {n} dropped), "
          f"{check.num_parameters():,} parameters")


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:]))

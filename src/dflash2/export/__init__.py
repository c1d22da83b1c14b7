"""Exporting a draft for the engines people deploy on (`dflash2 export`).

Contract: `export_draft(ExportSettings(...)) -> ExportResult` writes one of three forms of a draft
checkpoint into a new directory, atomically, never over something a user made (a non-empty
`out` needs `force`):

- `dflash2`: the published DFlash2 layout (`config.json` + `model.safetensors`) with a complete,
  engine-facing config; a draft that lacks the convolutions or the selector gets them in their
  neutral form, so every engine computes what the draft computes (`neutral.py`);
- `dflash-v1`: convolutions and selector removed, `DFlashDraftModel`, for engines that only run
  DFlash v1 (vLLM's CPU build); what this costs in acceptance is measured (`acceptance_cost.py`);
- `gguf`: one GGUF file for llama.cpp's `--spec-type draft-dflash`, with the tensor names,
  metadata keys and tensor types of llama.cpp's DFlash converter (`gguf_format.py`) and the
  target's own tokenizer (`gguf_vocab.py`).

Module map: `settings.py` (typed settings and results), `engine_config.py` (the config.json an
engine reads), `neutral.py` (completing or stripping parts), `hf_layout.py` (safetensors
directory), `gguf_format.py` + `gguf_vocab.py` (GGUF), `acceptance_cost.py`, `exporter.py` (the
steps in order), `command.py` (the command line).
"""
from dflash2.export.exporter import export_draft
from dflash2.export.settings import FORMS, AcceptanceCost, ExportResult, ExportSettings

__all__ = ["FORMS", "AcceptanceCost", "ExportResult", "ExportSettings", "export_draft"]

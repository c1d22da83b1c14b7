"""Putting a target and a draft together: what every command (generate, bench, analyze,
regenerate) does first.

Contract:
- `new_draft(model, tokenizer, shape=DraftShape(), seed=0)`: a correctly shaped, freshly
  initialised (untrained) draft from the draft factory (`model.factory.create_draft`).
- `shipped_draft_path(target_name)`: the trained draft shipped in the package for a built-in
  target, or None.
- `load_decoder(target, draft, device, dtype, no_draft, draft_dtype, speculate)` -> `Pipeline` with the decoder, the
  tokenizer, the stop tokens and a one-line description of the draft in use ("untrained" when no
  trained draft exists for that target).
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from dflash2.targets.chat import choose_mask_token, stop_token_ids
from dflash2.model.draft import DFlash2DraftModel, read_config
from dflash2.model.factory import create_draft
from dflash2.model.shape import DEFAULT_SHAPE, DraftShape, target_text_config
from dflash2.decoding.engine import SpeculativeDecoder
from dflash2.decoding.policy import SPECULATE_MODES
from dflash2.errors import require
from dflash2.decoding.target import TargetAdapter
from dflash2.targets.builtin import BUILTIN_TARGETS, load_target

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    require(name in DTYPES, f"unknown dtype '{name}' (choose from float32, bfloat16, float16)")
    return DTYPES[name]


def cpu_has_native_bf16() -> bool:
    """True when this CPU runs bf16 matmuls natively (avx512_bf16 / AMX through oneDNN)."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def draft_dtype_for(name: str, device: str, target_dtype: torch.dtype) -> torch.dtype:
    """`auto`: bfloat16 on CPUs with native bf16 matmul (there the draft is memory-bound), else the
    target's dtype: on CUDA a small draft is launch-bound and ran faster in fp32 than in bf16 (H200,
    BENCHMARKS.md section 4), while a large target in bf16 gets a bf16 draft. The draft's precision
    cannot change the output (the target decides every token)."""
    if name != "auto":
        return parse_dtype(name)
    if device == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    return target_dtype


def new_draft(model, tokenizer, shape: DraftShape = DEFAULT_SHAPE, seed: int = 0) -> DFlash2DraftModel:
    """An untrained draft of `shape` (default: the published shape) for `model`, in eval mode."""
    mask = choose_mask_token(tokenizer, target_text_config(model.config).vocab_size)
    return create_draft(model.config, shape, mask_token_id=mask, seed=seed).eval()


def shipped_draft_path(target_name: str) -> Path | None:
    path = Path(str(resources.files("dflash2") / "checkpoints" / f"{target_name}-dflash2"))
    return path if (path / "config.json").is_file() else None


@dataclass
class Pipeline:
    decoder: SpeculativeDecoder
    tokenizer: object
    stop_token_ids: tuple[int, ...]
    draft_description: str
    trained_draft: bool


def load_decoder(target: str = "smollm2", draft: str | None = None, device: str = "cpu",
                 dtype: str = "float32", no_draft: bool = False, draft_dtype: str = "auto",
                 speculate: str = "auto") -> Pipeline:
    require(speculate in SPECULATE_MODES, f"--speculate must be one of {', '.join(SPECULATE_MODES)}, got '{speculate}'")
    torch_dtype = parse_dtype(dtype)
    draft_torch_dtype = draft_dtype_for(draft_dtype, device, torch_dtype)
    if draft is not None and not no_draft:  # fail on a bad draft before the (slow) target load
        require(Path(draft).is_dir(), f"draft '{draft}' is not a directory with config.json and weights")
        read_config(draft)
    require(device == "cpu" or device.startswith("cuda") or device == "mps", f"unknown device '{device}'")
    require(not device.startswith("cuda") or torch.cuda.is_available(), f"device '{device}' requested but CUDA is not available")
    model, tokenizer = load_target(target, device=device, dtype=torch_dtype)
    stops = stop_token_ids(tokenizer, model.config)
    if no_draft:
        return Pipeline(SpeculativeDecoder(TargetAdapter(model)), tokenizer, stops, "none (autoregressive)", False)
    trained = True
    if draft is None:
        shipped = shipped_draft_path(target) if target in BUILTIN_TARGETS else None
        if shipped is None:
            draft_model = new_draft(model, tokenizer)
            description, trained = f"untrained DFlash2 draft for '{target}' (no trained draft ships for it yet)", False
        else:
            draft_model, description = DFlash2DraftModel.from_pretrained(shipped, draft_torch_dtype, device), f"shipped {shipped.name}"
    else:
        draft_model, description = DFlash2DraftModel.from_pretrained(draft, draft_torch_dtype, device), f"{draft}"
    draft_model = draft_model.to(device=device, dtype=draft_torch_dtype)
    kind = "DFlash2" if draft_model.config.is_dflash2 else "DFlash v1"
    adapter = TargetAdapter(model, draft_model.config.target_layer_ids)
    return Pipeline(SpeculativeDecoder(adapter, draft_model, speculate=speculate), tokenizer, stops,
                    f"{description} [{kind}, {str(draft_torch_dtype).removeprefix('torch.')}]", trained)

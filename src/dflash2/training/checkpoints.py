"""Training checkpoints: the draft in its published format plus the trainer state, written atomically.

Contract:
- Layout of a run directory:
    checkpoints/step-00000500/draft/{config.json, model.safetensors}   fp32 (exact weights)
    checkpoints/step-00000500/trainer_state.pt                          optimizer, scheduler, step, ...
    checkpoints/latest                                                  name of the newest checkpoint
    final/{config.json, model.safetensors}                              exported in train.save_dtype
  Each checkpoint directory appears whole or not at all (`atomic_directory`), `latest` is replaced
  atomically after it, and only the newest `keep` checkpoints are kept.
- `gather_state(module, optimizer, parallel)` returns full (unsharded, CPU) draft and optimizer
  state dicts on every rank; with FSDP it is a collective, so all ranks must call it.
- `save_checkpoint(run_dir, step, draft_state, optim_state, trainer_state, config, keep)` (rank 0).
- `latest_checkpoint(run_dir)` -> the newest complete checkpoint directory, checked without loading
  it (pointer, files, weights header); `load_latest(run_dir)` -> (checkpoint dir, draft state,
  trainer_state dict). Both raise a one-line DFlash2Error for a missing, incomplete or damaged one.
- `restore_state(module, optimizer, draft_state, optim_state, parallel)` puts them back.
- `export_draft(draft_state, config, path, dtype)` writes a loadable draft (`from_pretrained`)
  through `DFlash2DraftModel.save_pretrained`, cast to `dtype` (bf16 halves the shipped size).
- `rng_state()` / `set_rng_state(state)` capture torch (CPU, CUDA), Python and NumPy generators.
"""
from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from dflash2.model.config import DFlash2Config
from dflash2.model.draft import DFlash2DraftModel
from dflash2.errors import DFlash2Error, require
from dflash2.files.atomic import atomic_directory, atomic_write
from dflash2.files.weights import safetensors_header, save_torch

PREFIX = "draft."  # DraftTrainStep holds the draft under this attribute


def _unwrap(module):
    return module.module if isinstance(module, torch.nn.parallel.DistributedDataParallel) else module


def _fsdp_options():
    # torch.distributed.checkpoint (here and below) loads only for FSDP runs: it is slow to import
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def gather_state(module, optimizer, parallel: str) -> tuple[dict, dict]:
    """Full draft state (names as in the checkpoint format) and optimizer state."""
    inner = _unwrap(module)
    if parallel == "fsdp" and torch.distributed.is_initialized():
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
        model_state = get_model_state_dict(inner, options=_fsdp_options())
        optim_state = get_optimizer_state_dict(inner, optimizer, options=_fsdp_options())
    else:
        model_state = inner.state_dict()
        optim_state = optimizer.state_dict()
    draft_state = {k[len(PREFIX):]: v.detach().to("cpu") for k, v in model_state.items() if k.startswith(PREFIX)}
    return draft_state, optim_state


def restore_state(module, optimizer, draft_state: dict, optim_state: dict, parallel: str) -> None:
    inner = _unwrap(module)
    full = {PREFIX + k: v for k, v in draft_state.items()}
    if parallel == "fsdp" and torch.distributed.is_initialized():
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(inner, full, options=options)
        set_optimizer_state_dict(inner, optimizer, optim_state, options=options)
        return
    missing, unexpected = inner.load_state_dict(full, strict=False)
    require(not [m for m in missing if m.startswith(PREFIX)], f"checkpoint lacks draft tensor(s) {missing[:1]}")
    optimizer.load_state_dict(optim_state)


def export_draft(draft_state: dict, config: DFlash2Config, path: str | Path, dtype: torch.dtype) -> int:
    """Write a `from_pretrained`-loadable draft; returns the size of its weights file in bytes."""
    with torch.device("meta"):
        model = DFlash2DraftModel(config)
    model.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in draft_state.items()},
                          assign=True, strict=True)
    model.save_pretrained(path)
    return (Path(path) / "model.safetensors").stat().st_size


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


STEP_NAME = re.compile(r"step-\d{8,}")
TEMPORARY_NAMES = r"step-\d{8,}|latest"  # what this module writes atomically in checkpoints/


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: str | Path, step: int, draft_state: dict, optim_state: dict, trainer_state: dict,
                    config: DFlash2Config, keep: int) -> Path:
    root = checkpoint_root(run_dir)
    name = step_name(step)
    with atomic_directory(root / name) as tmp:
        export_draft(draft_state, config, tmp / "draft", torch.float32)
        save_torch({**trainer_state, "optimizer": optim_state, "step": step}, tmp / "trainer_state.pt")
    with atomic_write(root / "latest", "w") as handle:
        handle.write(name + "\n")
    old = sorted(p for p in root.glob("step-*") if p.is_dir() and p.name != name)
    for stale in old[:max(0, len(old) - (keep - 1))]:
        shutil.rmtree(stale, ignore_errors=True)
    return root / name


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The newest complete checkpoint of a run (cheap checks, nothing loaded), or a DFlash2Error."""
    root = checkpoint_root(run_dir)
    pointer = root / "latest"
    require(pointer.is_file(), f"--resume: no checkpoint in '{root}' (train.output_dir={run_dir})")
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        name = ""
    path = root / name
    require(bool(name) and STEP_NAME.fullmatch(name) is not None and path.is_dir(),
            f"--resume: '{pointer}' does not name a checkpoint directory of '{root}'")
    for part in ("trainer_state.pt", "draft/model.safetensors"):
        require((path / part).is_file(), f"--resume: checkpoint '{path}' is incomplete (no {part})")
    safetensors_header(path / "draft" / "model.safetensors", f"--resume: checkpoint '{path}'")
    return path


def load_latest(run_dir: str | Path) -> tuple[Path, dict, dict]:
    path = latest_checkpoint(run_dir)
    try:
        draft_state = load_file(str(path / "draft" / "model.safetensors"))
        trainer_state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    except Exception as err:  # a damaged pickle or tensor file raises many kinds of errors
        raise DFlash2Error(f"--resume: checkpoint '{path}' is damaged ({type(err).__name__}: "
                           f"{str(err).splitlines()[0] if str(err) else ''}); remove it and point "
                           f"'{checkpoint_root(run_dir) / 'latest'}' at an earlier one") from None
    require(isinstance(trainer_state, dict) and "step" in trainer_state,
            f"--resume: checkpoint '{path}' has no trainer state")
    return path, draft_state, trainer_state

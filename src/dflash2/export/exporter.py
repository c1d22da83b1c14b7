"""One export, step by step: check, load, complete or strip, write atomically, measure.

Contract: `export_draft(settings, pipeline=None)`
1. validates everything that needs no weights (`ExportSettings.validate`, the draft's config,
   the form the draft can take, the target for the tokenizer / the measurement), so bad input
   fails with one line before anything slow loads;
2. loads the draft in fp32 and brings it into the engine form (`neutral.py`): `dflash2` completes
   a missing part neutrally, `dflash-v1` strips both parts, `gguf` completes DFlash2 drafts and
   keeps v1 drafts as they are;
3. writes the form into a temporary directory beside `settings.out` and swaps it in only when
   complete (`fileio.atomic_directory`): nothing half-written. Into an existing, non-empty `out`
   (only with `force`) it replaces just the files an export writes (`OWN_FILES`); everything else
   there stays;
4. for `dflash-v1` of a DFlash2 draft, or a reduced-vocabulary draft (d2t / t2d: engines score
   the whole vocabulary, so the export always drops the mapping), with `measure_prompts > 0`,
   measures the acceptance cost on the target
   (`pipeline`, or `load_decoder(settings.target, settings.draft)`), decoding with the re-loaded
   export.
Returns an `ExportResult`.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from dflash2.errors import require
from dflash2.export import acceptance_cost, gguf_vocab, neutral
from dflash2.export.engine_config import engine_config
from dflash2.export.gguf_format import write_gguf
from dflash2.export.hf_layout import write_checkpoint
from dflash2.export.settings import GGUF_FILE, ExportResult, ExportSettings
from dflash2.files.atomic import atomic_directory, remove_own
from dflash2.model.config import DFlash2Config
from dflash2.model.draft import DFlash2DraftModel, read_config
from dflash2.pipeline import Pipeline, load_decoder
from dflash2.targets.builtin import BUILTIN_TARGETS
from dflash2.files.weights import stored_dtype, weight_files


def _check_target_for_measurement(target: str) -> None:
    require(target in BUILTIN_TARGETS or Path(target).is_dir() or "/" in target,
            f"--target '{target}': give a built-in name ({', '.join(BUILTIN_TARGETS)}), a local Hugging Face "
            "directory or a hub id, or --measure-prompts 0 to skip the measurement")


OWN_FILES = ("config.json", "model.safetensors", GGUF_FILE)   # what any export form writes


@contextmanager
def _output_directory(out: Path) -> Iterator[Path]:
    """A fresh temporary directory that becomes `out` when complete. An existing, non-empty `out`
    (--force) keeps everything but the export's own files, which are replaced."""
    if not out.is_dir() or not any(out.iterdir()):
        with atomic_directory(out) as tmp:
            yield tmp
        return
    staging = out.parent / f".{out.name}.export.tmp"
    with atomic_directory(staging) as tmp:
        yield tmp
    try:
        remove_own(out, OWN_FILES)
        for item in staging.iterdir():
            os.replace(item, out / item.name)
    finally:
        remove_own(out.parent, [staging.name])


def _measures(settings: ExportSettings, config: DFlash2Config) -> bool:
    changed = (settings.form == "dflash-v1" and config.is_dflash2) or config.draft_vocab_size is not None
    # a GGUF is measured where it runs (llama.cpp's advice), not reloaded here as a checkpoint
    return changed and settings.measure_prompts > 0 and settings.form != "gguf"


def check(settings: ExportSettings) -> DFlash2Config:
    """Step 1: every check that needs no weights; returns the draft's config."""
    settings.validate()
    config = read_config(settings.draft)
    weight_files(settings.draft)
    if settings.form == "dflash2":
        neutral.dflash2_config(config)
    if settings.form == "gguf":
        gguf_vocab.check_target_gguf(settings.target)
        if config.is_dflash2:
            neutral.dflash2_config(config)
    if _measures(settings, config):
        _check_target_for_measurement(settings.target)
    return config


def engine_form(model: DFlash2DraftModel, form: str) -> neutral.PartsChange:
    if model.config.draft_vocab_size is not None:  # engines score the whole vocabulary: drop the mapping
        whole = engine_form(neutral.full_vocabulary(model), form)
        whole.dropped.insert(0, f"draft vocabulary ({model.config.draft_vocab_size} tokens)")
        return whole
    if form == "dflash-v1":
        return neutral.for_dflash_v1(model)
    if form == "gguf" and not model.config.is_dflash2:
        return neutral.PartsChange(model)
    return neutral.for_dflash2(model)


def export_draft(settings: ExportSettings, pipeline: Pipeline | None = None) -> ExportResult:
    config = check(settings)
    dtype = stored_dtype(settings.draft) if settings.dtype == "auto" else settings.dtype
    model = DFlash2DraftModel.from_pretrained(settings.draft, dtype=torch.float32)
    change = engine_form(model, settings.form)
    exported = change.model
    with _output_directory(settings.out) as tmp:
        if settings.form == "gguf":
            with gguf_vocab.target_gguf(settings.target) as path:
                vocab = gguf_vocab.read_vocab(path)
            require(vocab.n_tokens == exported.config.vocab_size,
                    f"target GGUF '{vocab.source}' has {vocab.n_tokens} tokens, the draft's vocab_size is "
                    f"{exported.config.vocab_size}: this is not the draft's target")
            count = write_gguf(exported, vocab, tmp / GGUF_FILE, dtype)
            names = [GGUF_FILE]
        else:
            files = write_checkpoint(exported, engine_config(exported.config, dtype), tmp, dtype)
            count, names = len(exported.state_dict()), [f.name for f in files]
    result = ExportResult(settings.form, settings.out, [settings.out / n for n in names],
                          exported.config.architecture, count, dtype, change.completed, change.dropped)
    if settings.form == "dflash-v1" and not config.is_dflash2:
        result.notes.append("the draft is already DFlash v1: nothing was removed")
    if _measures(settings, config):
        print(f"# measuring what the export costs in acceptance: {settings.measure_prompts} prompts x "
              f"{settings.measure_tokens} tokens with the draft and with the export (--measure-prompts 0 skips it)",
              file=sys.stderr)
        pipe = pipeline or load_decoder(settings.target, str(settings.draft), draft_dtype="float32",
                                        proposer="draft", lattice=False)
        draft = pipe.decoder.draft
        reloaded = DFlash2DraftModel.from_pretrained(settings.out, dtype=draft.fc.weight.dtype,
                                                     device=draft.fc.weight.device)
        prompts = acceptance_cost.measurement_prompts(pipe.tokenizer, settings.measure_prompts)
        result.cost = acceptance_cost.measure_cost(pipe, reloaded, prompts, settings.measure_tokens)
    return result

"""What `dflash2 train` checks and prepares before the target loads: the run directory and the inputs.

Contract:
- `RUN_FILES` is everything a training run writes into `train.output_dir`.
- `prepare_run_dir(cfg, resume, overwrite, main_rank=True)`:
  - `--resume` needs a complete checkpoint there (`checkpoints.latest_checkpoint`); it cannot be
    combined with `--overwrite`;
  - without `--resume`, an existing non-empty output directory is refused
    (`fileio.refuse_existing_output`): a second run would restart at step 0, append duplicate
    steps to metrics.jsonl and prune the first run's checkpoints. `--overwrite` starts again
    there and removes only `RUN_FILES`; anything else in the directory stays;
  - on every run, the leftovers of a process killed while writing a checkpoint or the final
    export (temporary directories of our own naming pattern, `fileio.remove_stale_temporaries`)
    are removed, never anything else.
  Only the main rank removes anything. Returns the names it removed.
- `check_inputs(cfg)`: every `data.train` / `data.eval` entry is a shard directory whose manifest
  reads, and `draft.init_from` is a loadable draft (config, weights, finite values): one-line
  errors naming the config key, before the target loads.
"""
from __future__ import annotations

from pathlib import Path

from dflash2.data.shards import load_manifest
from dflash2.errors import DFlash2Error, require
from dflash2.fileio import refuse_existing_output, remove_own, remove_stale_temporaries
from dflash2.model.draft import DFlash2DraftModel
from dflash2.training import checkpoints as ckpt
from dflash2.training.config import TrainConfig

RUN_FILES = ("checkpoints", "metrics.jsonl", "final", "curves.png", "train_config.yaml", "summary.json")
_RUN_TEMPORARIES = "|".join(name.replace(".", r"\.") for name in RUN_FILES)


def prepare_run_dir(cfg: TrainConfig, resume: bool, overwrite: bool, main_rank: bool = True) -> list[str]:
    run_dir = Path(cfg.train.output_dir)
    require(not (resume and overwrite), "give at most one of --resume (continue the run in train.output_dir) "
                                        "and --overwrite (start it again)")
    if resume:
        ckpt.latest_checkpoint(run_dir)
    else:
        refuse_existing_output(run_dir, overwrite, "train.output_dir", "--resume to continue that run, or "
                               "--overwrite", f"the run's own files ({', '.join(RUN_FILES)})")
    if not main_rank:
        return []
    removed = remove_stale_temporaries(run_dir, _RUN_TEMPORARIES)
    removed += [f"checkpoints/{name}" for name in
                remove_stale_temporaries(ckpt.checkpoint_root(run_dir), ckpt.TEMPORARY_NAMES)]
    if overwrite:
        removed += remove_own(run_dir, RUN_FILES)
    return removed


def check_inputs(cfg: TrainConfig) -> None:
    for key, dirs in (("data.train", cfg.data.train), ("data.eval", cfg.data.eval)):
        for directory in dirs:
            require(Path(directory).is_dir(), f"config key '{key}': '{directory}' is not a directory")
            try:
                load_manifest(directory)
            except DFlash2Error as err:
                raise DFlash2Error(f"config key '{key}': {err}") from None
    if cfg.draft.init_from:
        try:
            DFlash2DraftModel.from_pretrained(cfg.draft.init_from)
        except DFlash2Error as err:
            raise DFlash2Error(f"config key 'draft.init_from': {err}") from None

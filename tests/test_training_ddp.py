"""Data parallel: 2 gloo processes (DDP) end where 1 process with the same global batch ends.

Tolerance: the ranks pad their sequences to different lengths and sum gradients in another order,
so parameters agree to float32 round-off amplified by three AdamW steps, not bit for bit; we
require max |difference| <= 1e-5 (measured ~8e-7; one update is ~6e-4).
"""
from __future__ import annotations

import os
import socket

import torch
import torch.multiprocessing as mp

from dflash2.tiny import tiny_target
from dflash2.training.trainer import Trainer
from training_util import small_config, synthetic_sequences, one_thread  # noqa: F401 (autouse fixture)

STEPS = 3


def _config(out_dir):
    return small_config(out_dir, train={"steps": STEPS, "batch_size": 4, "grad_accum": 1, "log_every": 1,
                                        "checkpoint_every": None, "save_dtype": "fp32"})


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    trainer = Trainer(_config(out_dir), target_model=tiny_target("llama"), train_sequences=synthetic_sequences(12))
    trainer.train()
    if rank == 0:
        torch.save(trainer.draft.state_dict(), os.path.join(out_dir, "state.pt"))
    trainer.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_gloo_ranks_match_one_process(tmp_path):
    single_dir, ddp_dir = tmp_path / "single", tmp_path / "ddp"
    trainer = Trainer(_config(single_dir), target_model=tiny_target("llama"), train_sequences=synthetic_sequences(12))
    trainer.train()
    reference = {k: v.clone() for k, v in trainer.draft.state_dict().items()}
    trainer.close()

    ddp_dir.mkdir()
    mp.spawn(_worker, args=(2, _free_port(), str(ddp_dir)), nprocs=2, join=True)
    parallel = torch.load(ddp_dir / "state.pt")
    worst = max(float((reference[k] - parallel[k]).abs().max()) for k in reference)
    assert worst <= 1e-5, worst
    moved = max(float((reference[k] - v).abs().max()) for k, v in
                Trainer(_config(tmp_path / "fresh"), target_model=tiny_target("llama"),
                        train_sequences=synthetic_sequences(12)).draft.state_dict().items())
    assert moved > 1e-4  # training did move the weights, so the comparison means something

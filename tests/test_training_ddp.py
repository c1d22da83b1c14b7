"""Data parallel: 2 gloo processes end where 1 process with the same global batch ends, with DDP and
with FSDP2 (`fully_shard`, interrupted and resumed half way, so sharded optimizer state round-trips).

Tolerance: the ranks pad their sequences to different lengths and sum gradients in another order,
so parameters agree to float32 round-off amplified by three AdamW steps, not bit for bit; we
require max |difference| <= 1e-5 (measured ~1e-6; one update is ~6e-4).
"""
from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from training_util import small_config, synthetic_sequences
from dflash2.targets.tiny import tiny_target
from dflash2.training.trainer import Trainer

STEPS = 3


def _config(out_dir, parallel="ddp"):
    return small_config(out_dir, train={"steps": STEPS, "batch_size": 4, "grad_accum": 1, "log_every": 1,
                                        "checkpoint_every": None, "save_dtype": "fp32", "parallel": parallel})


def _train(out_dir, parallel="ddp", resume=False, stop_at=None):
    trainer = Trainer(_config(out_dir, parallel), target_model=tiny_target("llama"),
                      train_sequences=synthetic_sequences(12))
    trainer.train(resume=resume, stop_at=stop_at)
    state = {k: v.detach().clone() for k, v in trainer.draft.state_dict().items()}
    trainer.close()
    return state


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        ddp = _train(os.path.join(out_dir, "ddp"), "ddp")
        fsdp_dir = os.path.join(out_dir, "fsdp")
        _train(fsdp_dir, "fsdp", stop_at=2)
        _train(fsdp_dir, "fsdp", resume=True)
        if rank == 0:
            torch.save(ddp, os.path.join(out_dir, "ddp.pt"))
        dist.barrier()  # no rank closes its connections while the other still uses them
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_gloo_ranks_match_one_process(tmp_path):
    from dflash2.model.draft import DFlash2DraftModel

    reference = _train(tmp_path / "single")
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    results = {"ddp": torch.load(tmp_path / "ddp.pt"),
               "fsdp": DFlash2DraftModel.from_pretrained(tmp_path / "fsdp" / "final").state_dict()}
    for mode, parallel in results.items():
        worst = max(float((reference[k] - parallel[k]).abs().max()) for k in reference)
        assert worst <= 1e-5, (mode, worst)
    fresh = Trainer(_config(tmp_path / "fresh"), target_model=tiny_target("llama"),
                    train_sequences=synthetic_sequences(12))
    moved = max(float((reference[k] - v).abs().max()) for k, v in fresh.draft.state_dict().items())
    fresh.close()
    assert moved > 1e-4  # training did move the weights, so the comparison means something

"""Process-group setup and model wrapping for data-parallel training.

Contract:
- `Dist.from_env(device_kind)`: under `torchrun` (WORLD_SIZE > 1 in the environment) initialise the
  default process group, gloo on CPU and nccl on CUDA, and pin each rank to cuda:LOCAL_RANK; in a
  plain process it is a no-op with rank 0 of 1. `close()` waits for every rank, then destroys a
  group this object created.
- `wrap(module, mode)`: "ddp" -> DistributedDataParallel (gradients all-reduced and averaged
  across ranks; buffers are not broadcast, every rank builds the same ones); "fsdp" -> FSDP2 `fully_shard` on the whole training module (parameters,
  gradients and optimizer state sharded across ranks, gathered for the forward). The draft's
  context pass calls per-layer projections outside the layers' own forward, so sharding is done
  at the root only. With one process the module is returned unwrapped.
- `all_reduce_sum(tensor)` sums across ranks in place (no-op with one process);
  `broadcast_object(obj)` sends rank 0's picklable object to every rank.
- Both wrappers AVERAGE gradients, so the trainer scales each rank's loss by the world size: its
  loss is already divided by the global normaliser (see `losses.py`).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from dflash2.errors import require


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device_kind: str = "auto") -> "Dist":
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
        if device_kind == "auto":
            device_kind = "cuda" if torch.cuda.is_available() else "cpu"
        require(device_kind != "cuda" or torch.cuda.is_available(),
                "config key 'train.device'='cuda' but no CUDA device is available")
        if device_kind == "cuda":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        owns = False
        if world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
            owns = True
        if dist.is_initialized():
            world, rank = dist.get_world_size(), dist.get_rank()
        return cls(rank, world, local_rank, device, owns)

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            # Every rank reaches here before any rank tears its group down: gloo's threads abort
            # the process (SIGABRT) when a peer's connections close under them.
            dist.barrier()
            dist.destroy_process_group()
            self.owns_group = False

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast_object(self, obj):
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def wrap(self, module: nn.Module, mode: str) -> nn.Module:
        if not self.enabled:
            return module
        if mode == "fsdp":
            from torch.distributed.fsdp import fully_shard   # FSDP2 runs only: slow to import
            fully_shard(module)
            return module
        ids = [self.device.index] if self.device.type == "cuda" else None
        # No buffer broadcast: the training module's buffers (position weights, the target's borrowed
        # embedding and LM head) are the same on every rank, and broadcasting the head every
        # forward would copy a vocabulary-sized matrix per micro-batch.
        return nn.parallel.DistributedDataParallel(module, device_ids=ids, broadcast_buffers=False)

    @staticmethod
    def no_sync(wrapped: nn.Module, last_micro_batch: bool):
        """Skip the gradient all-reduce on all but the last micro-batch of a step."""
        if last_micro_batch:
            return contextlib.nullcontext()
        if isinstance(wrapped, nn.parallel.DistributedDataParallel):
            return wrapped.no_sync()
        if hasattr(wrapped, "set_requires_gradient_sync"):  # FSDP2
            wrapped.set_requires_gradient_sync(False)
            return _restore_sync(wrapped)
        return contextlib.nullcontext()


@contextlib.contextmanager
def _restore_sync(module):
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)

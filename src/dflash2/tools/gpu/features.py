"""The GPU path's feature phase: every training sequence's target signals cached in padded batches.

Contract: `fill_features(trainer, cfg, sequences, clock, reserve, batch_tokens)` stores, for every
sequence not cached yet, the target's features and top `loss.distill_top_k` logits as the
trainer's `FeatureSource` entries (so one entry serves runs with and without distillation),
longest first, in padded passes of about `batch_tokens` tokens (on a GPU one pass per sequence is
launch-bound). It stops while `clock.left()` is under `reserve` seconds and returns
{"computed", "tokens", "batched", "complete"[, "left"]}; a later call continues.
"""
from __future__ import annotations


def fill_features(trainer, cfg, sequences, clock, reserve: float, batch_tokens: int) -> dict:
    """Cache every sequence's target signals (features and the target's top `loss.distill_top_k`
    logits, so one entry serves runs with and without distillation) with padded batched passes:
    on a GPU one pass per sequence is launch-bound. Entries are `FeatureSource`'s own."""
    import torch

    from dflash2.training.features import FeatureSource
    from dflash2.training.trainer import autocast_dtype

    top_k = cfg.loss.distill_top_k
    source = FeatureSource(trainer.adapter, cfg.data.feature_cache_dir, trainer.features.root.name, top_k=top_k)
    if not (hasattr(source, "_path") and hasattr(source, "_store")):  # the cache's layout moved: slow but right
        return {"computed": source.fill(sequences, progress=False), "batched": False, "complete": True}
    todo = sorted((torch.as_tensor(ids).long() for ids, _ in sequences if not source._path(ids).is_file()),
                  key=len, reverse=True)
    device = trainer.adapter.device
    dtype = autocast_dtype(cfg.train.precision, device)
    computed, tokens = 0, 0
    while todo:
        if clock.left() < reserve:
            return {"computed": computed, "tokens": tokens, "batched": True, "complete": False, "left": len(todo)}
        width = len(todo[0])
        count = max(1, min(len(todo), batch_tokens // width))
        rows, todo = todo[:count], todo[count:]
        ids = torch.zeros(count, width, dtype=torch.long)
        mask = torch.zeros(count, width, dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, :len(row)], mask[r, :len(row)] = row, 1
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits, features = trainer.adapter.features(ids.to(device), mask.to(device), with_logits=True)
        top = logits.topk(top_k, dim=-1)
        del logits
        for r, row in enumerate(rows):
            n = len(row)
            source._store(row, {"features": features[r, :n], "top_logits": top.values[r, :n].float(),
                                "top_ids": top.indices[r, :n].to(torch.int32)})
        computed, tokens = computed + count, tokens + int(mask.sum())
    return {"computed": computed, "tokens": tokens, "batched": True, "complete": True}

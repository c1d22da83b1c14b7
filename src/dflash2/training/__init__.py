"""Training DFlash2 / DFlash drafts for Hugging Face targets (docs/spec.md §4).

Modules, one concept each:
    config       frozen per-section dataclasses, YAML, dotted overrides, validation (`load_config`)
    dataset      shard directories -> (input_ids, loss_mask) pairs; the deterministic step order
    batches      anchor sampling, packed block inputs, labels, block-sparse attention mask
    features     tapped target features: online hooks, optional on-disk cache
    losses       decayed token CE, selector CE, teacher-forced acceptance metrics (`LossStats`)
    acceptance   the acceptance (LK) loss: alpha = sum min(p, q), -log alpha and its gradient on the logits
    draft_step   the draft to train (factory, warm start, init_from) and the one-forward training module
    distributed  process group, DDP / FSDP2 wrapping
    checkpoints  atomic checkpoints, resume state, bf16 export
    metrics_log  JSONL metrics and PNG curves
    head_ce      cross-entropy through the frozen LM head, chunked, its gradient fused in
    preflight    what `dflash2 train` checks before the target loads (run directory, inputs)
    trainer      the loop and `main(argv)` behind `dflash2 train` (`__main__`: `python -m dflash2.training`)
    revocab      a frequency-ranked reduced draft vocabulary for a draft, without training
The remote-GPU job that runs this training lives in `dflash2.tools.gpu`.
"""

"""Training DFlash2 / DFlash drafts for Hugging Face targets (SPEC §4).

Modules, one concept each:
    config       YAML schema, dotted overrides, validation (`load_config`, `TrainConfig`)
    data         shard directories -> (input_ids, loss_mask) pairs; the deterministic step order
    batches      anchor sampling, packed block inputs, labels, block-sparse attention mask
    features     tapped target features: online hooks, optional on-disk cache
    losses       decayed token CE, selector CE, teacher-forced acceptance metrics
    model        draft construction (init, warm start) and the one-forward training module
    distributed  process group, DDP / FSDP2 wrapping
    checkpoints  atomic checkpoints, resume state, bf16 export
    metrics_log  JSONL metrics and PNG curves
    trainer      the loop and `main(argv)` behind `dflash2 train`
"""

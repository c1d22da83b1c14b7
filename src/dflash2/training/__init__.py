"""Training DFlash2 / DFlash drafts for Hugging Face targets (docs/spec.md §4).

Modules, one concept each:
    config       frozen per-section dataclasses, YAML, dotted overrides, validation (`load_config`)
    dataset      shard directories -> (input_ids, loss_mask) pairs; the deterministic step order
    batches      anchor sampling, packed block inputs, labels, block-sparse attention mask
    features     tapped target features: online hooks, optional on-disk cache
    losses       decayed token CE, selector CE, teacher-forced acceptance metrics (`LossStats`)
    acceptance   the acceptance (LK) loss: alpha = sum min(p, q), -log alpha and its gradient on the logits
    weighting    per-label weights of the block loss: position decay or D-PACE confidence
    replay       on-policy replay of the blocks verification would reject (`loss.replay_*`)
    draft_step   the draft to train (factory, warm start, init_from) and the one-forward training module
    mtp_step     an MTP head trained by the same trainer: its recursion laid out as blocks
    distributed  process group, DDP / FSDP2 wrapping
    checkpoints  atomic checkpoints, resume state, bf16 export
    metrics_log  JSONL metrics and PNG curves
    head_ce      cross-entropy through the frozen LM head, chunked, its gradient fused in
    preflight    what `dflash2 train` checks before the target loads (run directory, inputs)
    trainer      the loop and `main(argv)` behind `dflash2 train` (`__main__`: `python -m dflash2.training`)
    revocab      a frequency-ranked reduced draft vocabulary for a draft, without training
Making the data it trains on (`dflash2 regenerate`):
    regenerate   the target's own answers to prompts, as token-id shards (here or through `endpoint`)
    prompt_sets  which prompts a run answers, encoded; a user's file; off-policy records
    endpoint     an OpenAI-compatible server as the engine that answers, checked to serve the same target
    data_identity  what a data directory's manifest records of its target, tokenizer and sampling
The remote-GPU job that runs this training lives in `dflash2.tools.gpu`.
"""

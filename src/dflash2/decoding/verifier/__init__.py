"""The target side: a Hugging Face causal LM as the verifier of speculative decoding.

- `adapter`: `TargetAdapter`, one batch in one left-padded KV cache: prefill, add rows, verify a
  block or a token tree, keep each row's accepted tokens (roll back the rest), drop rows.
- `kvcache`: `SlotLayer`, a cache layer that appends in place (rejected slots stay as masked holes).
- `ragged`: the arithmetic of left-padded ragged batches (re-aligning rows, compacting holes).
- `recurrent`: hybrid targets' recurrent layers, each row's state rebuilt at its accepted count.
Models arrive prepared by `dflash2.targets` (`targets.kernels.use_kernels`); nothing here patches them.
"""

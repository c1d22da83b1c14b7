"""Target models: finding, converting and loading them, ready for decoding.

- `builtin`: built-in GGUF targets and their conversion cache; `open_target` / `load_target_model`
  for any local or hub model.
- `kernels`: every change dflash2 makes to a transformers model, applied at load (`use_kernels`):
  `grouped_attention` (grouped-query attention without copying the KV cache) and `delta_rule` (a
  hybrid's Gated DeltaNet rule solved per block, with the trail its roll-back needs).
- `llama`: a Llama of dflash2's own, transformers' arithmetic, for a fast start.
- `chat`: prompt encoding, stop and mask tokens; `tokenizer_files`: a fast tokenizer load.
- `tiny`: random tiny targets, drafts and a tokenizer, for tests.
"""

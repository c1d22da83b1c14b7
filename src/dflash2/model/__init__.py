"""The networks dflash2 defines, and the layers its own Llama shares with them.

- `draft` (with `config`, `shape`, `factory`): the DFlash2 / DFlash draft; `conv`, the
  two-tap dynamic convolutions; `selector`, the path selector; `mask`, block visibility.
- `mtp`, `mtp_checkpoint`: a multi-token-prediction head, and a target's own MTP weights;
  `families`: either kind loaded from its directory.
- Layers: `swiglu`; `projections`, several linear layers that read one input as one matmul (fused,
  oneDNN-packed, or weight-only `quantized`); `packing`, a draft's inference copies of them.
"""

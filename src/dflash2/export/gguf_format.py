"""A draft as llama.cpp's `dflash` GGUF architecture (what its DFlash converter writes).

The installed `gguf` package predates the DFlash architecture, so its names and keys are spelled
out here, as llama.cpp's converter and loader use them:

- tensors (`GGUF_NAMES`): `fc.weight`, `enc.output_norm.weight` (hidden_norm), `output_norm.weight`
  (final norm), the Llama/Qwen3 block names `blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
  attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down}.weight`, the DFlash2 parts
  `blk.N.{attn,ffn}_conv_base` (no `.weight`), `blk.N.{attn,ffn}_conv_proj.weight`,
  `selector_{predecessor,successor,hidden}.weight`. No token_embd / output: llama.cpp shares the
  target's.
- types: F32 for 1-D tensors, `*_norm.weight` and names not ending in `.weight` (the conv base
  kernels); every other matrix in the chosen type (F32, F16 or BF16).
- metadata (`dflash.*`): the Qwen3 hyper-parameters, `attention.causal = false`,
  `block_size`, `target_layers` = target_layer_ids + 1 (llama.cpp taps a layer's *input*, this
  project and the HF checkpoints name the layer whose *output* is tapped), the sliding window and
  its per-layer pattern, the conv / selector sizes for DFlash2 drafts, optional
  embedding / logit scales and softcap; the target's tokenizer with the draft's MASK id
  (`gguf_vocab.py`).

Contract: `write_gguf(model, vocab, path, dtype)` writes one file; `GGUF_NAMES` / `gguf_name`,
`tensor_type` and `metadata` are the single statement of that mapping (the tests read files back
against them). A DFlash2 draft must have both parts (llama.cpp's DFlash2 graph needs both; see
`neutral.py`); a DFlash v1 draft is written without them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType, quants
from gguf.constants import GGML_QUANT_VERSION

from dflash2.export.gguf_vocab import TargetVocab, add_vocab
from dflash2.model.config import DFlash2Config
from dflash2.model.draft import DFlash2DraftModel

ARCH = "dflash"

# (pattern over this project's tensor names, GGUF name template); {0} is the layer index.
GGUF_NAMES: tuple[tuple[str, str], ...] = (
    (r"fc\.weight", "fc.weight"),
    (r"hidden_norm\.weight", "enc.output_norm.weight"),
    (r"norm\.weight", "output_norm.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", "blk.{0}.attn_norm.weight"),
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", "blk.{0}.ffn_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.q_proj\.weight", "blk.{0}.attn_q.weight"),
    (r"layers\.(\d+)\.self_attn\.k_proj\.weight", "blk.{0}.attn_k.weight"),
    (r"layers\.(\d+)\.self_attn\.v_proj\.weight", "blk.{0}.attn_v.weight"),
    (r"layers\.(\d+)\.self_attn\.o_proj\.weight", "blk.{0}.attn_output.weight"),
    (r"layers\.(\d+)\.self_attn\.q_norm\.weight", "blk.{0}.attn_q_norm.weight"),
    (r"layers\.(\d+)\.self_attn\.k_norm\.weight", "blk.{0}.attn_k_norm.weight"),
    (r"layers\.(\d+)\.mlp\.gate_proj\.weight", "blk.{0}.ffn_gate.weight"),
    (r"layers\.(\d+)\.mlp\.up_proj\.weight", "blk.{0}.ffn_up.weight"),
    (r"layers\.(\d+)\.mlp\.down_proj\.weight", "blk.{0}.ffn_down.weight"),
    (r"layers\.(\d+)\.attention_conv\.base_kernel", "blk.{0}.attn_conv_base"),
    (r"layers\.(\d+)\.attention_conv\.kernel_projection\.weight", "blk.{0}.attn_conv_proj.weight"),
    (r"layers\.(\d+)\.mlp_conv\.base_kernel", "blk.{0}.ffn_conv_base"),
    (r"layers\.(\d+)\.mlp_conv\.kernel_projection\.weight", "blk.{0}.ffn_conv_proj.weight"),
    (r"candidate_selector\.predecessor_codebook", "selector_predecessor.weight"),
    (r"candidate_selector\.successor_codebook", "selector_successor.weight"),
    (r"candidate_selector\.hidden_projection\.weight", "selector_hidden.weight"),
)
MATRIX_TYPES = {"float32": GGMLQuantizationType.F32, "float16": GGMLQuantizationType.F16,
                "bfloat16": GGMLQuantizationType.BF16}
FILE_TYPES = {"float32": LlamaFileType.ALL_F32, "float16": LlamaFileType.MOSTLY_F16,
              "bfloat16": LlamaFileType.MOSTLY_BF16}


def gguf_name(name: str) -> str:
    for pattern, template in GGUF_NAMES:
        match = re.fullmatch(pattern, name)
        if match:
            return template.format(*match.groups())
    raise KeyError(f"draft tensor '{name}' has no GGUF name")


def tensor_type(gguf_tensor_name: str, ndim: int, dtype: str) -> GGMLQuantizationType:
    """llama.cpp's converter rule: vectors, norms and non-`.weight` tensors stay F32."""
    if ndim <= 1 or gguf_tensor_name.endswith("_norm.weight") or not gguf_tensor_name.endswith(".weight"):
        return GGMLQuantizationType.F32
    return MATRIX_TYPES[dtype]


@dataclass(frozen=True)
class MetadataEntry:
    key: str
    value: Any
    vtype: GGUFValueType
    sub_type: GGUFValueType | None = None


def metadata(config: DFlash2Config, dtype: str) -> list[MetadataEntry]:
    """Every `general.*` / `dflash.*` key of the draft (the tokenizer comes from `gguf_vocab`)."""
    u32, f32, boolean, string, array = (GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.BOOL,
                                        GGUFValueType.STRING, GGUFValueType.ARRAY)
    a = ARCH
    entries = [
        MetadataEntry("general.type", "model", string),
        MetadataEntry("general.name", "DFlash2 draft" if config.is_dflash2 else "DFlash draft", string),
        MetadataEntry("general.file_type", int(FILE_TYPES[dtype]), u32),
        MetadataEntry("general.quantization_version", GGML_QUANT_VERSION, u32),
        MetadataEntry(f"{a}.block_count", config.num_hidden_layers, u32),
        MetadataEntry(f"{a}.context_length", config.max_position_embeddings, u32),
        MetadataEntry(f"{a}.embedding_length", config.hidden_size, u32),
        MetadataEntry(f"{a}.feed_forward_length", config.intermediate_size, u32),
        MetadataEntry(f"{a}.vocab_size", config.vocab_size, u32),
        MetadataEntry(f"{a}.attention.head_count", config.num_attention_heads, u32),
        MetadataEntry(f"{a}.attention.head_count_kv", config.num_key_value_heads, u32),
        MetadataEntry(f"{a}.attention.key_length", config.head_dim, u32),
        MetadataEntry(f"{a}.attention.value_length", config.head_dim, u32),
        MetadataEntry(f"{a}.attention.layer_norm_rms_epsilon", config.rms_norm_eps, f32),
        MetadataEntry(f"{a}.attention.causal", False, boolean),
        MetadataEntry(f"{a}.rope.freq_base", config.rope_theta, f32),
        MetadataEntry(f"{a}.block_size", config.block_size, u32),
        MetadataEntry(f"{a}.target_layers", [i + 1 for i in config.target_layer_ids], array, GGUFValueType.INT32),
    ]
    if config.sliding_window and "sliding_attention" in config.layer_types:
        entries += [MetadataEntry(f"{a}.attention.sliding_window", config.sliding_window, u32),
                    MetadataEntry(f"{a}.attention.sliding_window_pattern",
                                  [kind == "sliding_attention" for kind in config.layer_types], array, boolean)]
    if config.is_dflash2:
        entries += [MetadataEntry(f"{a}.conv_kernel_size", config.conv_kernel_size, u32),
                    MetadataEntry(f"{a}.conv_group_size", config.conv_group_size, u32),
                    MetadataEntry(f"{a}.selector_rank", config.selector_rank, u32),
                    MetadataEntry(f"{a}.selector_top_k", config.selector_top_k, u32)]
    if config.output_multiplier != 1.0:
        entries.append(MetadataEntry(f"{a}.logit_scale", config.output_multiplier, f32))
    if config.final_logit_softcapping:
        entries.append(MetadataEntry(f"{a}.final_logit_softcapping", config.final_logit_softcapping, f32))
    if config.input_embedding_scale != 1.0:
        entries.append(MetadataEntry(f"{a}.embedding_scale", config.input_embedding_scale, f32))
    return entries


def _encode(array: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """float32 / float16 arrays as they are; BF16 as raw bytes (uint8), whose byte shape the writer
    turns back into the element shape itself."""
    if qtype == GGMLQuantizationType.F32:
        return array.astype(np.float32)
    if qtype == GGMLQuantizationType.F16:
        return array.astype(np.float16)
    return quants.quantize(array.astype(np.float32), qtype)


def write_gguf(model: DFlash2DraftModel, vocab: TargetVocab, path: Path, dtype: str) -> int:
    """Write the draft to `path`; returns the number of tensors."""
    config = model.config
    if config.is_dflash2 and not (config.use_conv and config.use_selector):
        raise ValueError("a DFlash2 GGUF needs both parts (complete the draft with neutral.for_dflash2 first)")
    writer = GGUFWriter(str(path), ARCH)
    for entry in metadata(config, dtype):
        writer.add_key_value(entry.key, entry.value, entry.vtype, sub_type=entry.sub_type)
    add_vocab(writer, vocab, config.mask_token_id)
    count = 0
    for name, tensor in model.state_dict().items():
        target_name = gguf_name(name)
        array = tensor.detach().to(torch.float32).cpu().numpy()
        qtype = tensor_type(target_name, array.ndim, dtype)
        writer.add_tensor(target_name, _encode(array, qtype), raw_dtype=qtype)
        count += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return count

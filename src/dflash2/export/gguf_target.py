"""An unquantized GGUF of a target, from the very weights dflash2 runs (for engine comparisons).

A built-in target ships as a quantized GGUF (SmolLM2: Q4_1, its embedding Q8_0); dflash2 runs its
float32 dequantisation. An engine given the quantized file computes with other weights, so token
and cycle comparisons against dflash2 need the same dequantised weights in GGUF form.

Contract: `unquantized_gguf(source, out, dtype)` writes `out`, a GGUF holding every tensor of
`source` dequantised (`gguf.quants.dequantize`, the reference dequantiser, the one transformers'
GGUF loader uses too) and every metadata field of `source` (the tokenizer included) but
`general.file_type`, which names the new type. `dtype` "float32": every tensor F32, so the file
holds bit for bit the weights of dflash2's float32 target; "bfloat16": matrices BF16 (rounded to
nearest even), 1-D tensors F32 (llama.cpp's own converter does the same). The file appears
atomically (`fileio.atomic_file`). Returns `out`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, LlamaFileType, quants

from dflash2.errors import require
from dflash2.export.gguf_vocab import read_fields
from dflash2.files.atomic import atomic_file

UNQUANTIZED = {"float32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
               "bfloat16": (GGMLQuantizationType.BF16, LlamaFileType.MOSTLY_BF16)}


def tensor_values(tensor) -> np.ndarray:
    """A GGUF tensor's values as float32, in numpy (row-major) order: rows x columns."""
    values = quants.dequantize(tensor.data, tensor.tensor_type)
    return np.asarray(values, dtype=np.float32).reshape([int(n) for n in reversed(tensor.shape)])


def unquantized_gguf(source: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    require(dtype in UNQUANTIZED, f"unquantized GGUF type '{dtype}': choose one of {', '.join(UNQUANTIZED)}")
    reader = GGUFReader(str(source))
    arch = str(reader.fields["general.architecture"].contents())
    matrix_type, file_type = UNQUANTIZED[dtype]
    out = Path(out)
    with atomic_file(out) as tmp:
        writer = GGUFWriter(str(tmp), arch)
        for field in read_fields(reader, lambda name: name not in ("general.architecture", "general.file_type")):
            writer.add_key_value(field.name, field.value, field.vtype, sub_type=field.sub_type)
        writer.add_file_type(int(file_type))
        for tensor in reader.tensors:
            values = tensor_values(tensor)
            qtype = matrix_type if values.ndim >= 2 else GGMLQuantizationType.F32
            data = values if qtype == GGMLQuantizationType.F32 else quants.quantize(values, qtype)
            writer.add_tensor(tensor.name, data, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return out

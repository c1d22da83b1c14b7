"""The tokenizer of a GGUF draft: the target's own, copied from the target's GGUF.

llama.cpp reads a draft's vocabulary from the draft file itself and refuses a draft whose
vocabulary differs from the target's (type, size, token texts, special ids); the DFlash path also
reads the MASK id from the draft's `tokenizer.ggml.mask_token_id`. So the GGUF draft carries every
`tokenizer.*` key of the target's GGUF, plus the draft's MASK id.

Contract:
- `target_gguf(target)` is a context manager yielding the path of the target's GGUF: a `.gguf`
  file given as such, or a built-in target's own GGUF (`dflash2.targets.builtin`). Anything else
  raises a one-line `DFlash2Error` saying what to pass. `check_target_gguf(target)` does the cheap
  part of that check (no file is read or assembled) for validation before anything slow.
- `read_fields(reader, keep)` -> the metadata fields of an open GGUF whose names `keep` accepts,
  with their GGUF value types (the one reader of metadata for copying it into another file);
  `read_vocab(path)` -> `TargetVocab`: the `tokenizer.*` fields and the token count.
- `add_vocab(writer, vocab, mask_token_id)` writes them into a `gguf.GGUFWriter` (the target's own
  MASK id, if it has one, is replaced by the draft's).
"""
from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from gguf import GGUFReader, GGUFValueType, GGUFWriter

from dflash2.errors import require
from dflash2.targets.builtin import BUILTIN_TARGETS

MASK_KEY = "tokenizer.ggml.mask_token_id"
TOKENS_KEY = "tokenizer.ggml.tokens"


@dataclass(frozen=True)
class VocabField:
    name: str
    value: Any
    vtype: GGUFValueType
    sub_type: GGUFValueType | None  # element type of an ARRAY


@dataclass(frozen=True)
class TargetVocab:
    source: Path
    fields: tuple[VocabField, ...]
    n_tokens: int


def check_target_gguf(target: str) -> None:
    is_file = target.endswith(".gguf")
    require(is_file or target in BUILTIN_TARGETS,
            f"--to gguf takes the tokenizer from the target's own GGUF: pass --target FILE.gguf or a built-in "
            f"name ({', '.join(BUILTIN_TARGETS)}), not '{target}'")
    require(not is_file or Path(target).is_file(), f"--target '{target}' is not a file")


@contextlib.contextmanager
def target_gguf(target: str) -> Iterator[Path]:
    check_target_gguf(target)
    if target.endswith(".gguf"):
        yield Path(target)
        return
    with tempfile.TemporaryDirectory(prefix="dflash2-target-gguf-") as scratch:
        yield BUILTIN_TARGETS[target].locate_gguf(Path(scratch))


def read_fields(reader: GGUFReader, keep: Callable[[str], bool]) -> list[VocabField]:
    fields = []
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or not keep(name):   # GGUF.*: the header, not metadata
            continue
        vtype = field.types[0]
        sub_type = field.types[1] if vtype == GGUFValueType.ARRAY else None
        fields.append(VocabField(name, field.contents(), vtype, sub_type))
    return fields


def read_vocab(path: Path) -> TargetVocab:
    reader = GGUFReader(str(path))
    fields = read_fields(reader, lambda name: name.startswith("tokenizer.") and name != MASK_KEY)
    tokens = next((f.value for f in fields if f.name == TOKENS_KEY), None)
    require(tokens is not None, f"target GGUF '{path}' has no tokenizer ({TOKENS_KEY} is missing)")
    return TargetVocab(path, tuple(fields), len(tokens))


def add_vocab(writer: GGUFWriter, vocab: TargetVocab, mask_token_id: int) -> None:
    for field in vocab.fields:
        writer.add_key_value(field.name, field.value, field.vtype, sub_type=field.sub_type)
    writer.add_uint32(MASK_KEY, mask_token_id)

"""What a data directory's manifest records about its making, so that data made by another target,
tokenizer or sampling is told apart from it (`data.shards` refuses a mismatch on resume; `dflash2
train` checks its data against its target).

Contract: `target_fields(name, model)`: name, architecture, vocabulary and layer count, dtype, the
config's hash (`config_sha256`: without what varies between loads of one model) and a fingerprint of
the weights (the first 256 values of every tensor). `tokenizer_fields(tokenizer)`: class, vocabulary
size and hash, chat template. `sampling_fields(...)`: temperature, top-p, top-k, new tokens, stop ids
and the chat template's hash.
"""
from __future__ import annotations

import hashlib
import json

import torch


def _sha256_json(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def config_sha256(config) -> str:
    """The hash of a target's Hugging Face config, without what varies between loads of one model."""
    config = config.to_dict()
    for volatile in ("transformers_version", "_name_or_path", "dtype", "torch_dtype"):
        config.pop(volatile, None)
    return _sha256_json(config)


def target_fields(name: str, model) -> dict:
    """What identifies the target: its name, architecture, config hash and a weights fingerprint."""
    weights = hashlib.sha256()
    with torch.no_grad():
        for param_name, param in sorted(model.state_dict().items()):
            weights.update(param_name.encode())
            weights.update(param.detach().reshape(-1)[:256].float().cpu().numpy().tobytes())
    return {"name": name, "model_type": model.config.model_type, "vocab_size": model.config.vocab_size,
            "num_hidden_layers": getattr(model.config, "num_hidden_layers", None),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "config_sha256": config_sha256(model.config), "weights_fingerprint": weights.hexdigest()[:16]}


def tokenizer_fields(tokenizer) -> dict:
    vocab = tokenizer.get_vocab()
    return {"class": type(tokenizer).__name__, "vocab_size": len(vocab),
            "vocab_sha256": _sha256_json(sorted(vocab.items(), key=lambda item: item[1])),
            "chat_template": getattr(tokenizer, "chat_template", None)}


def sampling_fields(max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                    stop_ids, chat_template: str | None) -> dict:
    return {"temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k),
            "max_new_tokens": int(max_new_tokens), "stop_token_ids": sorted(int(i) for i in stop_ids),
            "chat_template": "target's own, first user turn, generation prompt added" if chat_template
            else "none (plain text)",
            "chat_template_sha256": hashlib.sha256(chat_template.encode()).hexdigest() if chat_template else None}

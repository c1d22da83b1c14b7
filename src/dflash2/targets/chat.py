"""Prompt encoding for chat and base models.

Contract:
- `encode_messages(tokenizer, messages)` turns `[{"role": ..., "content": ...}, ...]` into the
  token ids the target expects before its answer: the tokenizer's chat template with the
  generation prompt when it has one; otherwise (base models) the contents joined by blank lines,
  with the tokenizer's usual special tokens (e.g. BOS).
  `check_messages(messages)` is its check of the messages alone (no tokenizer needed).
- `encode_prompt(tokenizer, text, chat=None)` does the same for one user message; `chat=False`
  forces plain text, `chat=None` uses the template when there is one.
- `choose_mask_token(tokenizer, vocab_size)`: the id for a draft block's MASK slots, one the target
  never writes: the tokenizer's mask token, else an added special token named like a mask, else an
  added special token that chat formatting does not use, else the last vocabulary id.
- `first_turns(conversations, tokenizer)`: each conversation's first user turn, encoded.
- `stop_token_ids(tokenizer, model_config)` collects the ids that end an answer (EOS and, for chat
  models, the end-of-turn token), so generation stops where the model's own `generate` would.
"""
from __future__ import annotations

import re

from dflash2.errors import require

_CHAT_TOKENS = re.compile(r"im_start|im_end|start_of_turn|end_of_turn|bos|eos|pad|endoftext|begin_of|eot")


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def check_messages(messages: list, where: str = "") -> None:
    """Refuse (one line, prefixed by `where`) anything but a non-empty list of {role, content} messages."""
    require(bool(messages), f"{where}empty prompt: no messages given")
    for i, message in enumerate(messages):
        require(isinstance(message, dict) and isinstance(message.get("content"), str),
                f"{where}message {i} must be an object with a string 'content'")
        require(message.get("role") in ("system", "user", "assistant"),
                f"{where}message {i} has role {message.get('role')!r}; expected system, user or assistant")
    require(any(m["content"].strip() for m in messages), f"{where}empty prompt: the messages have no text")


def encode_messages(tokenizer, messages: list[dict], chat: bool | None = None) -> list[int]:
    check_messages(messages)
    use_template = has_chat_template(tokenizer) if chat is None else chat
    if use_template:
        require(has_chat_template(tokenizer), "this tokenizer has no chat template; pass chat=False (--no-chat)")
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    text = "\n\n".join(m["content"] for m in messages)
    return tokenizer(text)["input_ids"]


def encode_prompt(tokenizer, text: str, chat: bool | None = None) -> list[int]:
    require(isinstance(text, str) and text.strip() != "", "empty prompt: give some text")
    return encode_messages(tokenizer, [{"role": "user", "content": text}], chat)


def stop_token_ids(tokenizer, model_config=None) -> tuple[int, ...]:
    ids: set[int] = set()
    for source in (getattr(model_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    vocab = tokenizer.get_vocab()   # a fresh dict of the whole vocabulary per call: read once
    for token in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>"):
        token_id = tokenizer.convert_tokens_to_ids(token) if token in vocab else None
        if isinstance(token_id, int):
            ids.add(token_id)
    return tuple(sorted(ids))


def choose_mask_token(tokenizer, vocab_size: int) -> int:
    if getattr(tokenizer, "mask_token_id", None) is not None and tokenizer.mask_token_id < vocab_size:
        return int(tokenizer.mask_token_id)
    added = {tok: idx for tok, idx in tokenizer.get_added_vocab().items() if idx < vocab_size}
    for tok, idx in sorted(added.items(), key=lambda item: item[1]):
        if "mask" in tok.lower():
            return idx
    unused = [idx for tok, idx in added.items() if not _CHAT_TOKENS.search(tok.lower())]
    return max(unused) if unused else vocab_size - 1


def first_turns(conversations: list, tokenizer) -> list[list[int]]:
    """The first user turn of each conversation (anything with `.turns`), encoded for the target."""
    return [encode_messages(tokenizer, [{"role": "user", "content": c.turns[0]}]) for c in conversations]

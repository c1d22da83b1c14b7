"""Helpers shared by the regeneration tests: a tiny local target directory whose character tokenizer
round-trips text (a chat template included), and a user's prompt file in the three formats."""
from __future__ import annotations

import json
from pathlib import Path

from dflash2.targets.tiny import tiny_target

VOCAB = 32            # the tokenizer's 32 entries: every id the tiny target writes has a text
TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'assistant' %} {{ m['content'] }}</s>{% else %}<s>"
            "{{ m['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %} {% endif %}")
TEXTS = ["hello there", "tell me about rivers", "abc", "a quick question about the sea", "zebra",
         "make a list", "why", "good morning friend"]


def char_tokenizer(shift: int = 0):
    """pad / BOS / EOS / UNK at 0-3, then a-z, space and '.' (rotated by `shift`: another tokenizer
    of the same size), joined back without spaces (`decoders.Fuse`), with `TEMPLATE`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(ord("a") + i) for i in range(26)] + [" ", "."]
    chars = chars[shift:] + chars[:shift]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{c: 4 + i for i, c in enumerate(chars)}}
    model = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    model.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>")
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def write_target(path: Path, seed: int = 0, shift: int = 0) -> Path:
    tiny_target("llama", vocab_size=VOCAB, seed=seed).save_pretrained(path)
    char_tokenizer(shift).save_pretrained(path)
    return path


def write_prompts(path: Path) -> Path:
    """`TEXTS` as prompt, OpenAI messages (with an old answer to replace) and ShareGPT records (a
    second user turn after an answer), in turn."""
    with open(path, "w") as handle:
        for i, text in enumerate(TEXTS):
            if i % 3 == 0:
                record = {"prompt": text}
            elif i % 3 == 1:
                record = {"id": f"m{i}", "messages": [{"role": "system", "content": "be brief"},
                                                      {"role": "user", "content": text},
                                                      {"role": "assistant", "content": "an old answer"}]}
            else:
                record = {"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "their answer"},
                                            {"from": "human", "value": "and more"}]}
            handle.write(json.dumps(record) + "\n")
    return path

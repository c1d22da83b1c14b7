"""Which prompts a regeneration run answers, encoded for the target, and how its manifest names them.

Contract:
- `Prompt(id, tokens)`: one prompt as the target's token ids, with a unique id.
- `encode_training_prompts(tokenizer, num_prompts, seed, source, max_prompt_tokens)`: the first
  `num_prompts` built-in training prompts of `source` (`data.prompts.training_prompts`' seeded
  order) whose first user turn, chat template applied, has at most `max_prompt_tokens` tokens; ids
  "<dataset>:<id>". `training_fields(...)` is the manifest's `prompts` entry for them.
- `encode_file_prompts(tokenizer, chats, name, num_prompts, max_prompt_tokens)`: a user's file
  (`data.chat_files`), in file order: each record's messages up to its last user message, chat
  template applied (`targets.chat.encode_messages`); the first `num_prompts` (None: all) that fit;
  ids "<name>:<record id>". `file_fields(path, max_prompt_tokens)` names the file by its sha256, so
  a resumed run must read the same file.
- `off_policy_records(tokenizer, chats, name, stop_ids, num_prompts, max_prompt_tokens,
  max_new_tokens)`: the records of a user's conversations with their own assistant turns as the
  responses (`data.off_policy`), ids "<name>:<record id>:<answer number>"; conversations with no
  answered turn are skipped; `num_prompts` counts conversations.
Too few prompts fitting is said on stderr, not refused; no prompt at all is a `DFlash2Error`.
"""
from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from tqdm import tqdm

from dflash2.data.chat_files import UserChat
from dflash2.data.off_policy import answer_records
from dflash2.data.shards import Record
from dflash2.errors import require
from dflash2.targets.chat import encode_messages, encode_prompt


@dataclass
class Prompt:
    id: str
    tokens: list[int]


def _say(message: str) -> None:
    tqdm.write(f"dflash2 regenerate: {message}", file=sys.stderr)


def _short(found: int, wanted: int | None, what: str, max_prompt_tokens: int) -> None:
    require(found > 0, f"no prompt of {what} fits in --max-prompt-tokens {max_prompt_tokens}")
    if wanted is not None and found < wanted:
        _say(f"only {found} prompts of {what} fit in {max_prompt_tokens} tokens; using them all")


def _take(candidates: Iterable[tuple[str, list[int]]], num_prompts: int | None, max_prompt_tokens: int,
          what: str) -> list[Prompt]:
    """The first `num_prompts` (None: all) of the (id, tokens) candidates, encoded lazily, that fit."""
    prompts: list[Prompt] = []
    for prompt_id, tokens in candidates:
        if len(tokens) <= max_prompt_tokens:
            prompts.append(Prompt(prompt_id, tokens))
            if len(prompts) == num_prompts:
                break
    _short(len(prompts), num_prompts, what, max_prompt_tokens)
    return prompts


def encode_training_prompts(tokenizer, num_prompts: int, seed: int = 0, source: str = "sharegpt",
                            max_prompt_tokens: int = 512) -> list[Prompt]:
    from dflash2.data.prompts import training_prompts

    return _take(((f"{c.dataset}:{c.id}", encode_prompt(tokenizer, c.prompt))
                  for c in training_prompts(seed=seed, sources=(source,))), num_prompts, max_prompt_tokens, source)


def training_fields(source: str, seed: int, max_prompt_tokens: int) -> dict:
    return {"source": source, "seed": seed, "max_prompt_tokens": max_prompt_tokens,
            "selection": f"training_prompts(seed={seed}, sources=({source!r},)) order; the first user turn of the "
                         f"first num_prompts (see runs) encoding to <= {max_prompt_tokens} tokens"}


def encode_file_prompts(tokenizer, chats: list[UserChat], name: str, num_prompts: int | None,
                        max_prompt_tokens: int) -> list[Prompt]:
    return _take(((f"{name}:{chat.id}", encode_messages(tokenizer, chat.prompt_messages())) for chat in chats),
                 num_prompts, max_prompt_tokens, name)


def file_fields(path: str | Path, max_prompt_tokens: int) -> dict:
    data = Path(path).read_bytes()
    return {"source": "file", "file": Path(path).name, "sha256": hashlib.sha256(data).hexdigest(),
            "max_prompt_tokens": max_prompt_tokens,
            "selection": f"the file's records in order: the first num_prompts (see runs) whose messages up to the "
                         f"last user message, chat template applied, encode to <= {max_prompt_tokens} tokens"}


def off_policy_records(tokenizer, chats: list[UserChat], name: str, stop_ids, num_prompts: int | None,
                       max_prompt_tokens: int, max_new_tokens: int) -> list[Record]:
    records, taken = [], 0
    for chat in chats:
        answers = [(turn, prompt, response, finish)
                   for turn, prompt, response, finish in answer_records(tokenizer, chat, stop_ids, max_new_tokens)
                   if len(prompt) <= max_prompt_tokens]
        if not answers:
            continue
        records += [Record(f"{name}:{chat.id}:{turn}", prompt, response, finish)
                    for turn, prompt, response, finish in answers]
        taken += 1
        if taken == num_prompts:
            break
    _short(taken, num_prompts, f"{name} with an answered turn", max_prompt_tokens)
    return records

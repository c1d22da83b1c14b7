"""Off-policy training records: a user's own conversations, their assistant turns kept as the responses.

A draft learns to predict what its target would write; these responses were written by someone
else (another model, a person), so the draft learns the target's continuation of text the target
did not write. Cheaper than regeneration (nothing is decoded) and usually worse for acceptance:
measure it (TRAINING.md §2).

Contract: `answer_records(tokenizer, chat, stop_ids, max_response_tokens)` -> one `(turn, prompt ids,
response ids, finish reason)` per answered assistant turn of `chat` (`chat_files.UserChat`), turn
counted from 1. The prompt is what the target sees before that answer (`targets.chat.encode_messages`:
the chat template with the generation prompt, or the contents joined for a tokenizer without one).
With a chat template the response is the template's rendering of the answer (the whole conversation
so far rendered, the prompt's ids cut off the front; the template must reproduce the prompt's ids as
its prefix, else a one-line `DFlash2Error`), up to and including its first stop token (the
end-of-turn token, as a regenerated response ends); without one, the answer's ids and the first stop
id. A response longer than `max_response_tokens` is cut there (finish reason "length", else "stop").
"""
from __future__ import annotations

from dflash2.data.chat_files import UserChat
from dflash2.errors import DFlash2Error
from dflash2.targets.chat import encode_messages, has_chat_template


def _rendered(tokenizer, messages: list[dict]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def answer_records(tokenizer, chat: UserChat, stop_ids, max_response_tokens: int) -> list[tuple[int, list[int], list[int], str]]:
    stops = set(int(i) for i in stop_ids)
    if not stops:
        raise DFlash2Error("the target has no stop token: off-policy responses cannot be ended like its own")
    records = []
    for turn, (before, answer) in enumerate(chat.answered_turns(), start=1):
        prompt = encode_messages(tokenizer, before)
        if has_chat_template(tokenizer):
            whole = _rendered(tokenizer, before + [{"role": "assistant", "content": answer}])
            if whole[:len(prompt)] != prompt:
                raise DFlash2Error(f"conversation {chat.id!r}, answer {turn}: the chat template does not render the "
                                   "conversation with the prompt as its prefix, so the answer's tokens cannot be cut "
                                   "out of it")
            response = whole[len(prompt):]
            end = next((i for i, t in enumerate(response) if t in stops), None)
            response = response if end is None else response[:end + 1]
        else:
            response = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
            response.append(tokenizer.eos_token_id if tokenizer.eos_token_id in stops else min(stops))
        finish = "stop" if response and response[-1] in stops else "length"
        if len(response) > max_response_tokens:
            response, finish = response[:max_response_tokens], "length"
        records.append((turn, prompt, response, finish))
    return records

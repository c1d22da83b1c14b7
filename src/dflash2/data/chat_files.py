"""A user's own prompts and conversations, read from one file (`dflash2 regenerate --prompts FILE`).

Contract:
- `load_chat_file(path)` -> list of `UserChat`. The file is JSON Lines (one record a line, blank
  lines skipped) or one JSON array of records (ShareGPT's usual layout). Each record is recognised
  by its key, record by record:
  - `{"prompt": "..."}`: one user message;
  - `{"messages": [{"role": ..., "content": ...}, ...]}`: OpenAI's chat format (roles system,
    developer = system, user, assistant; content a string or a list of text parts);
  - `{"conversations": [{"from": ..., "value": ...}, ...]}`: ShareGPT (`from` human / user, gpt /
    assistant / chatgpt / bard / model, system; `role` / `content` are read too).
  An optional `id` (a string or an integer) names the record; without one it is the line number
  (JSON Lines) or the 1-based position (an array). Ids must be unique in the file.
- `read_user_file(path)` (the text, or one line naming the file) and `json_lines(path, text)`
  (`(line number, value)` per non-blank line) read any user JSON Lines file (`prompts.load_prompt_file` too).
- Every malformed record raises a one-line `DFlash2Error` naming the file and the line
  (`FILE:LINE: ...`) or the record (`FILE: record N: ...`) and what is wrong, before anything loads.
- `UserChat(id, messages)` holds `{"role", "content"}` dicts with roles system / user / assistant.
  `prompt_messages()`: what a target answers: the messages up to the last user message (a trailing
  assistant reply, the one regeneration replaces, left out). `answered_turns()`: each assistant
  message that follows a user message, with the messages before it: the pairs an off-policy data
  set trains on (`data.off_policy`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from dflash2.errors import DFlash2Error
from dflash2.files.userjson import parse_json

_OPENAI_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "chatgpt": "assistant", "bard": "assistant", "model": "assistant", "system": "system"}
KINDS = ("prompt", "messages", "conversations")


@dataclass(frozen=True)
class UserChat:
    id: str
    messages: tuple[dict, ...]

    def prompt_messages(self) -> list[dict]:
        """The messages up to and including the last user message."""
        last = max(i for i, m in enumerate(self.messages) if m["role"] == "user")
        return [dict(m) for m in self.messages[:last + 1]]

    def answered_turns(self) -> list[tuple[list[dict], str]]:
        """(the messages before it, its text) for each assistant message after a user message."""
        turns, seen_user = [], False
        for i, message in enumerate(self.messages):
            if message["role"] == "user":
                seen_user = True
            elif message["role"] == "assistant" and seen_user and message["content"].strip():
                turns.append(([dict(m) for m in self.messages[:i]], message["content"]))
        return turns


def _text(content: Any, where: str) -> str:
    """A message's text: a string, or OpenAI's list of text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise DFlash2Error(f"{where} content must be a string or a list of text parts")


def _messages(items: Any, kind: str, where: str) -> tuple[dict, ...]:
    if not isinstance(items, list) or not items:
        raise DFlash2Error(f"{where}'{kind}' must be a non-empty list")
    roles, role_key, text_key = ((_OPENAI_ROLES, "role", "content") if kind == "messages"
                                 else (_SHAREGPT_ROLES, "from", "value"))
    out = []
    for i, item in enumerate(items):
        at = f"{where}{kind}[{i}]"
        if not isinstance(item, dict):
            raise DFlash2Error(f"{at} must be an object")
        if kind == "conversations" and role_key not in item and "role" in item:   # ShareGPT written as OpenAI
            role_key, text_key = "role", "content"
        role = roles.get(str(item.get(role_key, "")).lower())
        if role is None:
            raise DFlash2Error(f"{at} has {role_key} {item.get(role_key)!r}; expected one of {', '.join(sorted(roles))}")
        out.append({"role": role, "content": _text(item.get(text_key), at)})
    if not any(m["role"] == "user" and m["content"].strip() for m in out):
        raise DFlash2Error(f"{where}'{kind}' holds no user message with text")
    return tuple(out)


def parse_record(obj: Any, where: str, default_id: str) -> UserChat:
    """One record of a prompt or conversation file (`where`: "FILE:LINE: ", for errors)."""
    if not isinstance(obj, dict):
        raise DFlash2Error(f"{where}expected a JSON object, got {type(obj).__name__}")
    kinds = [k for k in KINDS if k in obj]
    if len(kinds) != 1:
        raise DFlash2Error(f"{where}needs exactly one of 'prompt' (a string), 'messages' (OpenAI chat messages) or "
                           f"'conversations' (ShareGPT turns)" + (f", got {' and '.join(kinds)}" if kinds else ""))
    kind = kinds[0]
    if kind == "prompt":
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise DFlash2Error(f"{where}'prompt' must be a non-empty string")
        messages = ({"role": "user", "content": obj["prompt"]},)
    else:
        messages = _messages(obj[kind], kind, where)
    record_id = obj.get("id", default_id)
    if not isinstance(record_id, (str, int)) or isinstance(record_id, bool) or str(record_id) == "":
        raise DFlash2Error(f"{where}'id' must be a non-empty string or an integer")
    return UserChat(str(record_id), messages)


def read_user_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DFlash2Error(f"prompt file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DFlash2Error(f"cannot read prompt file {path}: {exc}") from None


def json_lines(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """(line number, decoded value) of each non-blank line; a line that is not JSON: one line naming it."""
    # split("\n"), not splitlines(): a JSON string may hold a raw U+2028, not a line end here
    for lineno, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield lineno, parse_json(line, f"{path}:{lineno}: this line")


def load_chat_file(path: str | os.PathLike) -> list[UserChat]:
    path = Path(path)
    text = read_user_file(path)
    if text.lstrip("\ufeff \t\r\n").startswith("["):
        records = parse_json(text.lstrip("\ufeff"), f"{path}")
        chats = [parse_record(obj, f"{path}: record {i}: ", str(i)) for i, obj in enumerate(records, start=1)]
    else:
        chats = [parse_record(obj, f"{path}:{lineno}: ", str(lineno)) for lineno, obj in json_lines(path, text)]
    if not chats:
        raise DFlash2Error(f"prompt file {path} holds no records")
    seen: set[str] = set()
    for chat in chats:
        if chat.id in seen:
            raise DFlash2Error(f"{path}: id {chat.id!r} is used twice; ids must be unique")
        seen.add(chat.id)
    return chats

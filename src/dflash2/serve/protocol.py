"""The OpenAI wire format on the way in: request bodies parsed into typed requests, and errors.

Contract:
- `ApiError(status, message, param=None, code=None, kind=None, headers=None)` is every error the
  server answers with; `.body()` is OpenAI's error object
  `{"error": {"message", "type", "param", "code"}}` (type from the status unless given).
- `parse_json(raw)` -> the body as a dict, or ApiError 400 (`invalid_json`) for malformed JSON,
  JSON nested too deeply, a string that is not Unicode text (a lone surrogate) or a non-object.
- `parse_chat(body)` / `parse_completion(body)` -> `ApiRequest`, or ApiError 400 naming the field.
  Only what the server honours is accepted: a field the server would have to ignore (`n > 1`,
  `logprobs`, tools, penalties, ...) or one it does not know is refused, never silently dropped.
  Extensions: `top_k` (an integer, 0 = off) and `return_token_ids` (each choice, and each stream
  chunk, carries its `token_ids` and their `origins`: per token "draft" for an accepted draft
  token, "lookup" for an accepted lookup proposal, "target" for the target's own token closing a speculative cycle, "plain" for a plain
  target step). `user` is accepted (it is an end-user id, it does not change the answer).
- `parse_tokenize(body)` -> `(text, add_special_tokens)` for `POST /tokenize`, vLLM's request
  shape: `prompt` (a string), `add_special_tokens` (default true), `model` (optional; checked like a
  generation's); anything else is refused (`messages` too: this server tokenizes text only).
- Ranges (max_tokens > 0, temperature >= 0, top_p in (0, 1], ...) are not checked here: they are
  the engine's rule (`GenerationConfig.validate`), applied in `jobs.build_job` with the error
  message naming the request field. Here only JSON types and presence are checked.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from dflash2.files.userjson import lone_surrogate

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
          500: "server_error", 503: "server_error"}

MAX_STOP_STRINGS = 16
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1   # the integers a request field may hold


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)


@dataclass(frozen=True)
class ApiRequest:
    """One chat or completion request, as typed values (None: not given, the server default)."""
    kind: str                                     # "chat" or "completion"
    model: str
    messages: tuple[dict, ...] = ()               # chat: {"role", "content"} with string content
    prompt_text: str | None = None                # completion: a string ...
    prompt_ids: tuple[int, ...] | None = None     # ... or token ids
    max_tokens: int | None = None
    max_tokens_field: str = "max_tokens"          # which name the client used, for error messages
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    extras: dict = field(default_factory=dict)    # accepted fields with no effect on decoding (`user`)


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except ValueError as err:  # not UTF-8 / UTF-16 / UTF-32, not JSON, or an integer of over 4300 digits
        raise bad_request(f"We could not parse the JSON body of your request ({err}). The body must be a "
                          "JSON object.", code="invalid_json") from None
    except RecursionError:
        raise bad_request("The JSON body of your request is nested too deeply.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"The request body must be a JSON object, got {type(body).__name__}.", code="invalid_json")
    _check_text(body)
    return body


def _check_text(body: dict) -> None:
    """Refuse strings that are not Unicode text: JSON may escape a lone surrogate ("\\ud800"), which
    no tokenizer can encode and no response can carry."""
    found = lone_surrogate(body)
    if found is not None:
        raise bad_request(f"The request holds a string that is not valid Unicode text (a lone surrogate "
                          f"{found[0]!a} at character {found[1]}).", code="invalid_json")


# --- fields -----------------------------------------------------------------------------------

def _show(value) -> str:
    """A JSON value for an error message, cut to stay one short line."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options",
           "n", "logprobs", "presence_penalty", "frequency_penalty", "logit_bias", "user", "return_token_ids"}
_CHAT_ONLY = {"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools", "tool_choice",
              "functions", "function_call", "parallel_tool_calls"}
_COMPLETION_ONLY = {"prompt", "echo", "suffix", "best_of"}
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _integer(body: dict, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer, got {_show(value)}.", name)
    if not INT64_MIN <= value <= INT64_MAX:
        raise bad_request(f"'{name}' must be a 64-bit integer, got {_show(value)}.", name)
    return value


def _number(body: dict, name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(f"'{name}' must be a number, got {_show(value)}.", name)
    return float(value)


def _boolean(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be true or false, got {_show(value)}.", name)
    return value


def _same(value, allowed) -> bool:
    """Equal and of the same JSON type: `0`, `false` and `1.0` are not `false`, `0` and `1` (in Python
    they compare equal, so `"logprobs": 0`, a request for log probabilities, passed as `false`)."""
    return type(value) is type(allowed) and value == allowed


def _refuse_unless(body: dict, name: str, allowed, why: str) -> None:
    """A field the server cannot honour is only accepted at the value that changes nothing."""
    if name in body and body[name] is not None and not any(_same(body[name], a) for a in allowed):
        raise bad_request(f"'{name}' = {_show(body[name])} is not supported: {why}.", name, "unsupported_parameter")


def _check_fields(body: dict, known: set[str]) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise bad_request(f"Unsupported field '{unknown[0]}': this server does not implement it, so it refuses the "
                          f"request rather than ignore it.", unknown[0], "unsupported_parameter")
    for name in ("n", "best_of"):
        _refuse_unless(body, name, (1,), "one choice per request (send several requests instead)")
    _refuse_unless(body, "logprobs", (False,), "log probabilities are not returned")
    _refuse_unless(body, "top_logprobs", (0,), "log probabilities are not returned")
    for name in ("presence_penalty", "frequency_penalty"):
        _refuse_unless(body, name, (0, 0.0), "penalties would change the target's distribution")
    _refuse_unless(body, "logit_bias", ({},), "logit bias would change the target's distribution")
    _refuse_unless(body, "response_format", ({"type": "text"},), "only plain text output")
    for name in ("tools", "functions"):
        _refuse_unless(body, name, ([],), "tool calls are not implemented")
    for name in ("tool_choice", "function_call"):
        _refuse_unless(body, name, ("none",), "tool calls are not implemented")
    _refuse_unless(body, "parallel_tool_calls", (False,), "tool calls are not implemented")
    _refuse_unless(body, "echo", (False,), "the prompt is not echoed")
    _refuse_unless(body, "suffix", ("",), "insertion (suffix) is not implemented")
    if "user" in body and body["user"] is not None and not isinstance(body["user"], str):
        raise bad_request("'user' must be a string.", "user")


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required: a model id from GET /v1/models.", "model")
    return model


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("'stop' must be a string or a list of strings.", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(f"'stop' takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}.", "stop")
    if any(s == "" for s in stops):
        raise bad_request("'stop' strings must not be empty.", "stop")
    return tuple(dict.fromkeys(stops))


def _streaming(body: dict) -> tuple[bool, bool]:
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true.", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise bad_request("'stream_options' must be an object with only 'include_usage'.", "stream_options")
    return stream, _boolean(options, "include_usage") if "include_usage" in options else False


def _common(body: dict, kind: str, known: set[str]) -> dict:
    _check_fields(body, known)
    stream, include_usage = _streaming(body)
    return dict(kind=kind, model=_model(body), max_tokens=_integer(body, "max_tokens"),
                temperature=_number(body, "temperature"), top_p=_number(body, "top_p"), top_k=_integer(body, "top_k"),
                seed=_integer(body, "seed"), stop=_stop(body), stream=stream, include_usage=include_usage,
                return_token_ids=_boolean(body, "return_token_ids"),
                extras={"user": body["user"]} if body.get("user") else {})


def _content(message: dict, index: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"messages[{index}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                                  "are supported.", "messages")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"messages[{index}].content must be a string or a list of text parts.", "messages")


def parse_chat(body: dict) -> ApiRequest:
    fields = _common(body, "chat", _COMMON | _CHAT_ONLY)
    messages = body.get("messages")
    if messages is None:
        raise bad_request("'messages' is required: a list of {\"role\", \"content\"} objects.", "messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {\"role\", \"content\"} objects.", "messages")
    parsed = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_request(f"messages[{i}] must be an object with 'role' and 'content'.", "messages")
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise bad_request(f"messages[{i}].role {_show(role)} is not supported: use system, developer, user "
                              "or assistant.", "messages")
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            raise bad_request(f"messages[{i}].{extra[0]} is not supported.", "messages", "unsupported_parameter")
        parsed.append({"role": _ROLES[role], "content": _content(message, i)})
    completion_tokens = _integer(body, "max_completion_tokens")
    if completion_tokens is not None:
        if fields["max_tokens"] is not None and fields["max_tokens"] != completion_tokens:
            raise bad_request("Give 'max_completion_tokens' or 'max_tokens', not two different values.",
                              "max_completion_tokens")
        fields.update(max_tokens=completion_tokens, max_tokens_field="max_completion_tokens")
    return ApiRequest(messages=tuple(parsed), **fields)


def parse_completion(body: dict) -> ApiRequest:
    fields = _common(body, "completion", _COMMON | _COMPLETION_ONLY)
    prompt = body.get("prompt")
    if prompt is None:
        raise bad_request("'prompt' is required: a string or a list of token ids.", "prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return ApiRequest(prompt_text=prompt, **fields)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return ApiRequest(prompt_ids=tuple(prompt), **fields)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_request("Several prompts in one request are not supported: send one request per prompt.",
                          "prompt", "unsupported_parameter")
    raise bad_request("'prompt' must be a non-empty string or a non-empty list of token ids.", "prompt")


def parse_tokenize(body: dict) -> tuple[str, bool]:
    """vLLM's `/tokenize` request: its text and whether the tokenizer's special tokens are added."""
    unknown = sorted(set(body) - {"model", "prompt", "add_special_tokens"})
    if unknown:
        raise bad_request(f"Unsupported field '{unknown[0]}': /tokenize takes 'prompt', 'add_special_tokens' and "
                          "'model'.", unknown[0], "unsupported_parameter")
    if not isinstance(body.get("prompt"), str):
        raise bad_request("'prompt' must be a string.", "prompt")
    if "model" in body and not isinstance(body["model"], str):
        raise bad_request(f"'model' must be a string, got {_show(body['model'])}.", "model")
    add = body.get("add_special_tokens", True)
    if not isinstance(add, bool):
        raise bad_request(f"'add_special_tokens' must be true or false, got {_show(add)}.", "add_special_tokens")
    return body["prompt"], add

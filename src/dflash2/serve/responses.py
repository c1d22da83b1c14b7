"""The OpenAI wire format on the way out: response bodies, stream chunks and server-sent events.

Contract:
- `Reply(job_id, kind, model, created, return_token_ids, spec_decode)` renders one request's answer:
  `complete(finished)` the whole response (`chat.completion` or `text_completion`);
  `first_chunk()` (chat: the assistant role), `chunk(text, token_ids, origins)`,
  `final_chunk(reason, text, token_ids, origins)` (the last text and `finish_reason`) and
  `usage_chunk(finished)` (no choices, `usage`; sent when `stream_options.include_usage`).
- `usage` is OpenAI's {prompt_tokens, completion_tokens, total_tokens}. Every final body (the
  complete response, the usage chunk) also carries `dflash2`: the request's decoding figures
  (acceptance length, speculative cycles, plain steps, accepted draft tokens, time to first
  token, latency, time per output token, tokens/s).
- With `spec_decode` `summary` or `detailed` (`--per-request-spec-decode-metrics`), the final
  body also carries vLLM's `metrics: {"speculative_decoding": ...}` (`spec_decode.request_summary`):
  the complete response at its top level, a stream only in its usage chunk (as vLLM: none without
  `stream_options.include_usage`).
- With `return_token_ids`, choices carry `token_ids` and `origins` (per token: "draft", "target"
  or "plain", see `jobs`).
- `sse(obj)` is one `data:` event; `DONE` ends a stream; `sse_error(error)` is an error event the
  official client raises as `APIError`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from dflash2.serve.jobs import Finished
from dflash2.serve.protocol import ApiError
from dflash2.serve.spec_decode import request_summary

DONE = "data: [DONE]\n\n"


def sse(obj: dict) -> str:
    return "data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n\n"


def sse_error(error: ApiError) -> str:
    return sse(error.body())


def usage(finished: Finished) -> dict:
    return {"prompt_tokens": finished.prompt_tokens, "completion_tokens": finished.completion_tokens,
            "total_tokens": finished.prompt_tokens + finished.completion_tokens}


@dataclass(frozen=True)
class Reply:
    job_id: str
    kind: str                # "chat" or "completion"
    model: str
    created: int
    return_token_ids: bool = False
    spec_decode: str = "none"     # spec_decode.LEVELS

    def _final(self, body: dict, finished: Finished) -> dict:
        """A final body, with vLLM's per-request speculative metrics when asked for."""
        if self.spec_decode != "none":
            body["metrics"] = {"speculative_decoding": request_summary(
                list(finished.steps), finished.num_spec_tokens, self.spec_decode == "detailed")}
        return body

    @property
    def _object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def _head(self, chunk: bool) -> dict:
        name = self._object + (".chunk" if chunk and self.kind == "chat" else "")
        return {"id": self.job_id, "object": name, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def _choice(self, text: str | None, reason: str | None, token_ids, origins, chunk: bool) -> dict:
        if self.kind == "completion":
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        elif chunk:
            choice = {"index": 0, "delta": {} if text is None else {"content": text}, "logprobs": None,
                      "finish_reason": reason}
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                      "logprobs": None, "finish_reason": reason}
        if self.return_token_ids and token_ids is not None:
            choice["token_ids"], choice["origins"] = list(token_ids), list(origins)
        return choice

    def complete(self, finished: Finished) -> dict:
        return self._final({**self._head(chunk=False),
                            "choices": [self._choice(finished.text, finished.reason, finished.token_ids,
                                                     finished.origins, False)],
                            "usage": usage(finished), "dflash2": finished.stats}, finished)

    def first_chunk(self) -> dict | None:
        if self.kind != "chat":
            return None
        choice = self._choice("", None, [], [], chunk=True)
        choice["delta"]["role"] = "assistant"
        return {**self._head(chunk=True), "choices": [choice]}

    def chunk(self, text: str, token_ids, origins) -> dict:
        return {**self._head(chunk=True), "choices": [self._choice(text, None, token_ids, origins, True)]}

    def final_chunk(self, reason: str, text: str, token_ids, origins) -> dict:
        return {**self._head(chunk=True), "choices": [self._choice(text or None, reason, token_ids, origins, True)]}

    def usage_chunk(self, finished: Finished) -> dict:
        return self._final({**self._head(chunk=True), "choices": [], "usage": usage(finished),
                            "dflash2": finished.stats}, finished)

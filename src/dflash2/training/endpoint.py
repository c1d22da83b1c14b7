"""Regeneration through an OpenAI-compatible server (`dflash2 regenerate --endpoint URL`): vLLM, SGLang,
llama-server, `dflash2 serve`, anything that serves `/v1/completions`.

Contract:
- `Endpoint(url, api_key, timeout_s)`: `url` is the server's base (`http://host:port`, a trailing
  `/v1` allowed). `models()` lists the served ids (`GET /v1/models`); an unreachable server or a
  refusal is one `DFlash2Error` line naming the URL. `tokenize(text)` -> the server's token ids of a
  text, without special tokens, or None where it exposes no tokenizer: vLLM's and `dflash2 serve`'s
  `POST /tokenize` ({"prompt", "add_special_tokens"}), SGLang's `/v1/tokenize`, llama-server's
  `/tokenize` ({"content", "add_special"}). `complete(body)` posts one completion, retrying a busy
  server (429, 502, 503, 504 or a dropped connection: up to `RETRIES` times, `Retry-After` honoured).
- `RemoteTarget(endpoint, model, tokenizer, stop_ids, sampling)`: `answer(prompt_ids, seed)` ->
  `Answer(ids, finish_reason)` for one prompt sent as token ids (the chat template is applied
  here, as for local regeneration, so the endpoint's own template does not matter). The ids are the
  endpoint's (`return_token_ids`: vLLM, `dflash2 serve`) where it returns them, else the text
  re-encoded with the local tokenizer, kept only when they decode back to the very text (else
  `Answer.ids` is None: the answer is not stored). The response is cut after its first stop id; an
  answer that stopped without its stop token among the ids (a text, or a server that leaves it out)
  gets the tokenizer's end-of-sequence token (or the smallest stop id), so records end as a local
  run's do. `token_ids` says which of the two the endpoint gave ("endpoint" or "re-encoded").
- `prove_same_target(remote, probe_prompt, local_ids, max_tokens)`: before any work, refuse (one line) an
  endpoint that does not serve the local target: a tokenizer fingerprint (`FINGERPRINT_TEXT`
  tokenized by the endpoint against the local tokenizer) where the endpoint exposes one, and a greedy
  probe: its answer to `probe_prompt` (`max_tokens` tokens, temperature 0) against the local
  target's greedy answer `local_ids`, up to the first stop token (its ids; an endpoint that returns
  no ids: its text against the local answer's, special tokens skipped). Returns what was checked.
- `request_into(remote, writer, queue, concurrency, seed, progress)`: the prompts of `queue` (in
  that order), at most `concurrency` requests in flight, each answer written as it finishes but in
  `queue`'s order (`shards.InOrder`: the shards do not depend on the concurrency); a sampled
  request's seed is the local run's (`seed` and the prompt id). Returns the answers not stored
  (their text did not re-encode to itself). An interruption or a failure stores every finished
  answer first.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import zlib
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass

from dflash2.data.shards import InOrder, Record, ShardWriter
from dflash2.errors import DFlash2Error, require

RETRIES = 6
PROBE_TOKENS = 16
FINGERPRINT_TEXT = ("The quick brown fox jumps over the lazy dog. 0123456789 +-*/=<>()[]{} "
                    "def f(x):\n    return x ** 2  # comment\n\tTabs,  two spaces; caf\u00e9 na\u00efve "
                    "\u6771\u4eac \u0645\u0631\u062d\u0628\u0627 \U0001f642 \u00a7\u00b6")
_BUSY = (429, 502, 503, 504)


@dataclass(frozen=True)
class Answer:
    ids: list[int] | None      # None: the text did not re-encode to itself; not stored
    finish_reason: str         # "stop" or "length"
    text: str = ""


def _message(status: int, body) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", "")).splitlines()[0] if body["error"].get("message") else ""
    if isinstance(body, dict) and isinstance(body.get("detail"), str):   # FastAPI / vLLM validation
        return body["detail"].splitlines()[0]
    return f"HTTP {status}"


class Endpoint:
    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600.0):
        url = url.strip().rstrip("/")
        require(url.startswith(("http://", "https://")), f"--endpoint must be an http:// or https:// URL, got {url!r}")
        self.base = url[:-3] if url.endswith("/v1") else url
        self.api_key, self.timeout_s = api_key, timeout_s

    def _call(self, method: str, path: str, body: dict | None = None, timeout: float | None = None):
        """(status, decoded JSON or None, headers); a transport failure raises OSError."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout_s) as response:
                status, raw, headers = response.status, response.read(), response.headers
        except urllib.error.HTTPError as err:
            status, raw, headers = err.code, err.read(), err.headers
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = None
        return status, decoded, headers

    def models(self) -> list[str]:
        try:
            status, body, _ = self._call("GET", "/v1/models", timeout=30)
        except OSError as err:
            raise DFlash2Error(f"cannot reach the endpoint {self.base}: {getattr(err, 'reason', err)}") from None
        require(status == 200 and isinstance(body, dict) and isinstance(body.get("data"), list),
                f"the endpoint {self.base} did not list its models (GET /v1/models: {_message(status, body)})")
        return [str(m.get("id")) for m in body["data"] if isinstance(m, dict) and m.get("id")]

    def tokenize(self, text: str, model: str) -> list[int] | None:
        attempts = (("/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}),
                    ("/v1/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}),
                    ("/tokenize", {"content": text, "add_special": False}))
        for path, body in attempts:
            try:
                status, answer, _ = self._call("POST", path, body, timeout=30)
            except OSError:
                return None
            tokens = answer.get("tokens") if status == 200 and isinstance(answer, dict) else None
            if isinstance(tokens, list):
                return [t["id"] if isinstance(t, dict) else t for t in tokens]
        return None

    def complete(self, body: dict) -> dict:
        for attempt in range(RETRIES + 1):
            try:
                status, answer, headers = self._call("POST", "/v1/completions", body)
            except OSError as err:
                if attempt == RETRIES:
                    raise DFlash2Error(f"the endpoint {self.base} stopped answering: {getattr(err, 'reason', err)}") from None
                time.sleep(min(2 ** attempt, 30))
                continue
            if status == 200 and isinstance(answer, dict) and answer.get("choices"):
                return answer
            if status in _BUSY and attempt < RETRIES:
                wait = headers.get("Retry-After") if headers else None
                time.sleep(min(float(wait), 30.0) if wait and wait.isdigit() else min(2 ** attempt, 30))
                continue
            raise _Refused(status, _message(status, answer))
        raise AssertionError("unreachable")


class _Refused(DFlash2Error):
    def __init__(self, status: int, message: str):
        super().__init__(f"the endpoint refused a completion (HTTP {status}: {message})")
        self.status, self.detail = status, message


class RemoteTarget:
    def __init__(self, endpoint: Endpoint, model: str, tokenizer, stop_ids, sampling: dict):
        self.endpoint, self.model, self.tokenizer = endpoint, model, tokenizer
        self.stops = sorted(set(int(i) for i in stop_ids))
        require(bool(self.stops), "the target has no stop token to end the endpoint's answers with")
        eos = getattr(tokenizer, "eos_token_id", None)
        self.end = eos if eos in self.stops else self.stops[0]
        self.sampling = sampling          # max_new_tokens, temperature, top_p, top_k
        self.token_ids = "endpoint"       # "re-encoded" once the endpoint is seen not to return ids

    def _body(self, prompt: list[int], seed: int, max_tokens: int, temperature: float) -> dict:
        body = {"model": self.model, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": temperature,
                "top_p": self.sampling["top_p"], "seed": seed, "stream": False}
        if self.sampling["top_k"] > 0:
            body["top_k"] = self.sampling["top_k"]
        if self.token_ids == "endpoint":
            body["return_token_ids"] = True
        return body

    def answer(self, prompt: list[int], seed: int, max_tokens: int | None = None,
               temperature: float | None = None) -> Answer:
        max_tokens = self.sampling["max_new_tokens"] if max_tokens is None else max_tokens
        temperature = self.sampling["temperature"] if temperature is None else temperature
        try:
            reply = self.endpoint.complete(self._body(prompt, seed, max_tokens, temperature))
        except _Refused as err:
            if self.token_ids != "endpoint" or err.status not in (400, 422) or "return_token_ids" not in err.detail:
                raise
            self.token_ids = "re-encoded"     # a strict server that has no such field: take its text
            reply = self.endpoint.complete(self._body(prompt, seed, max_tokens, temperature))
        return self._read(reply["choices"][0])

    def _read(self, choice: dict) -> Answer:
        finish, text = choice.get("finish_reason"), choice.get("text")
        require(finish in ("stop", "length"), f"the endpoint ended an answer with finish_reason {finish!r}, "
                                              "not 'stop' or 'length'")
        ids = choice.get("token_ids")
        if not (isinstance(ids, list) and all(isinstance(t, int) for t in ids)):
            require(isinstance(text, str), "the endpoint's answer has neither token ids nor text")
            self.token_ids = "re-encoded"
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if self.tokenizer.decode(ids) != text:
                return Answer(None, finish, text)
        end = next((i for i, t in enumerate(ids) if t in self.stops), None)
        if end is not None:
            return Answer(ids[:end + 1], "stop", text or "")
        if finish == "stop":
            ids = ids + [self.end]
        return Answer(ids, finish, text or "")


def _show(tokenizer, ids: list[int]) -> str:
    return repr(tokenizer.decode(ids))[:60]


def prove_same_target(remote: RemoteTarget, probe_prompt: list[int], local_ids: list[int], max_tokens: int) -> dict:
    """Refuse (one line) an endpoint whose tokenizer or greedy answer is not the local target's."""
    tokenizer, where = remote.tokenizer, f"the endpoint {remote.endpoint.base} (model '{remote.model}')"
    theirs = remote.endpoint.tokenize(FINGERPRINT_TEXT, remote.model)
    if theirs is not None:
        ours = list(tokenizer(FINGERPRINT_TEXT, add_special_tokens=False)["input_ids"])
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        require(theirs == ours, f"{where} does not use this target's tokenizer: it tokenizes a fixed text differently "
                                f"from token {at} on ({len(theirs)} ids against {len(ours)}); serve this target there, "
                                "or regenerate with the target it serves")
    got = remote.answer(probe_prompt, 0, max_tokens=max_tokens, temperature=0.0)
    stops = set(remote.stops)
    end = next((i for i, t in enumerate(local_ids) if t in stops), None)
    want = local_ids if end is None else local_ids[:end + 1]
    if remote.token_ids == "re-encoded":     # no ids from the endpoint: compare what it wrote
        ours = tokenizer.decode([t for t in want if t not in stops], skip_special_tokens=True)
        at = next((i for i, (a, b) in enumerate(zip(got.text, ours)) if a != b), min(len(got.text), len(ours)))
        require(got.text == ours, f"{where} does not serve this target: its greedy answer to the probe prompt differs "
                                  f"from the local target's at character {at} ({got.text[at:at + 12]!r} against "
                                  f"{ours[at:at + 12]!r}); serve this target there (float32 for exact equality), "
                                  "or regenerate with the target it serves")
    elif got.ids != want:
        at = next((i for i, (a, b) in enumerate(zip(got.ids, want)) if a != b), min(len(got.ids), len(want)))
        raise DFlash2Error(f"{where} does not serve this target: its greedy answer to the probe prompt differs from "
                           f"the local target's at token {at} ({_show(tokenizer, got.ids[at:at + 4])} against "
                           f"{_show(tokenizer, want[at:at + 4])}); serve this target there (float32 for exact "
                           "equality), or regenerate with the target it serves")
    return {"tokenizer_fingerprint": "equal" if theirs is not None else "not exposed by the endpoint",
            "greedy_probe_tokens": len(want), "token_ids": remote.token_ids}


def request_into(remote: RemoteTarget, writer: ShardWriter, queue: list, concurrency: int, seed: int,
                 progress) -> int:
    """Answer `queue`'s prompts (objects with `.id`, `.tokens`) through the endpoint into `writer`."""
    in_order = InOrder(writer, [p.id for p in queue])
    pool = ThreadPoolExecutor(concurrency, thread_name_prefix="dflash2-endpoint")
    waiting, flying, dropped = iter(queue), {}, 0

    def send() -> None:
        prompt = next(waiting, None)
        if prompt is not None:
            flying[pool.submit(remote.answer, prompt.tokens, zlib.crc32(f"{seed}:{prompt.id}".encode()))] = prompt

    try:
        for _ in range(concurrency):
            send()
        while flying:
            done, _ = wait(list(flying), return_when=FIRST_COMPLETED)
            for future in done:
                prompt, answer = flying.pop(future), future.result()
                if answer.ids is None:
                    dropped += 1
                    in_order.put(prompt.id, None)
                else:
                    in_order.put(prompt.id, Record(prompt.id, prompt.tokens, answer.ids, answer.finish_reason))
                    progress.finished(len(answer.ids))
                send()
            progress.tick()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        in_order.drain()
    return dropped

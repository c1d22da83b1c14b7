"""A request as the scheduler sees it, and what it sends back.

Contract:
- `build_job(request, pipeline, defaults, sink, text_tokenizer, tokenizer)` (run in an encoder
  thread, `tokenizer` that thread's own copy) turns a parsed `ApiRequest` into
  a `Job`: the prompt encoded (chat: `targets.chat.encode_messages`, the chat template when the
  tokenizer has one, else the contents joined; completion: the text as the tokenizer encodes it,
  or the given ids; a text is encoded to one id beyond the context at most, so a prompt too long
  for it is refused as `context_length_exceeded` without listing all of its ids), and a `GenerationConfig` from the request with the server defaults for what
  it left out. An omitted `max_tokens` is the default capped to the room left in the context.
  The config and context are checked by the engine's own rules, mapped by type, never by their
  text: each field alone by `GenerationConfig.validate` (a refusal is an `ApiError` 400 whose
  `param` is the request field, e.g. `max_tokens`, not `max_new_tokens`), then the whole request
  by `SpeculativeDecoder.check` (`ContextLimitError`: 400 `context_length_exceeded`).
- The scheduler thread sends a job's results through `job.sink` (thread-safe): `Progress`
  (the pieces of text one cycle released, one per committed token), then `Finished` or `Failed`.
- Token origins, per committed token: "draft" (an accepted token of the draft model), "lookup"
  (an accepted lookup proposal: `decoding.proposers.lookup`), "target" (the target's own token closing a
  speculative cycle) or "plain" (a plain target step, or the prefill's first token). `Job.stats()` counts like `RowStats`: acceptance length = tokens committed by
  speculative cycles / speculative cycles (= (draft + target) / target tokens, unless the last
  cycle was cut short by a stop or the length limit). Each speculative cycle is also kept as a
  `spec_decode.SpecStep` (`Job.steps`; source `tree` when it verified two branches as a tree), for
  vLLM's per-request summary (`Job.spec_decode(detailed)`) and its counters.
"""
from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from dflash2.decoding.loop.context import context_room
from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.errors import ContextLimitError, DFlash2Error, SettingError
from dflash2.serve.protocol import ApiError, ApiRequest, bad_request
from dflash2.serve.settings import RequestDefaults
from dflash2.serve.spec_decode import SpecStep, request_summary
from dflash2.serve.text import TextStream
from dflash2.targets.chat import encode_messages, encode_text

DRAFT, LOOKUP, TARGET, PLAIN = "draft", "lookup", "target", "plain"
SOURCES = (DRAFT, LOOKUP)   # where accepted proposals come from (`Commit.source`)


@dataclass(frozen=True)
class Piece:
    text: str                # may be "" (text held back until later tokens)
    token_id: int
    origin: str              # DRAFT, TARGET or PLAIN


@dataclass(frozen=True)
class Progress:
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class Finished:
    reason: str              # "stop" (stop token or stop string) or "length"
    text: str
    token_ids: tuple[int, ...]
    origins: tuple[str, ...]
    prompt_tokens: int
    stats: dict
    steps: tuple[SpecStep, ...] = ()     # the speculative cycles (vLLM's per-request metrics)
    num_spec_tokens: int = 0

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class Failed:
    error: ApiError


@dataclass(eq=False)
class Job:
    id: str
    request: ApiRequest
    prompt: list[int]
    config: GenerationConfig
    sink: Callable[[object], None]
    num_spec_tokens: int = 0     # the most proposed tokens one cycle can accept (block size - 1)
    created: float = field(default_factory=time.perf_counter)
    # --- owned by the scheduler thread
    key: int | None = None
    stream: TextStream | None = None
    output: list[int] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    speculative_cycles: int = 0
    speculative_tokens: int = 0
    plain_steps: int = 0
    steps: list[SpecStep] = field(default_factory=list)
    first_token_at: float | None = None
    prefilling: bool = True      # the next commit is the prefill's first token
    suspect: bool = False        # involved in a failed step: admitted alone from now on
    restarts: int = 0
    done: bool = False

    def record(self, tokens: list[int], accepted: int, drafted: int, source: str = DRAFT,
               tree: bool = False) -> tuple[list[str], SpecStep | None]:
        """Count one commit (its accepted tokens proposed by `source`; `tree`: the cycle verified two
        branches as a tree); returns each token's origin, and the cycle's step when it was speculative."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if self.prefilling:
            self.prefilling = False
            return [PLAIN] * len(tokens), None                    # the prefill's first token
        if drafted == 0:
            self.plain_steps += 1
            return [PLAIN] * len(tokens), None
        self.speculative_cycles += 1
        self.speculative_tokens += len(tokens)
        step = SpecStep("tree" if tree else source or DRAFT, drafted, accepted)
        self.steps.append(step)
        return [source or DRAFT] * accepted + [TARGET] * (len(tokens) - accepted), step

    def spec_decode(self, detailed: bool = False) -> dict:
        """vLLM's per-request `metrics.speculative_decoding` object (`spec_decode.request_summary`)."""
        return request_summary(self.steps, self.num_spec_tokens, detailed)

    def stats(self, finished_at: float) -> dict:
        """Per-request figures: acceptance length (engine definition), passes, timings."""
        n = len(self.output)
        ttft = (self.first_token_at or finished_at) - self.created
        decode = finished_at - (self.first_token_at or finished_at)
        return {
            "acceptance_length": self.speculative_tokens / self.speculative_cycles if self.speculative_cycles else 0.0,
            "speculative_cycles": self.speculative_cycles, "plain_steps": self.plain_steps,
            "accepted_draft_tokens": self.origins.count(DRAFT),
            "accepted_lookup_tokens": self.origins.count(LOOKUP),
            "time_to_first_token_s": ttft, "latency_s": finished_at - self.created,
            "time_per_output_token_s": decode / (n - 1) if n > 1 else 0.0,
            "tokens_per_second": n / (finished_at - self.created) if finished_at > self.created else 0.0,
        }

    def continuation(self) -> tuple[list[int], GenerationConfig]:
        """Prompt and config to resume this job in a fresh session after a failed step: the
        prompt plus what was committed, the same seed, the remaining length. Greedy rows resume
        token for token; sampled rows keep the target's distribution exactly."""
        config = GenerationConfig(**{**self.config.__dict__,
                                     "max_new_tokens": self.config.max_new_tokens - len(self.output)})
        return self.prompt + self.output, config


def _as_list(ids) -> list[int]:
    """The ids as a list, copied only when they are not one (a copy of a huge prompt holds the GIL)."""
    return ids if isinstance(ids, list) else list(ids)


def encode_request(request: ApiRequest, tokenizer, vocab_size: int, at_most: int | None = None) -> list[int]:
    """The prompt's token ids (no more than `at_most` of a text prompt), or ApiError 400."""
    try:
        if request.kind == "chat":
            return _as_list(encode_messages(tokenizer, [dict(m) for m in request.messages], at_most=at_most))
        if request.prompt_ids is not None:
            bad = next((t for t in request.prompt_ids if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise bad_request(f"'prompt' token id {bad} is outside the vocabulary (0..{vocab_size - 1}).", "prompt")
            return list(request.prompt_ids)
        if not request.prompt_text:
            raise bad_request("'prompt' must not be empty.", "prompt")
        return _as_list(encode_text(tokenizer, request.prompt_text, at_most))
    except DFlash2Error as err:
        raise bad_request(str(err), "messages" if request.kind == "chat" else "prompt") from None


# request field -> the GenerationConfig field it sets
_CONFIG_FIELDS = {"max_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                  "seed": "seed"}


def build_job(request: ApiRequest, pipeline, defaults: RequestDefaults, sink: Callable[[object], None],
              text_tokenizer=None, tokenizer=None) -> Job:
    """`tokenizer` encodes the prompt (default: the pipeline's); `text_tokenizer` decodes the
    job's tokens in the scheduler thread: give each thread its own copy of the tokenizer
    (Rust-backed tokenizers fail with "Already borrowed" when one thread encodes while another
    decodes with the same object)."""
    decoder = pipeline.decoder
    limit = decoder.target.max_positions
    # one id more than the context holds: enough to know a prompt is too long, however long it is
    prompt = encode_request(request, tokenizer or pipeline.tokenizer, decoder.target.vocab_size, limit + 1)
    where = "messages" if request.kind == "chat" else "prompt"
    if len(prompt) > limit and request.prompt_ids is None:
        raise bad_request(f"This model's context is too short for the request: the prompt alone is more than the "
                          f"context limit of {limit} tokens. Shorten the prompt.", where, "context_length_exceeded")
    seed = request.seed if request.seed is not None else defaults.seed
    config = GenerationConfig(
        max_new_tokens=request.max_tokens if request.max_tokens is not None else defaults.max_tokens,
        temperature=request.temperature if request.temperature is not None else defaults.temperature,
        top_p=request.top_p if request.top_p is not None else defaults.top_p,
        top_k=request.top_k if request.top_k is not None else defaults.top_k,
        seed=seed if seed is not None else secrets.randbits(63),
        stop_token_ids=tuple(pipeline.stop_token_ids))
    _check_fields(config, request)
    if request.max_tokens is None:  # the default, but never more than fits
        room = context_room(len(prompt), decoder.block_size(config), decoder.target.max_positions)
        if room >= 1:
            config.max_new_tokens = min(config.max_new_tokens, room)
    try:
        decoder.check([prompt], config)
    except ContextLimitError as err:
        field = request.max_tokens_field
        raise bad_request(f"This model's context is too short for the request: prompt of {err.prompt_tokens} tokens "
                          f"+ '{field}' {err.max_new_tokens} + block size {err.block} = {err.total} exceeds the "
                          f"context limit of {err.limit} tokens. Shorten the prompt or lower '{field}'.", where,
                          "context_length_exceeded") from None
    except DFlash2Error as err:
        raise bad_request(f"{err}.", where) from None
    prefix = "chatcmpl-" if request.kind == "chat" else "cmpl-"
    job = Job(prefix + uuid.uuid4().hex[:24], request, prompt, config, sink,
              num_spec_tokens=max(decoder.block_size(config) - 1, 0))
    job.stream = TextStream(text_tokenizer or pipeline.tokenizer, request.stop)
    return job


def _check_fields(config: GenerationConfig, request: ApiRequest) -> None:
    """The engine's rule for each generation field, one field at a time, so that a refusal names
    the request field that broke it (an ApiError 400 with that `param`)."""
    for field, name in _CONFIG_FIELDS.items():
        try:
            GenerationConfig(**{name: getattr(config, name)}).validate()
        except SettingError as err:
            shown = request.max_tokens_field if field == "max_tokens" else field
            raise bad_request(f"'{shown}' {err.problem}.", shown) from None

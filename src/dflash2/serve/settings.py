"""What a `dflash2 serve` process is configured with, checked before anything is loaded.

Contract:
- `RequestDefaults`: the generation settings a request gets for every field it leaves out
  (`max_tokens`, `temperature`, `top_p`, `top_k`, `seed`; `seed=None` draws a fresh seed per
  request, so unseeded sampled requests differ while seeded ones repeat exactly).
- `ServeSettings`: the model (target, draft, device, dtype (`auto`: `devices`), exact verify, speculation policy), the listener
  (host, port; port 0 picks a free one), the batch and queue bounds, the API key, the drain
  timeout, the request-size limit, the defaults and what a response says of its speculative
  decoding (`per_request_spec_decode_metrics`, vLLM's option: none, summary or detailed). Frozen: the server reads it, never changes it.
- `validate()` raises `DFlash2Error` with one line naming the offending option (as the command
  line spells it); the generation defaults are checked by the engine's own rule
  (`GenerationConfig.validate`, whose `SettingError` names the field), so a default can never be
  something a request could not ask for.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.decoding.policy import SPECULATE_MODES
from dflash2.runtime.devices import resolve_precision
from dflash2.errors import DFlash2Error, SettingError, require
from dflash2.runtime.machine import announce_threads
from dflash2.serve.spec_decode import LEVELS

API_KEY_ENV = "DFLASH2_API_KEY"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

# engine field -> command-line option, to name defaults in errors as the user typed them
_DEFAULT_FLAGS = {"max_new_tokens": "--max-tokens", "temperature": "--temperature", "top_p": "--top-p",
                  "top_k": "--top-k", "seed": "--seed"}


@dataclass(frozen=True)
class RequestDefaults:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def validate(self) -> None:
        config = GenerationConfig(max_new_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                                  top_k=self.top_k, seed=0 if self.seed is None else self.seed)
        try:
            config.validate()
        except SettingError as err:
            raise DFlash2Error(f"{_DEFAULT_FLAGS.get(err.name, err.name)} {err.problem}") from None


@dataclass(frozen=True)
class ServeSettings:
    target: str = "smollm2"
    draft: str | None = None
    no_draft: bool = False
    device: str = "cpu"
    dtype: str = "auto"                      # devices.resolve_precision: bfloat16 where native, else float32
    draft_dtype: str = "auto"
    exact_verify: bool = False               # decoding.verifier.exact
    weights: str = "float"                   # pipeline.check_weights: float, int8 or int4
    speculate: str = "auto"
    proposer: str | None = None              # draft | lookup | hybrid | mtp (None: the pipeline's default)
    tiny: bool = False                       # tiny random models (tests); see pipeline.tiny_pipeline
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str | None = None            # the id clients pass as `model`; default: the target's name
    max_batch: int = 16                      # rows decoded together
    max_queue: int = 64                      # requests waiting for a row; beyond it: 429
    retry_after_s: int = 1                   # the Retry-After a 429 carries
    api_key: str | None = None
    drain_timeout_s: float = 60.0            # SIGTERM: how long in-flight requests may take to finish
    max_request_bytes: int = 4 * 2**20       # a larger request body: 413
    log_level: str = "info"
    access_log: bool = False
    threads: int | None = None               # torch CPU threads
    per_request_spec_decode_metrics: str = "none"   # spec_decode.LEVELS: vLLM's per-request `metrics` object
    defaults: RequestDefaults = field(default_factory=RequestDefaults)

    @property
    def served_model(self) -> str:
        if self.model_name:
            return self.model_name
        return "tiny-random-llama" if self.tiny else self.target

    def validate(self) -> None:
        resolve_precision(self.dtype, self.device)   # an unknown --dtype: one line, before the socket or a model
        require(self.speculate in SPECULATE_MODES,
                f"--speculate must be one of {', '.join(SPECULATE_MODES)}, got '{self.speculate}'")
        require(not (self.no_draft and self.draft), "give at most one of --draft and --no-draft")
        require(isinstance(self.port, int) and 0 <= self.port <= 65535, f"--port must be in 0..65535, got {self.port}")
        require(bool(self.host), "--host must not be empty")
        require(self.max_batch >= 1, f"--max-batch must be at least 1, got {self.max_batch}")
        require(self.max_queue >= 0, f"--max-queue must be 0 or more, got {self.max_queue}")
        require(self.retry_after_s >= 1, f"--retry-after must be at least 1 second, got {self.retry_after_s}")
        require(self.drain_timeout_s > 0, f"--drain-timeout must be positive, got {self.drain_timeout_s}")
        require(isinstance(self.max_request_bytes, int) and self.max_request_bytes >= 1024,
                f"--max-request-mb must be at least 1 KiB (0.001), got {self.max_request_bytes / 2**20:g}")
        require(self.api_key is None or self.api_key.strip() != "", "--api-key must not be empty")
        announce_threads(self.threads)
        require(self.log_level in ("critical", "error", "warning", "info", "debug"),
                f"--log-level must be one of critical, error, warning, info, debug, got '{self.log_level}'")
        require(self.model_name is None or self.model_name.strip() != "", "--model-name must not be empty")
        require(self.per_request_spec_decode_metrics in LEVELS, f"--per-request-spec-decode-metrics must be one "
                f"of {', '.join(LEVELS)}, got '{self.per_request_spec_decode_metrics}'")
        self.defaults.validate()

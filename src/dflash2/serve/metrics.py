"""What `GET /metrics` reports, in the Prometheus text format (prometheus-client, a private registry
per server, so several servers can live in one process).

Contract (metric names; counters end in `_total` on the wire):
- `dflash2_requests_total{endpoint, status}`: every HTTP response by route (unknown paths:
  "other") and final status code, 4xx and 5xx included (recorded by `guard.Guard`; a stream
  with its final status; 499: the client went away before the answer was complete).
- `dflash2_prompt_tokens_total`, `dflash2_generation_tokens_total`: tokens admitted / committed.
- `dflash2_finished_total{reason}`: generations by how they ended (stop, length, cancelled, error).
- `dflash2_acceptance_length`: histogram of per-request acceptance length (requests with at least
  one speculative cycle); `dflash2_speculative_tokens_total / dflash2_speculative_cycles_total`
  is the server-wide acceptance length.
- `dflash2_accepted_tokens_total{source}`: accepted proposed tokens of finished requests by where
  they came from (`draft`: the draft model, `lookup`: lookup proposals).
- `dflash2_time_to_first_token_seconds`, `dflash2_time_per_output_token_seconds`,
  `dflash2_request_latency_seconds`: histograms, from the request's arrival.
- `dflash2_queue_depth`, `dflash2_running_batch_size`: gauges read from the scheduler when scraped.
- `dflash2_model_info{model, draft, speculate}`: 1.
- vLLM's speculative-decoding counters, by its names, labels and meaning (`vllm/v1/spec_decode/
  metrics.py`), so that dashboards and scripts made for vLLM read this server unchanged:
  `vllm:spec_decode_num_drafts_total{model_name, engine}` (speculative cycles, one per row and
  verify pass), `vllm:spec_decode_num_draft_tokens_total` (proposed tokens verified),
  `vllm:spec_decode_num_accepted_tokens_total` (of them accepted; the target's bonus token not
  counted) and `vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name, engine, position}`
  (cycles that accepted the proposed token at 0-based `position`; every position 0 .. block size - 2
  exported from the start). `engine` is always "0" (one engine per server). The same four under
  `dflash2_spec_decode_*_total` add the label `source` (`spec_decode.SOURCES`: draft, lookup, tree),
  which no engine has: summed over `source` they equal vLLM's. Recorded per cycle, as decoding goes
  (`spec_step`), so they include requests still running.
Recording methods are thread-safe (the scheduler thread and the event loop both record).
"""
from __future__ import annotations

from typing import Callable

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

from dflash2.serve.spec_decode import SOURCES, SpecStep

CONTENT_TYPE = CONTENT_TYPE_LATEST
disable_created_metrics()  # no `_created` series: counters and histograms only

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
_ACCEPTANCE_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0)


ENGINE = "0"   # vLLM's `engine` label: the engine core's index (a server here has one)


class _SpecDecodeCounters:
    """vLLM's four speculative-decoding counter families under one prefix (`vllm:` or `dflash2_`),
    labelled `labels` (and, per position, `position`); `child(values, positions)` is one label set's."""

    def __init__(self, registry, prefix: str, labels: list[str]):
        def family(name: str, text: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(f"{prefix}spec_decode_{name}", text, labels + list(extra), registry=registry)

        self.drafts = family("num_drafts", "Number of spec decoding drafts.")
        self.draft_tokens = family("num_draft_tokens", "Number of draft tokens.")
        self.accepted = family("num_accepted_tokens", "Number of accepted tokens.")
        self.per_pos = family("num_accepted_tokens_per_pos", "Accepted tokens per draft position.", ("position",))

    def child(self, values: list[str], positions: int) -> "_SpecDecodeChild":
        return _SpecDecodeChild(self, values, positions)


class _SpecDecodeChild:
    """The four counters of one label set; every position below `positions` exported from the start."""

    def __init__(self, families: _SpecDecodeCounters, values: list[str], positions: int):
        self.families, self.values = families, values
        self.drafts = families.drafts.labels(*values)
        self.draft_tokens = families.draft_tokens.labels(*values)
        self.accepted = families.accepted.labels(*values)
        self.per_pos = [families.per_pos.labels(*values, str(i)) for i in range(positions)]

    def observe(self, step: SpecStep) -> None:
        self.drafts.inc()
        self.draft_tokens.inc(step.drafted)
        self.accepted.inc(step.accepted)
        while len(self.per_pos) < step.accepted:   # a row whose block is larger than the server's default
            self.per_pos.append(self.families.per_pos.labels(*self.values, str(len(self.per_pos))))
        for position in range(step.accepted):
            self.per_pos[position].inc()


class ServerMetrics:
    def __init__(self, model: str, draft: str, speculate: str, num_spec_tokens: int = 0):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("dflash2_requests", "HTTP requests by endpoint and final status code",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("dflash2_prompt_tokens", "Prompt tokens admitted to the batch", registry=r)
        self.generation_tokens = Counter("dflash2_generation_tokens", "Tokens committed (generated)", registry=r)
        self.finished = Counter("dflash2_finished", "Generations by how they ended", ["reason"], registry=r)
        self.acceptance = Histogram("dflash2_acceptance_length", "Per-request acceptance length (tokens committed "
                                    "per speculative cycle)", buckets=_ACCEPTANCE_BUCKETS, registry=r)
        self.spec_tokens = Counter("dflash2_speculative_tokens", "Tokens committed by speculative cycles", registry=r)
        self.spec_cycles = Counter("dflash2_speculative_cycles", "Speculative cycles (per row)", registry=r)
        self.accepted = Counter("dflash2_accepted_tokens", "Accepted proposed tokens by where they came from "
                                "(draft: the draft model, lookup: lookup proposals)", ["source"], registry=r)
        self.ttft = Histogram("dflash2_time_to_first_token_seconds", "Arrival to first committed token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("dflash2_time_per_output_token_seconds", "Decode time per output token after the first",
                              buckets=_TOKEN_BUCKETS, registry=r)
        self.latency = Histogram("dflash2_request_latency_seconds", "Arrival to last token",
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("dflash2_queue_depth", "Requests waiting for a row in the batch", registry=r)
        self.running = Gauge("dflash2_running_batch_size", "Rows in the running batch", registry=r)
        Gauge("dflash2_model_info", "The served model", ["model", "draft", "speculate"],
              registry=r).labels(model, draft, speculate).set(1)
        self.vllm_spec = _SpecDecodeCounters(r, "vllm:", ["model_name", "engine"]).child(
            [model, ENGINE], num_spec_tokens)
        by_source = _SpecDecodeCounters(r, "dflash2_", ["model_name", "engine", "source"])
        self.spec_by_source = {source: by_source.child([model, ENGINE, source], num_spec_tokens) for source in SOURCES}

    def watch(self, queue_depth: Callable[[], int], running: Callable[[], int]) -> None:
        self.queue_depth.set_function(queue_depth)
        self.running.set_function(running)

    # --- recording
    def request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def admitted(self, prompt_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)

    def committed(self, tokens: int) -> None:
        self.generation_tokens.inc(tokens)

    def spec_step(self, step: SpecStep) -> None:
        """One speculative cycle of one row (vLLM's counters, and by source)."""
        self.vllm_spec.observe(step)
        self.spec_by_source[step.source].observe(step)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def ended(self, reason: str, stats: dict | None = None, speculative_tokens: int = 0, cycles: int = 0) -> None:
        self.finished.labels(reason).inc()
        if stats is None:
            return
        self.latency.observe(stats["latency_s"])
        if stats["time_per_output_token_s"] > 0:
            self.tpot.observe(stats["time_per_output_token_s"])
        for source in ("draft", "lookup"):
            if stats.get(f"accepted_{source}_tokens"):
                self.accepted.labels(source).inc(stats[f"accepted_{source}_tokens"])
        if cycles:
            self.acceptance.observe(stats["acceptance_length"])
            self.spec_tokens.inc(speculative_tokens)
            self.spec_cycles.inc(cycles)

    def render(self) -> bytes:
        return generate_latest(self.registry)

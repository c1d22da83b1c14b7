"""vLLM's speculative-decoding metrics from a live `dflash2 serve` (tiny random models on loopback):
`/metrics` read with Prometheus's own text parser, vLLM's counter names and labels, the per-source
counters, and the per-request `metrics.speculative_decoding` object, all equal to what the engine did
when it decoded the same prompts, one after another in one session, alone."""
from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.pipeline import Pipeline
from dflash2.targets.tiny import TinyTokenizer, tiny_draft, tiny_target
from serve_util import LiveServer
from test_lookup import repeating_prompts

VOCAB = 16          # a small vocabulary: the tiny target repeats itself, so lookup proposals get accepted
MAX_TOKENS = 24
VLLM = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def pipeline(proposer: str) -> Pipeline:
    target = tiny_target("llama", vocab_size=VOCAB)
    draft = tiny_draft(target, seed=0) if proposer != "lookup" else None
    adapter = TargetAdapter(target, None if draft is None else draft.config.target_layer_ids)
    decoder = SpeculativeDecoder(adapter, draft, speculate="always", proposer=proposer)
    return Pipeline(decoder, TinyTokenizer(VOCAB), (), f"tiny ({proposer})", False)


def engine_stats(decoder, prompts: list[list[int]]) -> list:
    """Each prompt decoded alone, one after another in one session (as the server, asked in turn, did)."""
    session, stats = decoder.session(), []
    for prompt in prompts:
        session.add([prompt], GenerationConfig(max_new_tokens=MAX_TOKENS, temperature=0.0))
        result = None
        while result is None:
            result = next((e.result for e in session.step() if e.result is not None), None)
        stats.append(result.stats)
    return stats


def scrape(server) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, parsed by prometheus_client's parser: (name, labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(server.metrics()) for s in family.samples}


def value(samples, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture(scope="module", params=["lookup", "hybrid"])
def served(request):
    server = LiveServer(pipeline(request.param), max_batch=4, per_request_spec_decode_metrics="detailed")
    yield request.param, server
    server.close()


def test_counters_and_per_request_metrics_equal_what_the_engine_did(served):
    proposer, server = served
    prompts = repeating_prompts(VOCAB, 5)
    replies = [httpx.post(server.url + "/v1/completions", timeout=60,
                          json={"model": server.model, "prompt": p, "max_tokens": MAX_TOKENS,
                                "return_token_ids": True}).json() for p in prompts]
    want = engine_stats(pipeline(proposer).decoder, prompts)
    server.wait_idle()
    samples = scrape(server)

    block = server.pipeline.decoder.block_size(GenerationConfig())
    totals = {"steps": 0, "drafted": 0, "accepted": 0}
    per_pos = [0] * (block - 1)
    by_source: dict[str, list[int]] = {}
    for reply, stats in zip(replies, want):
        spec = reply["metrics"]["speculative_decoding"]
        choice = reply["choices"][0]
        assert spec["num_spec_steps"] == stats.cycles > 0
        assert spec["per_step_drafted"] == stats.drafts_per_cycle
        assert spec["num_accepted_draft_tokens"] == sum(stats.accepted_by_source.values())
        assert spec["per_step_source"].count("tree") == stats.tree_cycles
        assert [sum(a > p for a in spec["per_step_accepted"]) for p in range(block - 1)] == stats.accepted_at_position
        # vLLM's summary, from the steps
        assert spec["num_spec_tokens"] == block - 1 and len(spec["acceptance_histogram"]) == block
        assert spec["acceptance_histogram"] == [spec["per_step_accepted"].count(j) for j in range(block)]
        assert spec["num_draft_tokens"] == sum(spec["per_step_drafted"])
        assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["num_accepted_draft_tokens"] / stats.cycles)
        assert spec["draft_acceptance_rate"] == pytest.approx(spec["num_accepted_draft_tokens"] / spec["num_draft_tokens"])
        # and from the tokens the reply carries: each accepted token is marked by its source
        assert sum(o in ("draft", "lookup") for o in choice["origins"]) == spec["num_accepted_draft_tokens"]
        totals["steps"] += stats.cycles
        totals["drafted"] += sum(stats.drafts_per_cycle)
        totals["accepted"] += spec["num_accepted_draft_tokens"]
        per_pos = [a + b for a, b in zip(per_pos, stats.accepted_at_position)]
        for source, drafted, accepted in zip(spec["per_step_source"], spec["per_step_drafted"], spec["per_step_accepted"]):
            counts = by_source.setdefault(source, [0, 0, 0])
            counts[0], counts[1], counts[2] = counts[0] + 1, counts[1] + drafted, counts[2] + accepted
    assert totals["accepted"] > 0, "nothing accepted: the test would not exercise the accepted counters"

    vllm = {"model_name": server.model, "engine": "0"}
    assert [value(samples, name + "_total", **vllm) for name in VLLM] == [totals["steps"], totals["drafted"],
                                                                         totals["accepted"]]
    assert [value(samples, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p), **vllm)
            for p in range(block - 1)] == per_pos                           # every position exported, zeros too
    for source in ("draft", "lookup", "tree"):
        got = [value(samples, f"dflash2_spec_decode_num_{n}_total", source=source, **vllm)
               for n in ("drafts", "draft_tokens", "accepted_tokens")]
        assert got == by_source.get(source, [0, 0, 0]), source
    if proposer == "hybrid":
        assert "tree" in by_source, "no tree cycle: the per-source label would not be exercised"
    # the project's own counters stay
    assert value(samples, "dflash2_speculative_cycles_total") == totals["steps"]


def test_a_stream_carries_the_metrics_in_its_usage_chunk_only(served):
    _, server = served
    api = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    prompt = repeating_prompts(VOCAB, 1, seed=3)[0]
    chunks = list(api.completions.create(model=server.model, prompt=prompt, max_tokens=MAX_TOKENS, stream=True,
                                         stream_options={"include_usage": True}))
    carrying = [c for c in chunks if (c.model_extra or {}).get("metrics") is not None]
    assert len(carrying) == 1 and carrying[0] is chunks[-1] and chunks[-1].usage is not None
    assert chunks[-1].choices == []
    spec = carrying[0].model_extra["metrics"]["speculative_decoding"]
    whole = api.completions.create(model=server.model, prompt=prompt, max_tokens=MAX_TOKENS)
    assert spec == whole.model_extra["metrics"]["speculative_decoding"]        # greedy: the same cycles
    plain = list(api.completions.create(model=server.model, prompt=prompt, max_tokens=MAX_TOKENS, stream=True))
    assert not any((c.model_extra or {}).get("metrics") for c in plain)          # as vLLM: only with usage


def test_by_default_a_response_carries_no_metrics_object_and_summary_leaves_out_the_steps():
    for level, keys in (("none", None), ("summary", {"mean_acceptance_length", "draft_acceptance_rate",
                                                     "acceptance_histogram", "num_spec_steps",
                                                     "num_accepted_draft_tokens", "num_draft_tokens",
                                                     "num_spec_tokens"})):
        server = LiveServer(pipeline("lookup"), per_request_spec_decode_metrics=level)
        try:
            reply = httpx.post(server.url + "/v1/completions", timeout=60,
                               json={"model": server.model, "prompt": [3, 4, 5, 3, 4, 5], "max_tokens": 8}).json()
        finally:
            server.close()
        if keys is None:
            assert "metrics" not in reply and "dflash2" in reply
        else:
            assert set(reply["metrics"]["speculative_decoding"]) == keys

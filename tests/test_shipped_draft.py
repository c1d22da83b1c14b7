"""The draft that ships for the default target: within the size budget, the default of
`load_decoder("smollm2")`, lossless against autoregressive decoding (greedy, fp32 target), and
actually trained (a fresh draft's acceptance length is 1.0 on real text)."""
from __future__ import annotations

from dflash2.targets.chat import encode_prompt
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.pipeline import load_decoder, shipped_draft_path

PROMPTS = [
    "Write a python function to find the first repeated character in a given string.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
]


def test_shipped_checkpoint_fits_the_budget():
    path = shipped_draft_path("smollm2")
    assert path is not None
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    assert size <= 40 * 1024 * 1024, f"shipped draft is {size / 2**20:.1f} MiB"


def test_shipped_draft_is_default_lossless_and_trained(smollm2_cache, monkeypatch):
    cache, _ = smollm2_cache
    monkeypatch.setenv("DFLASH2_CACHE", str(cache))
    pipe = load_decoder("smollm2", speculate="always", dtype="float32")
    assert pipe.trained_draft and pipe.draft_description.startswith("shipped smollm2-dflash2")
    assert pipe.decoder.draft.config.is_dflash2
    prompts = [encode_prompt(pipe.tokenizer, text) for text in PROMPTS]
    config = GenerationConfig(max_new_tokens=40, stop_token_ids=tuple(pipe.stop_token_ids))
    speculative = pipe.decoder.generate(prompts, config)
    autoregressive = SpeculativeDecoder(pipe.decoder.target).generate(prompts, config)
    assert [r.tokens for r in speculative] == [r.tokens for r in autoregressive]
    cycles = sum(r.stats.cycles for r in speculative)
    committed = sum(sum(r.stats.committed_per_cycle) for r in speculative)
    assert committed / cycles > 1.1  # an untrained draft gives 1.0 here

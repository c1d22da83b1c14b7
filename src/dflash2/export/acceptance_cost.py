"""What dropping the DFlash2 parts costs: acceptance length before and after, measured.

Contract: `measure_cost(pipe, exported, prompts, max_new_tokens)` decodes each prompt (batch 1,
greedy, the whole block verified every cycle: `classical_decoder`) with the pipeline's own draft
and with `exported` (the re-loaded export) on the same target adapter, and returns an `AcceptanceCost`: the pooled acceptance length of each
(committed tokens / verification passes over all prompts, as `dflash2 bench` pools it, from each
result's `stats`) and whether both outputs are identical (greedy: both are the target's own).
`measurement_prompts(tokenizer, n)` takes n prompts round-robin from the shipped benchmark sets
(GSM8K, MATH-500, HumanEval, MBPP, MT-Bench first turns), chat-encoded.
`draft_runs(target, draft, prompts, max_new_tokens, stop_ids, block_size)` decodes each prompt
that way (greedy, batch 1; `block_size` None: the draft's own, k + 1: at most k drafts per cycle,
the draft run on a block of k + 1 positions as llama.cpp's `--spec-draft-n-max k` runs it);
`expected_tokens_by_width(...)` is E(k), the pooled tokens per cycle, for each k.
"""
from __future__ import annotations

import inspect

from tqdm import tqdm

from dflash2.data.prompts import BENCHMARKS, load_benchmark
from dflash2.decoding.loop.engine import GenerationConfig, GenerationResult, SpeculativeDecoder
from dflash2.export.settings import AcceptanceCost
from dflash2.model.draft import DFlash2DraftModel
from dflash2.pipeline import Pipeline
from dflash2.targets.chat import encode_messages


def measurement_prompts(tokenizer, n: int) -> list[list[int]]:
    per_set = -(-n // len(BENCHMARKS))
    pools = [load_benchmark(name, per_set) for name in BENCHMARKS]
    picked = [pool[i] for i in range(per_set) for pool in pools if i < len(pool)][:n]
    return [encode_messages(tokenizer, [{"role": "user", "content": conv.turns[0]}]) for conv in picked]


def classical_decoder(target, draft: DFlash2DraftModel | None) -> SpeculativeDecoder:
    """A decoder that drafts and verifies the whole block every cycle (as vLLM, MLX dflash and
    llama.cpp do), so acceptance lengths measure the draft, not a speculation policy."""
    if "speculate" in inspect.signature(SpeculativeDecoder).parameters:
        return SpeculativeDecoder(target, draft, speculate="always" if draft is not None else "never")
    return SpeculativeDecoder(target, draft)


def draft_runs(target, draft: DFlash2DraftModel | None, prompts: list[list[int]], max_new_tokens: int,
               stop_ids, block_size: int | None = None, progress: str | None = None) -> list[GenerationResult]:
    """`progress`: a label for a progress bar over the prompts (None: none)."""
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0, block_size=block_size,
                              stop_token_ids=tuple(stop_ids))
    decoder = classical_decoder(target, draft)
    shown = prompts if progress is None else tqdm(prompts, desc=progress, unit="prompt", leave=False)
    return [decoder.generate([ids], config)[0] for ids in shown]


def expected_tokens_by_width(target, draft: DFlash2DraftModel, prompts: list[list[int]], max_new_tokens: int,
                             stop_ids, widths) -> dict[int, float]:
    return {k: _pooled(draft_runs(target, draft, prompts, max_new_tokens, stop_ids, k + 1)) for k in widths}


def _pooled(results) -> float:
    cycles = sum(r.stats.cycles for r in results)
    return sum(r.stats.acceptance_length * r.stats.cycles for r in results) / cycles if cycles else 0.0


def measure_cost(pipe: Pipeline, exported: DFlash2DraftModel, prompts: list[list[int]],
                 max_new_tokens: int) -> AcceptanceCost:
    target, stops = pipe.decoder.target, pipe.stop_token_ids
    original = draft_runs(target, pipe.decoder.draft, prompts, max_new_tokens, stops, progress="the draft as it is")
    stripped = draft_runs(target, exported, prompts, max_new_tokens, stops, progress="the export")
    return AcceptanceCost(
        prompts=len(prompts), new_tokens_per_prompt=max_new_tokens,
        original_acceptance_length=_pooled(original), exported_acceptance_length=_pooled(stripped),
        identical_outputs=all(a.tokens == b.tokens for a, b in zip(original, stripped)))

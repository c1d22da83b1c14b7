"""`generate --compare` compares like with like: both decoders are warmed up, untimed, before either
timed run, and the speculative run learns nothing from the warm-up of the same prompt."""
from __future__ import annotations

import torch

from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.eval.compare import WARMUP_TOKENS, compare
from dflash2.targets.tiny import tiny_draft, tiny_target


class Recording(SpeculativeDecoder):
    """A real decoder that notes every request it decodes: (speculative?, max_new_tokens), and the
    policy of each speculative one."""
    log: list[tuple[bool, int]] = []
    policies: list = []

    def check(self, prompts, config):
        Recording.log.append((self.draft is not None, config.max_new_tokens))
        if self.draft is not None:
            Recording.policies.append(self.policy)
        super().check(prompts, config)


def test_both_sides_are_warmed_up_before_either_is_timed():
    torch.manual_seed(0)
    target = tiny_target("llama", seed=0)
    draft = tiny_draft(target, seed=0)
    decoder = Recording(TargetAdapter(target, draft.config.target_layer_ids), draft)
    Recording.log, Recording.policies = [], []
    config = GenerationConfig(max_new_tokens=3 * WARMUP_TOKENS)
    comparison = compare(decoder, [5, 9, 11, 13, 17, 5, 9, 11], config)
    short, full = WARMUP_TOKENS, 3 * WARMUP_TOKENS
    assert Recording.log == [(True, short), (False, short), (True, full), (False, full)]
    assert comparison.identical and len(comparison.speculative.tokens) == full   # lossless, greedy
    assert comparison.speculative.stats.new_tokens == full                       # the timed runs' own counts
    assert comparison.speculative.timing.draft_passes > 0 and comparison.baseline.timing.draft_passes == 0
    warm, timed = Recording.policies   # the timed run's policy is not the warm-up's: same cost model, nothing learned
    assert timed is not warm and timed.costs is warm.costs

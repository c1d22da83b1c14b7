"""The lossless audit (eval.audit): a broken acceptance rule comes out as defects, a correct decoder as
none, and a divergence between the float32 target's top two tokens as a near-tie."""
from __future__ import annotations

import json

import torch

from dflash2.cli import main
from dflash2.decoding.loop.engine import DecodeSession, GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.eval.audit import NEAR_TIE_BOUNDS, Reference, audit, classify, first_divergence
from dflash2.targets.tiny import tiny_draft, tiny_target
from matrix_util import template, work  # noqa: F401 (fixtures)


class OneExtraToken(DecodeSession):
    """A broken acceptance rule: accepts one draft token more than the target agreed to (the bonus is
    then the target's token after it), wherever the block had one left."""

    def _accept(self, block, logits, start):
        accepted, bonus, branch, per_branch = super()._accept(block, logits, start)
        extra = accepted < block.limits
        accepted = torch.where(extra, accepted + 1, accepted)
        rows = torch.arange(accepted.shape[0], device=accepted.device)
        bonus = torch.where(extra, logits.argmax(-1)[rows, accepted], bonus)
        return accepted, bonus, branch, per_branch


class BrokenDecoder(SpeculativeDecoder):
    def session(self, fixed: bool = False):
        return OneExtraToken(self, fixed)


def _prompts():
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(4, 120, (6 + i,), generator=generator).tolist() for i in range(6)]


def _audit(decoder_class):
    target = tiny_target("llama", seed=0)
    draft = tiny_draft(target, seed=0)
    adapter = TargetAdapter(target, draft.config.target_layer_ids)
    config = GenerationConfig(max_new_tokens=24)
    prompts = _prompts()
    plain = [r.tokens for r in SpeculativeDecoder(adapter).generate(prompts, config)]
    other = [r.tokens for r in decoder_class(adapter, draft, speculate="always").generate(prompts, config)]
    return audit(zip(prompts, plain, other), lambda: Reference(target), "float32")


def test_a_broken_acceptance_rule_comes_out_as_defects():
    found = _audit(BrokenDecoder)
    assert found.compared == 6 and found.mismatches >= 3
    assert found.defects == found.mismatches and found.near_ties == 0
    assert found.worst_margin > NEAR_TIE_BOUNDS["float32"]
    assert "defect" in found.line()


def test_the_correct_decoder_has_nothing_to_audit():
    found = _audit(SpeculativeDecoder)
    assert (found.compared, found.mismatches, found.defects, found.near_ties, found.worst_margin) == (6, 0, 0, 0, None)


def test_a_divergence_between_the_top_two_tokens_is_a_near_tie_within_the_bound():
    target = tiny_target("llama", seed=0)
    reference = Reference(target)
    prompt = _prompts()[0]
    z = reference.logits(prompt)
    top, runner_up = z.topk(2).indices.tolist()
    margin = float(z[top] - z[runner_up])
    tie = classify(reference, prompt, [top, 5], [runner_up, 5], 0, bound=margin * 1.01)
    assert (tie.kind, tie.plain_token, tie.other_token) == ("near-tie", top, runner_up)
    assert abs(tie.margin - margin) < 1e-6
    assert classify(reference, prompt, [top, 5], [runner_up, 5], 0, bound=margin * 0.99).kind == "defect"
    early = classify(reference, prompt, [top, 5], [top], 1, bound=1.0)
    assert early.kind == "defect" and early.margin is None
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None and first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([1, 2, 3], [1, 4, 3]) == 1


def test_generate_compare_reports_the_audit(work, capsys):
    assert main(["generate", "--target", "target", "--draft", "draft", "--prompt", "hello there", "--no-chat",
                 "--max-new-tokens", "12", "--compare", "--json", "--dtype", "bfloat16", "--speculate", "always"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["dtype"] == "bfloat16" and report["defects"] == 0
    assert report["near_ties"] == (0 if report["identical"] else 1)
    assert report["audit"]["near_tie_bound"] == NEAR_TIE_BOUNDS["bfloat16"]

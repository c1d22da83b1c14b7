"""The draft's candidate lattice as a tree source: its second path verified beside the main path.

The policy's pricing and calibration of the second branch, and greedy decoding with lattice trees
token for token Hugging Face generate() (fp32): an oracle lattice whose main path or second path is
the right one (batch 1 and 4), and the real tiny draft through the shipped decoder, with the
lattice on and off; a sliding-window target never verifies a tree."""
from __future__ import annotations

import random

import pytest
import torch

from conftest import TEST_DEVICE, OracleDecoder, OracleProposer, policy_choice
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.policy.cycle import LATTICE, Choice, CyclePlan, CycleRecord, Offer
from dflash2.decoding.policy import SpeculationPolicy
from dflash2.decoding.proposers.draft import Proposal
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.model.selector import SecondPath
from dflash2.targets.tiny import tiny_draft, tiny_target
from test_lookup import NEW_TOKENS, VOCAB, reference
from test_tree import _policy as tree_policy


# ---------------------------------------------------------------------- pricing and calibration
def _policy(per_token: float) -> SpeculationPolicy:
    policy = tree_policy(per_token)            # the draft calibrated: right as often as it is confident
    policy.tables[LATTICE].counts[True] = [[10.0 * i + 5.0, 100.0] for i in range(10)]   # the lattice likewise
    return policy


MAIN = [0.95, 0.45] + [0.95] * 5      # the draft is unsure of its second token only,
SECOND = [0.95, 0.45] + [0.95] * 5    # where its lattice's runner-up is about as likely


def test_the_policy_verifies_the_lattice_branch_when_width_is_cheap_and_not_when_dear():
    offer = Offer.of([True], draft=[MAIN], lattice=[SECOND], forks=[1])
    cheap = policy_choice(_policy(1e-5), 1, offer, 8)
    assert cheap.sources == ("tree",) and cheap.second_sources == (LATTICE,)
    n_draft, n_second = cheap.branches[0]
    assert n_draft > 1 and n_second > 1 and cheap.lengths[0] == n_draft + n_second - 1   # the fork's prefix once
    dear = policy_choice(_policy(0.010), 1, offer, 8)
    assert dear.sources == ("draft",) and not dear.branches


def test_sampled_rows_are_never_offered_the_lattice():
    offer = Offer.of([True, False], draft=[MAIN] * 2, lattice=[SECOND] * 2, forks=[1, 1])
    assert offer.forks == [1, None]
    choice = policy_choice(_policy(1e-5), 2, offer, 8)
    assert choice.sources[0] == "tree" and choice.sources[1] != "tree"


def test_the_lattice_is_calibrated_from_its_fork_on_and_only_when_reached():
    policy = _policy(1e-5)
    offer = Offer.of([True], draft=[MAIN], lattice=[[0.95, 0.35] + [0.95] * 5], forks=[1])
    choice = Choice(7, 0.0, 0.0, ("tree",), (7,), ((4, 4),), (LATTICE,))

    def reached(accepted_second: int) -> float:
        before = sum(n for _, n in policy.tables[LATTICE].counts[True])
        policy.observe(CycleRecord(1, offer, CyclePlan(True), choice, True, [7], [max(1, accepted_second)], 8,
                                   branch_accepted={0: (1, accepted_second)}))
        return sum(n for _, n in policy.tables[LATTICE].counts[True]) - before

    assert reached(0) == 0              # the shared first token was rejected: the branch was not reached
    assert reached(3) == 3              # its nodes 2..4 (3 of them) were reached; 2 accepted, the 4th rejected
    table = policy.tables[LATTICE].counts[True]
    assert table[3] == [35.0 + 1.0, 101.0]            # the runner-up at the fork (0.35): accepted once


# ---------------------------------------------------------------------- exactness
class LatticeProposer(OracleProposer):
    """Each row's reference continuation, wrong from a random position j on; its second path leaves
    it at j (at the last position when the main path is all right) and is right from there, or
    wrong too. `main_right` records, per cycle and row, how many main-path tokens were right."""

    def __init__(self, sequences, vocab_size, main_right: list, seed=0):
        super().__init__(sequences, vocab_size)
        self.random, self.main_right = random.Random(seed), main_right

    def propose(self, anchors, start_positions, block_size, temperature, seeds):
        right = super().propose(anchors, start_positions, block_size, temperature, seeds).tokens
        t_len = right.shape[1]
        main, second, forks, rights = right.clone(), right.clone(), [], []
        for r in range(right.shape[0]):
            j = self.random.choice([0, 0, 1, 2, t_len])
            wrong = (right[r] + 1 + torch.arange(t_len)) % self.vocab_size
            main[r, j:] = wrong[j:]
            fork = min(j, t_len - 1)
            if j == t_len or self.random.random() < 0.3:     # the second path is wrong from its fork on
                second[r, fork:] = (right[r, fork:] + 7) % self.vocab_size
            second[r, :fork] = main[r, :fork]
            forks.append(fork)
            rights.append(j)
        self.main_right.append(rights)
        confidence = torch.full(main.shape, 0.5)
        return Proposal(main, None, confidence, SecondPath(second, torch.tensor(forks), confidence.clone()))


class LatticePolicy(SpeculationPolicy):
    """Every greedy row that has a second path verifies it as a tree, at random branch lengths."""

    def __init__(self, seed: int = 0):
        super().__init__("always")
        self.random = random.Random(seed)

    def prepare(self, b, offer, block, can_draft=True):
        return CyclePlan(can_draft and block > 1, chooser=lambda offer, seconds: self.choose(b, offer))

    def choose(self, b, offer):
        lengths, branches = [], []
        for r in range(b):
            t_len, fork = len(offer.draft[r]), offer.forks[r]
            n_draft, n_second = self.random.randint(1, t_len), self.random.randint(fork + 1, t_len)
            lengths.append(n_draft + n_second - min(fork, n_draft))
            branches.append((n_draft, n_second))
        return Choice(max(lengths), 0.0, 0.0, ("tree",) * b, tuple(lengths), tuple(branches), (LATTICE,) * b)


class LatticeDecoder(OracleDecoder):
    def __init__(self, target, prompts, outputs, block_size, seed=0):
        super().__init__(target, prompts, outputs, block_size)
        self.seed, self.main_right = seed, []
        self.policy = LatticePolicy(seed)

    def new_oracle(self):
        self.seed += 1
        return LatticeProposer(self.oracle.sequences, self.target.vocab_size, self.main_right, self.seed)


@pytest.fixture(scope="module")
def tiny_models():
    return {family: tiny_target(family, vocab_size=VOCAB).to(TEST_DEVICE) for family in ("llama", "qwen3", "gemma3")}


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_lattice_trees_match_target_greedy(tiny_models, family, batch_size):
    target = tiny_models[family]
    prompts, expected = reference(family, target)
    decoder = LatticeDecoder(TargetAdapter(target), prompts, expected, 8)
    outputs = []
    for i in range(0, len(prompts), batch_size):
        results = decoder.generate(prompts[i:i + batch_size], GenerationConfig(max_new_tokens=NEW_TOKENS, block_size=8))
        outputs += [r.tokens for r in results]
        assert all(r.stats.tree_cycles > 0 for r in results)
    assert outputs == expected


def test_the_second_branch_wins_cycles(tiny_models):
    """One row at a time, cycle by cycle: the second branch is kept when it is the right one
    (accepted beyond the main path's right tokens), the main path when it is, and the output stays
    the target's."""
    target = tiny_models["llama"]
    prompts, expected = reference("llama", target)
    decoder = LatticeDecoder(TargetAdapter(target), prompts, expected, 8, seed=3)
    accepted = []
    for prompt, want in zip(prompts, expected):
        decoder.oracle = OracleProposer([prompt + want], target.vocab_size)
        session, tokens = decoder.session(), []
        session.add([prompt], GenerationConfig(max_new_tokens=NEW_TOKENS, block_size=8))
        while session:
            for event in session.step():
                tokens += event.tokens
                if event.commit.drafted:
                    accepted.append(event.commit.accepted)
        assert tokens == want
    rights = [r[0] for r in decoder.main_right]
    assert len(rights) == len(accepted)
    assert sum(a > j for a, j in zip(accepted, rights)) > 0             # the second branch won
    assert sum(a == j and j > 0 for a, j in zip(accepted, rights)) > 0   # and the main path won


def test_the_real_draft_offers_its_lattice_and_stays_exact(tiny_models):
    """The shipped decoder with the real tiny draft (`proposer="draft"`, `speculate="always"`): with
    the lattice on, trees are verified (the only second branch a draft-only decoder has) and the
    output is exact; with it off, none are."""
    target = tiny_models["llama"]
    prompts, expected = reference("llama", target)
    draft = tiny_draft(target).to(TEST_DEVICE)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, block_size=8)
    for lattice in (True, False):
        decoder = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft,
                                     speculate="always", proposer="draft", lattice=lattice)
        results = decoder.generate(prompts[:4], config)
        assert [r.tokens for r in results] == expected[:4]
        trees = sum(r.stats.tree_cycles for r in results)
        assert (trees > 0) if lattice else (trees == 0)


def test_a_sliding_window_target_never_verifies_the_lattice(tiny_models):
    target = tiny_models["gemma3"]
    prompts, expected = reference("gemma3", target)
    draft = tiny_draft(target).to(TEST_DEVICE)
    decoder = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft,
                                 speculate="always", proposer="draft", lattice=True)
    results = decoder.generate(prompts[:2], GenerationConfig(max_new_tokens=NEW_TOKENS, block_size=8))
    assert [r.tokens for r in results] == expected[:2]
    assert sum(r.stats.tree_cycles for r in results) == 0

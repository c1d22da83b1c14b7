"""Token trees: the draft's and lookup's proposals verified together in one target pass.

Packing and greedy acceptance as pure functions, the policy's tree pricing, and greedy decoding with
trees token for token Hugging Face generate() (fp32): batch 1 and 4, branches diverging at the
first token and later, either branch winning, rows with and without a tree in one pass, requests
joining a running batch, and generation staying exact for many cycles after trees (a losing branch's
keys left visible would change later tokens)."""
from __future__ import annotations

import random

import pytest
import torch

from conftest import TEST_DEVICE
from dflash2.decoding.policy.costs import CostModel
from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.decoding.policy.cycle import Choice, CyclePlan, Offer
from dflash2.decoding.policy import SpeculationPolicy
from dflash2.decoding.policy.expectation import tree_options
from dflash2.decoding.proposers.draft import Proposal
from dflash2.decoding.proposers.tree import kept_nodes, pack_tree, tree_greedy_accept, tree_nodes
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.targets.tiny import tiny_draft, tiny_target
from test_lookup import NEW_TOKENS, VOCAB, reference

from conftest import OracleDecoder, OracleProposer, policy_choice


# ---------------------------------------------------------------------- packing and acceptance
def test_branches_share_their_prefix_and_see_only_their_ancestors():
    tree = pack_tree([9], [[[5, 6, 7], [5, 8]]], 6, "cpu")
    assert tree.ids[0].tolist() == [9, 5, 6, 7, 8, 0]
    assert tree.depth[0].tolist() == [0, 1, 2, 3, 2, 0]
    visible = tree.visible[0].int().tolist()
    assert visible[4] == [1, 1, 0, 0, 1, 0]          # "8" sees the anchor, the shared "5" and itself
    assert visible[3] == [1, 1, 1, 1, 0, 0]          # "7" its own branch only
    assert visible[5] == [0, 0, 0, 0, 0, 1]          # padding sees itself
    assert tree.paths[0].tolist() == [[0, 1, 2, 3], [0, 1, 4, 4]] and tree.lengths[0].tolist() == [3, 2]
    assert tree_nodes([[5, 6, 7], [5, 8]]) == 4 and tree_nodes([[5, 6], [5, 6, 7]]) == 3


def test_branches_diverging_at_the_first_token():
    tree = pack_tree([9, 3], [[[5, 6], [7, 8]], [[4]]], 5, "cpu")
    assert tree.ids.tolist() == [[9, 5, 6, 7, 8], [3, 4, 0, 0, 0]]
    assert tree.depth[0].tolist() == [0, 1, 2, 1, 2]
    assert tree.visible[0, 4].int().tolist() == [1, 0, 0, 1, 1]
    assert tree.lengths.tolist() == [[2, 2], [1, 0]]


def test_greedy_acceptance_takes_the_branch_the_target_agrees_with_longest():
    tree = pack_tree([9, 9, 9], [[[5, 6, 7], [5, 8, 2]], [[5, 6, 7], [5, 8, 2]], [[4], [1]]], 6, "cpu")
    # the target's argmax after each node: row 0 follows "5 8 2", row 1 "5 6" then not 7, row 2 neither
    argmax = torch.tensor([[5, 8, 0, 0, 2, 3],
                           [5, 6, 1, 0, 0, 0],
                           [2, 0, 0, 0, 0, 0]])
    out = tree_greedy_accept(tree, argmax)
    assert out.per_branch.tolist() == [[1, 3], [2, 1], [0, 0]]
    assert out.branch.tolist() == [1, 0, 0] and out.accepted.tolist() == [3, 2, 0]
    assert out.bonus.tolist() == [3, 1, 2]
    kept = kept_nodes(tree, out.branch, out.accepted).int().tolist()
    assert kept == [[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]]


def test_a_tie_goes_to_the_first_branch():
    tree = pack_tree([9], [[[5, 6], [7, 8]]], 5, "cpu")
    out = tree_greedy_accept(tree, torch.tensor([[1, 0, 0, 0, 0]]))
    assert out.branch.tolist() == [0] and out.accepted.tolist() == [0] and out.bonus.tolist() == [1]


# ---------------------------------------------------------------------- the policy's price of a tree
def test_tree_options_count_the_shared_prefix_once_and_the_divergence_as_exclusive():
    draft, lookup = [0.9, 0.6, 0.5], [0.9, 0.6, 0.9, 0.9]
    options = tree_options(draft, lookup, shared=1)
    assert len(options) == 1 + 3 + 4 - 1
    expected, nodes, n_draft, n_lookup = options[-1]
    assert (nodes, n_draft, n_lookup) == (6, 3, 4)
    # shared 0.9, then 0.6 + 0.6 > 1: both scaled to 0.5 of the reach
    assert expected == pytest.approx(1 + 0.9 + 0.45 * (1 + 0.5) + 0.45 * (1 + 0.9 + 0.81))
    assert all(a[0] <= b[0] for a, b in zip(options, options[1:]))     # best of at most w nodes
    assert options[2] == (0.0, 0, 0, 0)                                # two nodes cannot hold a tree here
    assert tree_options([0.9, 0.9], [0.9], shared=1) == []             # lookup is a prefix of the draft


def _policy(per_token: float) -> SpeculationPolicy:
    costs = CostModel()
    for q in (1, 8, 32):
        costs.observe_verify(1, q, 0.01 + per_token * q)
    costs.observe_verify(2, 1, 0.01 + 2 * per_token)    # a plain step timed at each batch size used
    costs.observe_draft(1, 0.001)
    policy = SpeculationPolicy("auto", costs)
    for name in ("draft", "lookup"):           # both sources calibrated: right as often as they are confident
        policy.tables[name].counts[True] = [[10.0 * i + 5.0, 100.0] for i in range(10)]
    return policy


DRAFT = [0.45] + [0.95] * 6     # unsure of its first token, sure of the rest; lookup likewise,
LOOKUP = [0.55] + [0.95] * 6    # so whichever first token is right, a tree has the continuation


def test_the_policy_verifies_a_tree_when_extra_width_is_cheap_and_not_when_dear():
    offer = Offer.of([True], draft=[DRAFT], lookup=[LOOKUP], shared=[0])
    cheap = policy_choice(_policy(1e-5), 1, offer, 8)
    assert cheap.sources == ("tree",) and cheap.branches[0][0] > 0 and cheap.branches[0][1] > 0
    assert cheap.lengths[0] == sum(cheap.branches[0]) and cheap.k == cheap.lengths[0]
    dear = policy_choice(_policy(0.010), 1, offer, 8)
    assert dear.sources[0] in ("draft", "lookup") and not dear.branches
    agree = Offer.of([True], draft=[DRAFT], lookup=[LOOKUP], shared=[7])   # the same tokens: one path
    assert policy_choice(_policy(1e-5), 1, agree, 8).sources[0] != "tree"


def test_sampled_rows_are_never_offered_a_tree():
    offer = Offer.of([True, False], draft=[DRAFT] * 2, lookup=[LOOKUP] * 2, shared=[0, 0])
    assert offer.shared == [0, None]
    choice = policy_choice(_policy(1e-5), 2, offer, 8)
    assert choice.sources[0] == "tree" and choice.sources[1] != "tree"


# ---------------------------------------------------------------------- exactness
class TreePolicy(SpeculationPolicy):
    """Trees at their most varied: every row that may verify a tree does so with random branch
    lengths (a share `trees` of the time), the others verify a random source at a random length."""

    def __init__(self, seed: int = 0, trees: float = 1.0):
        super().__init__("always")
        self.random, self.trees = random.Random(seed), trees

    def prepare(self, b, offer, block, can_draft=True):
        return CyclePlan(can_draft and block > 1, chooser=lambda offer, seconds: self.choose(b, offer))

    def choose(self, b, offer):
        sources, lengths, branches = [], [], []
        for r in range(b):
            shared = offer.shared[r] if offer.shared is not None else None
            if shared is not None and offer.lookup[r] and self.random.random() < self.trees:
                n_draft = self.random.randint(1, len(offer.draft[r]))
                n_lookup = self.random.randint(1, len(offer.lookup[r]))
                sources.append("tree")
                lengths.append(n_draft + n_lookup - min(shared, n_draft, n_lookup))
                branches.append((n_draft, n_lookup))
                continue
            offered = [(name, len(c[r])) for name, c in offer.sources() if c[r]]
            name, n = self.random.choice(offered) if offered else ("", 0)
            n = self.random.randint(0, n)
            sources.append(name if n else "")
            lengths.append(n)
            branches.append((0, 0))
        tree = "tree" in sources
        return Choice(max(lengths), 0.0, 0.0, tuple(sources), tuple(lengths), tuple(branches) if tree else ())


class PartlyRightProposer(OracleProposer):
    """Proposes each row's reference continuation, wrong from a random position on (often the first):
    beside a lookup proposal, sometimes the draft's branch is the right one, sometimes lookup's.
    Rows join in the order their requests were queued on `queue`."""

    def __init__(self, queue, vocab_size, seed=0):
        super().__init__([], vocab_size)
        self.queue, self.random = queue, random.Random(seed)

    def add_rows(self, features, mask, following=None):
        self.sequences += [self.queue.pop(0) for _ in range(mask.shape[0])]

    def propose(self, anchors, start_positions, block_size, temperature, seeds):
        tokens = super().propose(anchors, start_positions, block_size, temperature, seeds).tokens
        for row in tokens:
            right = min(self.random.choice([0, 0, 1, 2, block_size]), len(row))
            row[right:] = (row[right:] + 1 + torch.arange(right, len(row))) % self.vocab_size
        return Proposal(tokens, None)


class TreeDecoder(OracleDecoder):
    """A partly right draft and real lookup proposals, verified as trees by `TreePolicy`. `queue`
    takes each request's prompt + reference output as it is added."""

    def __init__(self, target, prompts, outputs, block_size, trees=1.0, seed=0):
        super().__init__(target, prompts, outputs, block_size, proposer="hybrid")
        self.seed, self.queue = seed, []
        self.policy = TreePolicy(seed, trees)

    def new_oracle(self):
        return PartlyRightProposer(self.queue, self.target.vocab_size, self.seed)

    def add(self, session, prompt, config):
        self.queue.append(self.reference[tuple(prompt)])
        return session.add([prompt], config)


@pytest.fixture(scope="module")
def tiny_models():
    out = {}
    for family in ("llama", "qwen3", "gemma3"):
        target = tiny_target(family, vocab_size=VOCAB)
        out[family] = target.to(TEST_DEVICE)
    return out


def tree_wins(events) -> dict[str, int]:
    """Tree cycles by winning branch (counted when it accepted at least one token)."""
    wins = {"draft": 0, "lookup": 0}
    for event in events:
        if event.commit.tree_extra is not None and event.commit.accepted:
            wins[event.commit.source] += 1
    return wins


def decode(decoder, prompts, batch_size, block_size, max_new_tokens=NEW_TOKENS):
    outputs, events = [], []
    for i in range(0, len(prompts), batch_size):
        session, batch, keys = decoder.session(), {}, []
        for prompt in prompts[i:i + batch_size]:
            keys += decoder.add(session, prompt, GenerationConfig(max_new_tokens=max_new_tokens, block_size=block_size))
        while session:
            for event in session.step():
                batch.setdefault(event.key, []).extend(event.tokens)
                events.append(event)
        outputs += [batch[k] for k in keys]
    return outputs, events


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("trees", [1.0, 0.5])
def test_trees_match_target_greedy(tiny_models, family, batch_size, trees):
    """trees = 0.5: rows with and without a tree share the passes."""
    target = tiny_models[family]
    prompts, expected = reference(family, target)
    decoder = TreeDecoder(TargetAdapter(target), prompts, expected, 8, trees=trees)
    outputs, events = decode(decoder, prompts, batch_size, 8)
    assert outputs == expected
    wins = tree_wins(events)
    assert wins["draft"] > 0 and wins["lookup"] > 0, wins     # both branches won some trees
    assert sum(e.commit.tree_extra > 0 for e in events if e.commit.tree_extra is not None) > 0


def test_trees_keep_only_the_winning_branch_for_many_cycles(tiny_models):
    """Long generations with a tree every cycle: any key of a losing branch left visible to later
    tokens would change them."""
    target = tiny_models["llama"]
    prompts, _ = reference("llama", target)
    expected = []
    for p in prompts[:2]:
        ids = torch.tensor([p], device=target.device)
        gen = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=80, min_new_tokens=80,
                              do_sample=False, eos_token_id=None, pad_token_id=0)
        expected.append(gen[0, len(p):].tolist())
    decoder = TreeDecoder(TargetAdapter(target), prompts[:2], expected, 6, seed=1)
    outputs, events = decode(decoder, prompts[:2], 2, 6, max_new_tokens=80)
    assert outputs == expected
    assert sum(e.commit.tree_extra is not None for e in events) >= 20


def test_trees_with_requests_joining_a_running_batch(tiny_models):
    target = tiny_models["qwen3"]
    prompts, expected = reference("qwen3", target)
    decoder = TreeDecoder(TargetAdapter(target), prompts, expected, 8, trees=0.7, seed=2)
    session = decoder.session()
    order, outputs, events = {}, {}, []
    waiting, cycles = list(range(len(prompts))), 0
    while waiting or session:
        if waiting and cycles % 2 == 0:
            for i in waiting[:2]:
                [key] = decoder.add(session, prompts[i], GenerationConfig(max_new_tokens=NEW_TOKENS, block_size=8))
                order[key] = i
            waiting = waiting[2:]
        for event in session.step():
            outputs.setdefault(event.key, []).extend(event.tokens)
            events.append(event)
        cycles += 1
    assert all(outputs[key] == expected[i] for key, i in order.items())
    assert sum(tree_wins(events).values()) > 0


def test_hybrid_with_a_real_draft_verifies_trees_and_stays_exact(tiny_models):
    """The shipped decoder (`proposer="hybrid"`, `speculate="always"`, real tiny draft): the policy
    itself chooses trees where they are expected to commit more, and the output is exact."""
    from dflash2.decoding.loop.engine import SpeculativeDecoder

    target = tiny_models["llama"]
    prompts, expected = reference("llama", target)
    draft = tiny_draft(target).to(TEST_DEVICE)
    decoder = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft,
                                 speculate="always", proposer="hybrid")
    results = decoder.generate(prompts[:4], GenerationConfig(max_new_tokens=NEW_TOKENS, block_size=8))
    assert [r.tokens for r in results] == expected[:4]
    assert sum(r.stats.tree_cycles for r in results) > 0


def test_a_sliding_window_target_verifies_one_path_per_row(tiny_models):
    """Gemma 3's sliding-window layers count slots, so a losing branch cannot be holed out: the
    decoder offers no tree there, and the output stays exact."""
    target = tiny_models["gemma3"]
    prompts, expected = reference("gemma3", target)
    decoder = TreeDecoder(TargetAdapter(target), prompts[:4], expected[:4], 8)
    outputs, events = decode(decoder, prompts[:4], 4, 8)
    assert outputs == expected[:4]
    assert all(e.commit.tree_extra is None for e in events) and any(e.commit.accepted for e in events)

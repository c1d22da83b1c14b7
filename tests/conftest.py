"""Shared fixtures: tiny random targets/drafts, and oracle proposers for acceptance tests.

`DFLASH2_TEST_DEVICE` (default cpu) puts the tiny models of the lossless tests on another device,
e.g. `DFLASH2_TEST_DEVICE=cuda pytest tests/test_lossless_greedy.py tests/test_lossless_sampling.py`
(scripts/gpu_check.sh); CI runs them on the CPU.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import random

from dflash2.decoding.loop.engine import SpeculativeDecoder
from dflash2.decoding.policy.cycle import Choice, CyclePlan
from dflash2.decoding.policy import SpeculationPolicy
from dflash2.decoding.policy.chooser import choose
from dflash2.decoding.proposers.draft import Drafter, Proposal
from dflash2.targets.tiny import tiny_draft, tiny_target

TEST_DEVICE = torch.device(os.environ.get("DFLASH2_TEST_DEVICE", "cpu"))


class OracleProposer:
    """Proposes the reference continuation (or, with `wrong=True`, a token that is never it)."""

    def __init__(self, sequences: list[list[int]], vocab_size: int, wrong: bool = False):
        self.sequences = sequences  # prompt + reference output, one per batch row
        self.vocab_size = vocab_size
        self.wrong = wrong

    def add_rows(self, features, mask):
        pass

    def append(self, features, counts, first_position, defer=False):
        pass

    def select_rows(self, rows):
        self.sequences = [self.sequences[int(r)] for r in rows]

    def propose(self, anchors, start_positions, block_size, temperature, seeds):
        tokens = []
        for seq, start in zip(self.sequences, start_positions.tolist()):
            row = [seq[p] if p < len(seq) else 0 for p in range(start + 1, start + block_size)]
            tokens.append([(t + 1) % self.vocab_size for t in row] if self.wrong else row)
        return Proposal(torch.tensor(tokens, dtype=torch.long, device=anchors.device), None)


class OracleDecoder(SpeculativeDecoder):
    """Decodes with an oracle proposer (its `drafter`) that knows each prompt's reference continuation;
    `proposer="hybrid"`: beside lookup."""

    def __init__(self, target, prompts, outputs, block_size, wrong=False, speculate="always", proposer=None):
        super().__init__(target, None, speculate=speculate, proposer=proposer,
                         drafter=Drafter(block_size, lambda stopwatch: self.new_oracle()))
        self.reference = {tuple(p): p + o for p, o in zip(prompts, outputs)}
        self.wrong = wrong

    def generate(self, prompts, config):
        self.oracle = OracleProposer([self.reference[tuple(p)] for p in prompts], self.target.vocab_size, self.wrong)
        return super().generate(prompts, config)

    def new_oracle(self):
        return self.oracle


class RandomLengthPolicy(SpeculationPolicy):
    """Adaptive length taken to the extreme: each cycle verifies a random number of drafts
    (0..B-1), each row from a random one of the sources that offer it tokens, and one cycle in
    five runs no draft pass (a fallback)."""

    def __init__(self, seed: int = 0):
        super().__init__("auto")
        self.random = random.Random(seed)

    def prepare(self, b, offer, block, can_draft=True):
        draft = self.random.random() >= 0.2 and can_draft and block > 1
        return CyclePlan(draft, chooser=lambda offer, seconds: self.choose(b, offer, block))

    def choose(self, b, offer, block):
        k, sources, lengths = self.random.randrange(block), [], []
        for r in range(b):
            offered = [(name, len(c[r])) for name, c in offer.sources() if c[r]]
            name, n = self.random.choice(offered) if offered else ("", 0)
            sources.append(name if min(k, n) else "")
            lengths.append(min(k, n))
        return Choice(max(lengths, default=0), 0.0, 0.0, tuple(sources), tuple(lengths))


def policy_choice(policy: SpeculationPolicy, b: int, offer, block: int = 8, probe: bool = False,
                  draft_seconds: float | None = None) -> Choice:
    """What `policy`, as it stands, chooses for `offer` (`chooser.choose`: a pure function of its tables,
    costs and settings)."""
    return choose(policy.tables, policy.costs, policy.settings, b, block, probe, policy.lookup_probes, offer,
                  draft_seconds)


def with_speculation(decoder, mode: str):
    """The decoder with speculation mode `mode`: "always", "auto", "never" or "random"
    (`RandomLengthPolicy`)."""
    decoder.policy = RandomLengthPolicy() if mode == "random" else SpeculationPolicy(mode)
    return decoder


MODES = ("always", "auto", "random")


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: tiny models run fastest on one, and a busy machine cannot oversubscribe it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_models():
    """family -> (target, draft), built once per session."""
    out = {}
    for family in ("llama", "qwen3", "gemma3"):
        target = tiny_target(family)
        out[family] = (target.to(TEST_DEVICE), tiny_draft(target).to(TEST_DEVICE))
    return out


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Every cache dflash2 writes (`dflash2.files.cache.cache_dir()`: converted built-in targets, stored
    cost-model calibrations) lives, for the whole session, in one temporary directory: no test
    writes into the user's `~/.cache/dflash2` (or a `$DFLASH2_CACHE` the user set), and the
    subprocesses the tests start inherit it. A test that wants an empty cache points
    DFLASH2_CACHE elsewhere itself (monkeypatch)."""
    cache = tmp_path_factory.mktemp("dflash2-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DFLASH2_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="session")
def smollm2_cache(private_cache):
    """One real conversion of SmolLM2 (about 20 s on two cores) into the session's cache, shared by
    every test that loads "smollm2": (cache dir, converted target dir)."""
    from dflash2.targets import builtin as targets

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DFLASH2_CACHE", str(private_cache))     # even if a test changed it meanwhile
        resolved = targets.resolve_target("smollm2")
    return private_cache, Path(resolved)

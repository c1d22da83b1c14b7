"""Lookup proposals: the n-gram index and the shared suffix store, and greedy decoding with
`proposer="lookup"` / `"hybrid"` token for token the target's own (fp32, Hugging Face generate())."""
from __future__ import annotations

import pytest
import torch

from conftest import TEST_DEVICE, OracleDecoder, with_speculation
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.proposers.lookup import LookupProposer, Match, NgramIndex, SuffixStore, lookup_confidence
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.errors import DFlash2Error
from dflash2.targets.tiny import tiny_draft, tiny_target

NEW_TOKENS = 24
VOCAB = 16   # a tiny random target with a small vocabulary repeats itself, as text does: lookup has work


@pytest.fixture(scope="module")
def tiny_models():
    out = {}
    for family in ("llama", "qwen3", "gemma3"):
        target = tiny_target(family, vocab_size=VOCAB)
        out[family] = (target.to(TEST_DEVICE), tiny_draft(target).to(TEST_DEVICE))
    return out


# ---------------------------------------------------------------------- the index
def test_the_longest_recent_match_proposes_what_followed_it():
    index = NgramIndex(max_ngram=3)
    index.extend([1, 2, 3, 9, 2, 3, 7, 8, 1, 2, 3])
    found = index.match(limit=4)
    assert found.n == 3 and found.tokens == [9, 2, 3, 7]       # "1 2 3" -> 9 beats the more recent "2 3" -> 7
    index.extend([5])
    assert index.match(limit=4) is None                          # 5 never occurred before
    index.extend([7])
    assert index.match(limit=2).tokens == [8, 1] and index.match(limit=2).n == 1


def test_the_index_is_incremental():
    tokens = torch.randint(0, 6, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    whole, pieces = NgramIndex(), NgramIndex()
    whole.extend(tokens)
    for i in range(0, 300, 7):
        pieces.extend(tokens[i:i + 7])
    assert whole.table.entries == pieces.table.entries
    assert whole.match(limit=8) == pieces.match(limit=8)


def test_agreement_counts_repeated_continuations_and_raises_confidence():
    index = NgramIndex(max_ngram=2)
    index.extend([4, 5, 6, 4, 5, 6, 4, 5])
    found = index.match(limit=3)
    assert (found.n, found.seen, found.agree) == (2, 2, 2)
    index.extend([1, 4, 5, 2, 4, 5])                            # "4 5" was followed by 6, 6, 1, 2
    changed = index.match(limit=3)
    assert changed.agree == 1 and changed.seen == 4 and changed.tokens == [2, 4, 5]
    agreed, disagreed = lookup_confidence(found), lookup_confidence(changed)
    assert agreed[0] > disagreed[0]
    longer = lookup_confidence(Match([1, 2, 3], 4, 2, 2))
    assert longer[0] > agreed[0] and longer[1] < longer[2] < 1     # a copy in progress grows likelier
    assert all(0 < c < 1 for c in agreed + disagreed + longer)


def test_the_suffix_store_shares_text_across_requests_within_its_cap():
    store = SuffixStore(max_tokens=40, max_ngram=3)
    store.add(list(range(10, 30)))
    assert store.match([0, 14, 15], limit=3).tokens == [16, 17, 18]
    store.add(list(range(50, 70)))
    assert len(store) == 2 and store.tokens == 40
    store.add(list(range(80, 90)))                               # over the cap: the oldest request goes
    assert len(store) == 2 and store.tokens == 30
    assert store.match([14, 15], limit=3) is None
    assert all(entry[3] is not None and entry[3][0] != 10 for entry in store.table.entries.values())
    assert store.match([55], limit=2).tokens == [56, 57]
    proposer = LookupProposer(max_ngram=3, store=store)
    proposer.add_rows([[1, 2, 55], [3, 4, 3]])
    first, second = proposer.propose(4)
    assert first.tokens == [56, 57, 58, 59] and second.tokens == [4, 3]
    proposer.select_rows([1])                                    # the finished row's text joins the store
    assert store.match([1, 2], limit=1).tokens == [55]


# ---------------------------------------------------------------------- exactness
def repeating_prompts(vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    """Prompts made of a short random phrase said two or three times, with a random tail."""
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(count):
        phrase = torch.randint(3, vocab - 1, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
        tail = torch.randint(3, vocab - 1, (i % 3,), generator=g).tolist()
        prompts.append(phrase * (2 + i % 2) + tail)
    return prompts


def lookup_hits(prompt: list[int], output: list[int]) -> int:
    """Output tokens that a lookup of the text before them proposes as the next token."""
    index, hits = NgramIndex(), 0
    index.extend(prompt + output[:1])
    for token in output[1:]:
        found = index.match(limit=1)
        hits += found is not None and found.tokens[0] == token
        index.extend([token])
    return hits


_REFERENCE: dict = {}


def reference(family, target, count: int = 8):
    """Hugging Face greedy generate() on the `count` of 40 repeating prompts whose outputs a lookup
    can follow best (a random tiny target copies its context only now and then)."""
    if family not in _REFERENCE:
        candidates = []
        for p in repeating_prompts(target.config.vocab_size, 40):
            ids = torch.tensor([p], device=target.device)
            gen = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                  min_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
            candidates.append((p, gen[0, len(p):].tolist()))
        candidates.sort(key=lambda pair: -lookup_hits(*pair))
        _REFERENCE[family] = tuple(map(list, zip(*candidates[:count])))
    return _REFERENCE[family]


def decoder_for(models, family, proposer, mode, store=None):
    target, draft = models[family]
    adapter = TargetAdapter(target, None if proposer == "lookup" else draft.config.target_layer_ids)
    decoder = SpeculativeDecoder(adapter, None if proposer == "lookup" else draft, proposer=proposer,
                                 suffix_store=store)
    return with_speculation(decoder, mode)


def accepted_from(results, source):
    return sum(r.stats.accepted_by_source.get(source, 0) for r in results)


@pytest.mark.parametrize("mode", ["always", "auto", "random"])
@pytest.mark.parametrize("proposer", ["lookup", "hybrid"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("block_size", [2, 4, 8])
def test_lookup_matches_target_greedy(tiny_models, family, batch_size, block_size, proposer, mode):
    target, _ = tiny_models[family]
    prompts, expected = reference(family, target)
    decoder = decoder_for(tiny_models, family, proposer, mode)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, block_size=block_size)
    results = []
    for i in range(0, len(prompts), batch_size):
        results += decoder.generate(prompts[i:i + batch_size], config)
    assert [r.tokens for r in results] == expected
    if mode != "auto":      # auto may rightly decode plainly: on tiny models its cost figures are timing noise
        assert accepted_from(results, "lookup") > 0             # the lookup path really ran and was accepted
    if proposer == "lookup":
        assert accepted_from(results, "draft") == 0 and results[0].timing.draft_passes == 0


@pytest.mark.parametrize("proposer", ["lookup", "hybrid"])
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_lookup_with_requests_joining_a_running_batch_and_a_shared_store(tiny_models, family, proposer):
    """Continuous batching with a suffix store shared across the requests: finished requests' text
    is proposed to the later ones (the same prompts come twice), and every output is exact."""
    target, _ = tiny_models[family]
    prompts, expected = reference(family, target)
    store = SuffixStore(max_tokens=4096)
    decoder = decoder_for(tiny_models, family, proposer, "auto", store)
    session = decoder.session()
    order, outputs, stats = {}, {}, {}
    waiting = [i % len(prompts) for i in range(2 * len(prompts))]
    cycles = 0
    while waiting or session:
        if waiting and cycles % 3 == 0:
            for i in waiting[:2]:
                [key] = session.add([prompts[i]], GenerationConfig(max_new_tokens=NEW_TOKENS, block_size=8))
                order[key] = i
            waiting = waiting[2:]
        for event in session.step():
            outputs.setdefault(event.key, []).extend(event.tokens)
            if event.result is not None:
                stats[event.key] = event.result.stats
        cycles += 1
    assert all(outputs[key] == expected[i] for key, i in order.items())
    assert len(store) == 2 * len(prompts)
    later = [s for key, s in stats.items() if key >= len(prompts)]
    assert sum(s.accepted_by_source.get("lookup", 0) for s in later) > 0


@pytest.mark.parametrize("proposer", ["lookup", "hybrid"])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_lookup_stops_mid_block(tiny_models, proposer, batch_size):
    target, _ = tiny_models["llama"]
    prompts, expected = reference("llama", target)
    stop = expected[0][6]
    want = [e[: e.index(stop) + 1] if stop in e else e for e in expected]
    assert any(len(w) < NEW_TOKENS for w in want)
    decoder = decoder_for(tiny_models, "llama", proposer, "always")
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, stop_token_ids=(stop,), block_size=8)
    results = []
    for i in range(0, len(prompts), batch_size):
        results += decoder.generate(prompts[i:i + batch_size], config)
    assert [r.tokens for r in results] == want
    assert [r.finish_reason for r in results] == ["stop" if stop in e else "length" for e in expected]


def test_hybrid_rows_use_both_sources(tiny_models):
    """With an oracle draft and repeating text, some rows verify lookup tokens and others the draft's
    in the same passes; the output is exact and each source's accepted tokens are counted."""
    target, _ = tiny_models["llama"]
    prompts, expected = reference("llama", target)

    class HybridOracle(OracleDecoder):
        def new_lookup(self):
            return LookupProposer()

    decoder = HybridOracle(TargetAdapter(target), prompts, expected, 8, speculate="auto")
    decoder.proposer = "hybrid"
    with_speculation(decoder, "random")
    results = decoder.generate(prompts, GenerationConfig(max_new_tokens=NEW_TOKENS))
    assert [r.tokens for r in results] == expected
    assert accepted_from(results, "lookup") > 0 and accepted_from(results, "draft") > 0


def test_proposer_needs_what_it_names(tiny_models):
    target, _ = tiny_models["llama"]
    with pytest.raises(DFlash2Error, match="needs a draft"):
        SpeculativeDecoder(TargetAdapter(target), proposer="hybrid")
    with pytest.raises(DFlash2Error, match="proposer must be one of"):
        SpeculativeDecoder(TargetAdapter(target), proposer="ngram")
    assert SpeculativeDecoder(TargetAdapter(target)).speculate == "never"      # no proposer: the baseline
    lookup = SpeculativeDecoder(TargetAdapter(target), proposer="lookup", speculate="never")
    assert lookup.block_size(GenerationConfig()) == 1 and lookup.session().lookup is None


@pytest.mark.parametrize("options,message", [
    (dict(no_draft=True, proposer="hybrid"), "--proposer hybrid needs a draft"),
    (dict(draft="some/dir", proposer="lookup"), "--proposer lookup uses no draft"),
    (dict(proposer="ngram"), "--proposer must be one of"),
])
def test_proposer_options_are_checked_before_anything_loads(options, message):
    from dflash2.pipeline import prepare_decoder

    with pytest.raises(DFlash2Error, match=message):
        prepare_decoder("no-such-target", **options)     # the target is never opened


def test_generate_runs_a_fixed_batch_and_a_session_an_open_one(tiny_models):
    """`generate` tells the policy each row's room (the time until the last row ends is what counts);
    a session that may take requests later does not, and refuses none of them."""
    decoder = decoder_for(tiny_models, "llama", "lookup", "auto")
    seen = []
    prepare = decoder.policy.prepare
    decoder.policy.prepare = lambda b, offer, *args, **kw: seen.append(offer.remaining) or prepare(b, offer, *args, **kw)
    prompts = [[1, 2, 3, 1, 2], [4, 5, 4, 5]]
    decoder.generate(prompts, GenerationConfig(max_new_tokens=6))
    assert seen[0] == [5, 5] and all(r is not None for r in seen)      # the prefill's token is committed
    seen.clear()
    session = decoder.session()
    session.add(prompts, GenerationConfig(max_new_tokens=6))
    session.step()
    session.add(prompts[:1], GenerationConfig(max_new_tokens=6))
    while session:
        session.step()
    assert seen and all(r is None for r in seen)
    fixed = decoder.session(fixed=True)
    fixed.add(prompts, GenerationConfig(max_new_tokens=6))
    fixed.step()
    with pytest.raises(DFlash2Error, match="fixed batch"):
        fixed.add(prompts[:1], GenerationConfig(max_new_tokens=6))

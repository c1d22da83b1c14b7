"""Training data: shard directories -> (input_ids, loss_mask) pairs, step order, feature cache."""
from __future__ import annotations

import numpy as np
import torch

from training_util import synthetic_sequences
from dflash2.data.shards import Record, ShardWriter
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.targets.tiny import tiny_target
from dflash2.training.batches import Example, build_batch
from dflash2.training.dataset import SequenceOrder, load_sequences
from dflash2.training.features import FeatureSource


def test_load_sequences_from_shards(tmp_path):
    with ShardWriter(tmp_path / "d", {"target": "tiny"}, shard_size=2) as writer:
        writer.add(Record("a", np.arange(3, 8), np.arange(10, 20)))
        writer.add(Record("b", np.arange(3, 5), np.arange(30, 31)))      # 1 response token: dropped
        writer.add(Record("c", np.arange(3, 6), np.arange(40, 60)))
    pairs, counts = load_sequences([tmp_path / "d"], max_seq_len=12)
    assert counts["records"] == 3 and counts["dropped"] == 1 and counts["truncated"] == 2
    ids, mask = pairs[0]
    assert ids.tolist() == list(range(3, 8)) + list(range(10, 17))
    assert mask.tolist() == [False] * 5 + [True] * 7


def test_step_order_is_a_function_of_seed_and_step():
    seqs = synthetic_sequences(10)
    order = SequenceOrder(seqs, global_batch=4, seed=3)
    assert order.steps_per_epoch == 2
    first = [order.step_indices(s)[1] for s in range(4)]
    again = SequenceOrder(seqs, 4, 3)
    assert [again.step_indices(s)[1] for s in (3, 0, 2, 1)] == [first[3], first[0], first[2], first[1]]
    assert len(set(first[0]) | set(first[1])) == 8                          # no repeats within an epoch
    halves = order.shard(1, 0, 2, 1)[0] + order.shard(1, 1, 2, 1)[0]
    assert [e.index for e in halves] == first[1]


def test_feature_cache_matches_online_features(tmp_path):
    target = tiny_target("gemma3")
    adapter = TargetAdapter(target, [1, 3])
    seqs = synthetic_sequences(3)
    examples = [Example(ids, m, key=(0, i), index=i) for i, (ids, m) in enumerate(seqs)]
    batch = build_batch(examples, block_size=4, num_anchors=4, mask_token_id=127, window=None, seed=0)
    online = FeatureSource(adapter)(batch).features
    cached = FeatureSource(adapter, tmp_path, "tag")
    first, second = cached(batch).features, cached(batch).features
    assert cached.misses == 3 and cached.hits == 3
    real = batch.attention_mask.bool()
    torch.testing.assert_close(first[real], online[real], atol=1e-5, rtol=1e-5)
    assert torch.equal(first[real], second[real])
    _, padded = adapter.features(batch.input_ids, batch.attention_mask)    # one right-padded batch pass
    torch.testing.assert_close(online[real], padded[real], atol=1e-5, rtol=1e-5)
    adapter.close()


def test_cached_target_predictions_match_the_target(tmp_path):
    """With top_k, the source also returns the target's own top-k next-token logits per position,
    cached like the features and keyed by the tokens: a reordered dataset still hits its entries."""
    target = tiny_target("llama")
    adapter = TargetAdapter(target, [1, 3])
    seqs = synthetic_sequences(3)
    examples = [Example(ids, m, key=(0, i), index=i) for i, (ids, m) in enumerate(seqs)]
    batch = build_batch(examples, block_size=4, num_anchors=4, mask_token_id=127, window=None, seed=0)
    source = FeatureSource(adapter, tmp_path, "tag-k", top_k=5)
    signals = source(batch)
    for r, (ids, _) in enumerate(seqs):
        with torch.no_grad():
            logits = target(input_ids=torch.as_tensor(ids)[None].long()).logits[0].float()
        top = logits.topk(5, dim=-1)
        n = len(ids)
        torch.testing.assert_close(signals.top_logits[r, :n], top.values, atol=1e-4, rtol=1e-4)
        assert torch.equal(signals.top_ids[r, :n], top.indices)
    shuffled = [Example(e.input_ids, e.loss_mask, key=e.key, index=10 + i) for i, e in enumerate(reversed(examples))]
    again = source(build_batch(shuffled, block_size=4, num_anchors=4, mask_token_id=127, window=None, seed=0))
    assert source.hits == 3 and source.misses == 3
    assert torch.equal(again.top_ids[0, :len(seqs[2][0])], signals.top_ids[2, :len(seqs[2][0])])
    adapter.close()

"""Training batches: block-sparse mask vs a brute-force reference, anchors, labels, and packed
training blocks vs the inference proposer's single block."""
from __future__ import annotations

import pytest
import torch


from dflash2.decoding.proposers.draft import DraftProposer
from dflash2.targets.tiny import tiny_draft, tiny_target
from dflash2.model.mask import block_visibility
from dflash2.training.batches import Example, anchor_generator, build_batch, sample_anchors


def brute_force_mask(anchors, valid, block, length, window):
    b, n = anchors.shape
    q = n * block
    mask = torch.zeros(b, 1, q, length + q, dtype=torch.bool)
    for row in range(b):
        for i in range(q):
            blk, off = divmod(i, block)
            anchor = int(anchors[row, blk])
            pos = anchor + off
            for key in range(length + q):
                if key < length:  # context position `key`
                    visible = key < anchor and (window is None or pos - key < window)
                else:             # block token
                    visible = (key - length) // block == blk
                mask[row, 0, i, key] = visible
    return mask


@pytest.mark.parametrize("window", [None, 5, 64])
def test_block_mask_matches_brute_force(window):
    g = torch.Generator().manual_seed(1)
    block, length = 4, 23
    anchors = torch.randint(0, length - block + 1, (2, 5), generator=g)
    valid = torch.ones_like(anchors, dtype=torch.bool)
    positions = anchors[:, :, None] + torch.arange(block)                     # [b, N, B]
    got = block_visibility(positions, torch.arange(length), window)
    assert torch.equal(got, brute_force_mask(anchors, valid, block, length, window))
    batch = build_batch([Example(torch.arange(length), torch.ones(length, dtype=torch.bool))], block_size=block,
                        num_anchors=5, mask_token_id=0, window=window, seed=0)
    assert torch.equal(batch.attn_mask, brute_force_mask(batch.anchors, None, block, length, window))


def test_anchor_sampling_rules_and_determinism():
    mask = torch.zeros(40, dtype=torch.bool)
    mask[10:30] = True
    mask[33:] = True
    block = 8
    few = sample_anchors(mask, block, 1000, anchor_generator(0, (0, 0)))
    expected = [a for a in range(40 - block + 1) if mask[a] and mask[a + 1]]
    assert few.tolist() == expected                          # all candidates when there is room
    some = sample_anchors(mask, block, 5, anchor_generator(0, (0, 7)))
    assert some.numel() == 5 and len(set(some.tolist())) == 5 and set(some.tolist()) <= set(expected)
    assert torch.equal(some, sample_anchors(mask, block, 5, anchor_generator(0, (0, 7))))
    assert not torch.equal(some, sample_anchors(mask, block, 5, anchor_generator(0, (1, 7))))
    assert sample_anchors(mask[:5], block, 5, anchor_generator(0, (0, 0))).numel() == 0


def test_build_batch_inputs_and_labels():
    g = torch.Generator().manual_seed(0)
    examples = []
    for i, length in enumerate((30, 18)):
        ids = torch.randint(3, 100, (length,), generator=g)
        mask = torch.zeros(length, dtype=torch.bool)
        mask[4:] = True
        examples.append(Example(ids, mask, key=(0, i), index=i))
    batch = build_batch(examples, block_size=4, num_anchors=6, mask_token_id=127, window=None, seed=3)
    for row, example in enumerate(examples):
        for j in range(batch.anchors.shape[1]):
            if not batch.block_valid[row, j]:
                assert not batch.label_mask[row, j].any()
                continue
            a = int(batch.anchors[row, j])
            assert batch.block_ids[row, j, 0] == example.input_ids[a]
            assert (batch.block_ids[row, j, 1:] == 127).all()
            assert batch.block_positions[row, j].tolist() == list(range(a, a + 4))
            assert batch.labels[row, j].tolist() == example.input_ids[a + 1:a + 4].tolist()
            assert batch.label_mask[row, j].tolist() == example.loss_mask[a + 1:a + 4].tolist()
    assert batch.attn_mask.shape == (2, 1, batch.anchors.shape[1] * 4, 30 + batch.anchors.shape[1] * 4)


@pytest.mark.parametrize("use_conv", [True, False])
def test_packed_blocks_equal_single_inference_blocks(use_conv):
    """Every packed training block computes what the decoding-time proposer computes for it."""
    target = tiny_target("qwen3")
    draft = tiny_draft(target, block_size=4, use_conv=use_conv)
    draft.bind_target(target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    draft.config.sliding_window = 9  # exercise the window
    length = 26
    ids = torch.randint(3, 120, (length,), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(length, dtype=torch.bool)
    batch = build_batch([Example(ids, mask)], block_size=4, num_anchors=5, mask_token_id=127, window=9, seed=0)
    features = torch.randn(1, length, draft.fc.in_features, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        context = draft.context_kv(features, batch.positions)
        packed = draft.forward_blocks(batch.block_ids, batch.block_positions, context, batch.attn_mask)
        for j, anchor in enumerate(batch.anchors[0].tolist()):
            proposer = DraftProposer(draft)
            proposer.add_rows(features[:, :anchor], torch.ones(1, anchor, dtype=torch.long))
            positions = batch.block_positions[:, j:j + 1]
            visible = block_visibility(positions, proposer.positions, draft.config.sliding_window, proposer.valid)
            single = draft.forward_blocks(batch.block_ids[:, j:j + 1], positions, proposer.kv, visible)
            torch.testing.assert_close(packed[:, j], single[:, 0], atol=1e-5, rtol=1e-5)

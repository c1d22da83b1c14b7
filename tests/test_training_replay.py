"""On-policy replay of rejected blocks (`loss.replay_*`, training/replay.py): off leaves the batches as
they were, the blocks a step rejects come back in the next step at their recorded anchors, the
buffer's rules (threshold, priority, capacity, replays), the acceptance metrics of fresh blocks only,
and one `error:` line per bad setting. Resume with replay: tests/test_training_resume.py."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from dflash2.cli import main as cli_main
from dflash2.targets.tiny import tiny_target
from dflash2.training.batches import Example, build_batch
from dflash2.training.losses import BlockOutcome
from dflash2.training.replay import ReplayBuffer, ReplaySettings, fresh_anchors, replay_anchors
from dflash2.training.trainer import Trainer, _teacher
from training_util import small_config, synthetic_sequences

# A top-64 candidate list over the tiny target's 128 tokens: near misses are common from the first step.
REPLAY = {"draft": {"num_layers": 2, "selector_rank": 8, "selector_top_k": 64, "conv_group_size": 16},
          "loss": {"num_anchors": 4, "logits_chunk": 16, "replay_fraction": 0.5}}


def _trainer(tmp_path, **sections):
    cfg = small_config(tmp_path, **sections)
    return Trainer(cfg, target_model=tiny_target("llama"), train_sequences=synthetic_sequences(12))


def _same_batch(a, b):
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        assert (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y), field.name


def test_replay_off_keeps_the_uniform_batches(tmp_path):
    trainer = _trainer(tmp_path, train={"grad_accum": 2})
    c = trainer.draft.config
    for step in range(3):
        trainer.step = step
        got = trainer.step_batches()
        for batch, examples in zip(got, trainer.order.shard(step, 0, 1, 2), strict=True):
            expected = build_batch(examples, block_size=c.block_size, num_anchors=4, mask_token_id=c.mask_token_id,
                                   window=c.sliding_window, seed=0)
            assert batch.replayed is None
            _same_batch(batch, expected)
    assert trainer.replay is None
    trainer.close()


def _forward_outcomes(trainer, batches):
    """(record, anchor) -> tokens right, for every block the replay rule rejects, under the current weights."""
    rejected = {}
    s = trainer.replay.settings
    for batch in batches:
        batch = batch.to(trainer.dist.device)
        with torch.no_grad():
            signals = trainer.features(batch)
            _, _, outcome = trainer.module(signals.features, batch, 1.0, _teacher(signals, batch))
        for row, col in torch.nonzero(outcome.near_miss & (outcome.accepted <= s.max_accepted)).tolist():
            rejected[(batch.indices[row], int(batch.anchors[row, col]))] = int(outcome.accepted[row, col])
    return rejected


def test_rejected_blocks_come_back_next_step_at_their_anchors(tmp_path):
    trainer = _trainer(tmp_path, **REPLAY)
    first = trainer.step_batches()
    assert all(b.replayed is None for b in first)               # an empty buffer adds no rows
    assert all(int(b.block_valid[r].sum()) == fresh_anchors(4, 0.5) for b in first for r in range(b.anchors.shape[0]))
    expected = _forward_outcomes(trainer, first)
    assert expected, "the setup must reject some blocks"
    trainer.train_step()
    assert {k: e.accepted for k, e in trainer.replay.entries.items()} == expected
    assert all(e.step == 0 and e.replays == 0 for e in trainer.replay.entries.values())

    held = dict(trainer.replay.entries)
    block = trainer.draft.config.block_size
    second = trainer.step_batches()
    budget = replay_anchors(4, 0.5) * len(trainer.order.shard(1, 0, 1, 1)[0])
    replayed = set()
    *uniform, last = second
    assert [b.indices for b in uniform] == [[e.index for e in m] for m in trainer.order.shard(1, 0, 1, 1)]
    assert all(b.replayed is None for b in uniform)
    assert torch.equal(last.replayed, last.block_valid)         # the replay rows: a micro-batch of their own
    for batch in [last]:
        for row in range(batch.anchors.shape[0]):
            index = batch.indices[row]
            ids, mask = trainer.train_sequences[index]
            for anchor in batch.anchors[row][batch.block_valid[row]].tolist():
                replayed.add((index, anchor))
                col = batch.anchors[row].tolist().index(anchor)
                assert batch.block_ids[row, col, 0] == ids[anchor]
                assert batch.block_positions[row, col].tolist() == list(range(anchor, anchor + block))
                assert batch.labels[row, col].tolist() == ids[anchor + 1:anchor + block].tolist()
                assert batch.label_mask[row, col].tolist() == mask[anchor + 1:anchor + block].tolist()
    assert replayed and replayed <= set(held) and len(replayed) == min(budget, len(held))
    best = sorted(held, key=lambda k: (held[k].accepted, -held[k].step, k))
    first_record = best[0][0]
    assert {k for k in held if k[0] == first_record} <= replayed   # the best record rides whole
    assert set(trainer.replay.entries) == set(held) - replayed     # taken blocks left the buffer
    assert trainer.replay.in_flight == {k: 1 for k in replayed}

    assert last.num_fresh_tokens == 0 and uniform[0].num_fresh_tokens == uniform[0].num_tokens
    trainer.close()


def test_acceptance_statistics_count_the_fresh_blocks_only(tmp_path):
    trainer = _trainer(tmp_path, **REPLAY)
    (batch,) = trainer.step_batches()
    half = torch.zeros_like(batch.block_valid)
    half[::2] = True                                               # mark every other row as replayed
    mixed = dataclasses.replace(batch, replayed=batch.block_valid & half)
    with torch.no_grad():
        signals = trainer.features(batch)
        _, stats, outcome = trainer.module(signals.features, mixed, 1.0, _teacher(signals, batch))
        fresh_only = dataclasses.replace(batch, block_valid=batch.block_valid & ~half,
                                         label_mask=batch.label_mask & ~half[:, :, None])
        _, reference, _ = trainer.module(signals.features, fresh_only, 1.0, _teacher(signals, batch))
        _, unmarked, same = trainer.module(signals.features, batch, 1.0, _teacher(signals, batch))
    for name in ("blocks", "tau", "tau_base", "count", "top1", "topk", "selector_ok"):
        assert torch.equal(getattr(stats, name), getattr(reference, name)), name
    assert float(reference.blocks) < float(unmarked.blocks)
    assert float(stats.weight) == float(unmarked.weight) > float(reference.weight)   # the loss covers every block
    assert torch.equal(outcome.accepted, same.accepted) and torch.equal(outcome.near_miss, same.near_miss)
    # The outcome is the count the logged tau is built from: tau = sum over blocks of 1 + accepted.
    assert float(unmarked.tau) == float(((1 + same.accepted) * batch.block_valid).sum())
    trainer.close()


def _toy_batch(anchors_per_row):
    rows = [Example(torch.arange(3, 23), torch.ones(20, dtype=torch.bool), index=i, anchors=torch.tensor(a))
            for i, a in enumerate(anchors_per_row)]
    return build_batch(rows, block_size=4, num_anchors=4, mask_token_id=127, window=None, seed=0)


def test_buffer_threshold_priority_capacity_and_replays():
    settings = ReplaySettings(fraction=0.5, capacity=3, max_accepted=1, max_times=2, num_anchors=4)
    buffer = ReplayBuffer(settings)
    batch = dataclasses.replace(_toy_batch([[2, 5, 9], [1, 4, 8]]), replayed=None)
    accepted = torch.tensor([[0, 1, 2], [1, 0, 0]])
    near = torch.tensor([[True, True, True], [True, True, False]])
    buffer.observe(batch, BlockOutcome(accepted, near), step=0)
    # Rejected: (0, 2), (0, 5), (1, 1), (1, 4); not (0, 9), 2 right (above the threshold), nor (1, 8),
    # no near miss. Capacity 3: of the two with 1 right, the larger key, (1, 1), leaves.
    assert set(buffer.entries) == {(0, 2), (1, 4), (0, 5)}
    assert buffer.entries[(0, 2)].accepted == 0 and buffer.entries[(0, 5)].accepted == 1
    # A newer rejection of the same quality outranks an older one.
    later = dataclasses.replace(_toy_batch([[6]]), indices=[7], replayed=None)
    buffer.observe(later, BlockOutcome(torch.tensor([[1]]), torch.tensor([[True]])), step=1)
    assert set(buffer.entries) == {(0, 2), (1, 4), (7, 6)}

    sequences = {i: (torch.arange(3, 23), torch.ones(20, dtype=torch.bool)) for i in (0, 1, 7)}
    micro = [[Example(torch.arange(3, 23), torch.ones(20, dtype=torch.bool), index=5)]]
    uniform, replay = buffer.extend(micro, sequences)    # budget: 1 row x 2 anchors
    assert uniform == micro[0]
    assert [(r.index, r.anchors.tolist()) for r in replay] == [(0, [2]), (1, [4])]
    rows = uniform + replay
    assert set(buffer.entries) == {(7, 6)} and buffer.in_flight == {(0, 2): 1, (1, 4): 1}

    # Trained on again: still rejected -> back (replayed once < max_times 2); no longer rejected -> gone.
    batch = build_batch(rows, block_size=4, num_anchors=2, mask_token_id=127, window=None, seed=0)
    outcome = BlockOutcome(torch.zeros_like(batch.anchors), batch.block_valid & torch.tensor([[False], [True], [False]]))
    buffer.observe(batch, outcome, step=2)
    assert set(buffer.entries) == {(7, 6), (0, 2)} and buffer.entries[(0, 2)].replays == 1
    assert buffer.in_flight == {}
    uniform, replay = buffer.extend(micro, sequences)
    rows = uniform + replay
    batch = build_batch(rows, block_size=4, num_anchors=2, mask_token_id=127, window=None, seed=0)
    buffer.observe(batch, BlockOutcome(torch.zeros_like(batch.anchors), batch.block_valid.clone()), step=3)
    assert (0, 2) not in buffer.entries                  # replayed twice: max_times reached
    assert (5, int(batch.anchors[0, 0])) in buffer.entries  # the fresh row's rejected block entered

    restored = ReplayBuffer(settings)
    restored.load_state_dict(buffer.state_dict())
    assert restored.entries == buffer.entries
    metrics = buffer.interval_metrics()
    assert metrics["replay_buffer"] == len(buffer) and metrics["replay_rows"] == 4 and metrics["replay_blocks"] == 4
    assert metrics["replay_tokens"] == 4 * 20
    assert buffer.interval_metrics()["replay_blocks"] == 0


@pytest.mark.parametrize("override, key", [
    ("loss.replay_fraction=1.0", "loss.replay_fraction"),
    ("loss.replay_fraction=-0.1", "loss.replay_fraction"),
    ("loss.replay_fraction=0.001", "loss.replay_fraction"),       # rounds to no replayed anchor
    ("loss.replay_capacity=0", "loss.replay_capacity"),
    ("loss.replay_max_accepted=-1", "loss.replay_max_accepted"),
    ("loss.replay_max_accepted=7", "loss.replay_max_accepted"),   # a block of 8 drafts 7 tokens
    ("loss.replay_max_times=0", "loss.replay_max_times"),
    ("loss.replay_max_times=1.5", "loss.replay_max_times"),
])
def test_a_bad_replay_setting_is_one_error_line(tmp_path, capsys, override, key):
    config = tmp_path / "c.yaml"
    config.write_text("loss:\n  replay_fraction: 0.25\n")
    assert cli_main(["train", str(config), override, f"train.output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and key in err, err
    assert not (tmp_path / "run").exists()


def test_replay_under_several_ranks_is_one_error_line_before_the_target_loads(tmp_path, capsys, monkeypatch):
    from matrix_util import write_shards

    data = tmp_path / "data"
    write_shards(data)
    config = tmp_path / "c.yaml"
    config.write_text("loss:\n  replay_fraction: 0.25\n")
    monkeypatch.setenv("WORLD_SIZE", "2")

    def no_target(*args, **kwargs):
        raise AssertionError("the target must not load")

    monkeypatch.setattr("dflash2.training.trainer.Trainer", no_target)
    assert cli_main(["train", str(config), f"data.train=[{data}]", f"train.output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "loss.replay_fraction" in err and "2 ranks" in err

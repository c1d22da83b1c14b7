"""A reduced-vocabulary run resumed after its data grew keeps its checkpoint's vocabulary *and* the
LM-head rows of that vocabulary. The new data ranks other tokens first, so the resumed trainer
builds a draft with another vocabulary before the checkpoint's `d2t` / `t2d` are loaded over it;
the head rows are derived (not saved) and must follow the loaded vocabulary, or every logit of
the resumed run scores the wrong token (its loss jumped from 3.7 to 11.8 on SmolLM2)."""
from __future__ import annotations

import torch

from dflash2.targets.tiny import tiny_target
from dflash2.training.trainer import Trainer
from tests.training_util import small_config, synthetic_sequences


def _rows_follow_the_vocabulary(draft) -> bool:
    return torch.equal(draft.head_weight, draft.lm_head_weight[draft.draft_token_ids()])


def test_a_resumed_run_scores_the_checkpoints_vocabulary(tmp_path):
    target = tiny_target("llama")
    vocab = target.config.vocab_size
    first_data = synthetic_sequences(16, vocab=vocab, seed=0)
    cfg = small_config(tmp_path / "run", draft={"draft_vocab_size": 24}, train={"steps": 4, "checkpoint_every": 2})
    first = Trainer(cfg, target_model=target, train_sequences=first_data)
    first.train(stop_at=2)
    trained_ids = first.draft.draft_token_ids().clone()
    logits_before = first.draft.logits(torch.ones(1, target.config.hidden_size)).detach()
    first.close()

    hidden = set(trained_ids.tolist())                      # the data grows with tokens it never ranked first
    others = torch.tensor([t for t in range(3, vocab - 2) if t not in hidden][:24])
    grown = first_data + [(others.repeat(3), torch.ones(72, dtype=torch.bool)) for _ in range(8)]
    resumed = Trainer(cfg, target_model=target, train_sequences=grown)
    assert not torch.equal(resumed.draft.draft_token_ids(), trained_ids)   # built on the grown data's ranking
    resumed.resume()
    assert torch.equal(resumed.draft.draft_token_ids(), trained_ids)       # the checkpoint's vocabulary
    assert _rows_follow_the_vocabulary(resumed.draft)
    logits_after = resumed.draft.logits(torch.ones(1, target.config.hidden_size)).detach()
    torch.testing.assert_close(logits_after, logits_before)
    resumed.close()

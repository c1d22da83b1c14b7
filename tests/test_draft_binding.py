"""The borrowed embedding and LM head: registered buffers that move with the draft, share the target's
storage where dtype and device allow, stay tied for tied targets, and are never saved."""
from __future__ import annotations

import torch
from safetensors.torch import load_file, save_file

from dflash2.model.draft import DFlash2DraftModel
from dflash2.targets.tiny import tiny_draft, tiny_target


def _bound(family: str, dtype: torch.dtype = torch.float32):
    target = tiny_target(family)
    draft = tiny_draft(target).to(dtype)
    draft.bind_target(target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    return target, draft


def test_same_dtype_shares_the_targets_storage_and_is_never_saved(tmp_path):
    target, draft = _bound("qwen3")                                     # untied embedding and head
    assert draft.embed_weight.data_ptr() == target.get_input_embeddings().weight.data_ptr()
    assert draft.lm_head_weight.data_ptr() == target.get_output_embeddings().weight.data_ptr()
    assert not draft.embed_weight.requires_grad
    names = set(draft.state_dict())
    assert not any(n.startswith(("embed", "lm_head")) for n in names)
    assert {"embed_weight", "lm_head_weight"} <= {n for n, _ in draft.named_buffers()}
    draft.save_pretrained(tmp_path / "d")
    assert set(load_file(str(tmp_path / "d" / "model.safetensors"))) == names


def test_moving_the_draft_moves_them_and_shares_again_when_back_in_the_targets_dtype():
    target, draft = _bound("qwen3")
    head = target.get_output_embeddings().weight
    draft.to(torch.bfloat16)
    assert draft.embed_weight.dtype == draft.lm_head_weight.dtype == torch.bfloat16
    assert draft.lm_head_weight.data_ptr() != head.data_ptr()
    torch.testing.assert_close(draft.lm_head_weight, head.detach().to(torch.bfloat16))
    draft.float()
    assert draft.lm_head_weight.data_ptr() == head.data_ptr()         # the target's own values, no copy
    assert draft.embed_weight.data_ptr() == target.get_input_embeddings().weight.data_ptr()


def test_tied_target_keeps_one_tensor():
    target, draft = _bound("llama")                                     # tie_word_embeddings=True
    assert draft.lm_head_weight is draft.embed_weight
    draft.to(torch.bfloat16)
    assert draft.lm_head_weight is draft.embed_weight and draft.embed_weight.dtype == torch.bfloat16
    _, bf16 = _bound("llama", torch.bfloat16)                           # bound as a bf16 draft
    assert bf16.lm_head_weight is bf16.embed_weight and bf16.embed_weight.dtype == torch.bfloat16


def test_from_pretrained_ignores_embedding_and_head_in_files(tmp_path):
    target, draft = _bound("qwen3")
    draft.save_pretrained(tmp_path / "d")
    file = tmp_path / "d" / "model.safetensors"
    state = load_file(str(file))
    state.update({"embed_tokens.weight": torch.zeros(3, 2), "lm_head.weight": torch.zeros(3, 2)})
    save_file(state, str(file))
    loaded = DFlash2DraftModel.from_pretrained(tmp_path / "d")
    assert loaded.embed_weight is None and loaded.lm_head_weight is None
    assert set(loaded.state_dict()) == set(draft.state_dict())

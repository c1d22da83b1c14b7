"""The workplace of the bad-input matrix: a folder of a user's files, good and bad, built once.

`build_workplace(root)` writes everything the cases point at (names below); the `work` fixture is a
fresh copy of it as the current directory. `snapshot(root)` hashes every file so a case can assert
that nothing a user had changed and nothing new was left behind.
Tiny models only: a local Hugging Face target directory (`target/`, with a character tokenizer)
and drafts for it, so a case that reaches a model load takes milliseconds.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from dflash2.data.shards import Record, ShardWriter
from dflash2.targets.tiny import tiny_draft, tiny_target
from training_util import synthetic_sequences

VOCAB = 128  # the tiny target's
DEEP = 100_000  # levels of nested JSON lists: beyond what Python's json module can recurse into


def tiny_tokenizer():
    """A character-level fast tokenizer for the tiny target: pad / BOS / EOS / UNK are ids 0-3."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({chr(ord("a") + i): 4 + i for i in range(26)})
    vocab.update({" ": 30})
    model = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=model, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def write_target(path: Path, **shape) -> None:
    tiny_target("llama", **shape).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)


def _truncate(path: Path, keep: int | None = None) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if keep is None else keep])


def _draft_with(source: Path, out: Path, name: str, value: float) -> None:
    """A copy of a draft with one value of one tensor replaced (NaN / inf)."""
    shutil.copytree(source, out)
    state = load_file(str(out / "model.safetensors"))
    state[name] = state[name].clone()
    state[name].view(-1)[0] = value
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


def _write_config(directory: Path, text: str | bytes) -> None:
    directory.mkdir()
    (directory / "config.json").write_bytes(text if isinstance(text, bytes) else text.encode())


NAN_TENSOR = "layers.0.mlp.up_proj.weight"
INF_TENSOR = "fc.weight"


def build_drafts(root: Path) -> None:
    draft = root / "draft"
    tiny_draft(tiny_target("llama")).save_pretrained(draft)
    tiny_draft(tiny_target("llama", hidden_size=96)).save_pretrained(root / "draft-other")
    _draft_with(draft, root / "draft-nan", NAN_TENSOR, float("nan"))
    _draft_with(draft, root / "draft-inf", INF_TENSOR, float("inf"))
    for name in ("draft-empty", "draft-trunc", "draft-noweights", "draft-shape"):
        shutil.copytree(draft, root / name)
    (root / "draft-empty" / "model.safetensors").write_bytes(b"")
    _truncate(root / "draft-trunc" / "model.safetensors")
    (root / "draft-noweights" / "model.safetensors").unlink()
    shutil.copy(root / "draft-other" / "model.safetensors", root / "draft-shape" / "model.safetensors")
    config = json.loads((draft / "config.json").read_text())
    config["dflash_config"]["selector_rank"] = "sixteen"
    _write_config(root / "draft-badtype", json.dumps(config))
    _write_config(root / "draft-badjson", "{\"hidden_size\": ")
    _write_config(root / "draft-nonutf", b"\xff\xfe{}")
    _write_config(root / "draft-list", "[1, 2]")
    _write_config(root / "draft-deep", '{"dflash_config": ' + "[" * DEEP + "]" * DEEP + "}")


def build_targets(root: Path) -> None:
    write_target(root / "target")
    for name in ("target-trunc", "target-empty"):
        shutil.copytree(root / "target", root / name)
    _truncate(root / "target-trunc" / "model.safetensors")
    (root / "target-empty" / "model.safetensors").write_bytes(b"")
    (root / "target-junk").mkdir()
    (root / "target-junk" / "readme.txt").write_text("not a model\n")


def write_shards(path: Path, n: int = 8) -> None:
    with ShardWriter(path, {"source": "matrix"}, shard_size=4) as writer:
        for i, (ids, mask) in enumerate(synthetic_sequences(n, vocab=VOCAB, min_len=24, max_len=40)):
            split = int((~mask).sum())
            writer.add(Record(f"synthetic:{i}", ids[:split].numpy(), ids[split:].numpy()))


def train_config(target: str, data: str, output_dir: str) -> dict:
    """A training config for the tiny target that runs in a second or two."""
    return {"target": {"name": target}, "data": {"train": [data], "max_seq_len": 64},
            "draft": {"num_layers": 1, "selector_rank": 8, "selector_top_k": 8, "conv_group_size": 16},
            "loss": {"num_anchors": 4, "logits_chunk": 16},
            "train": {"steps": 2, "batch_size": 4, "log_every": 1, "checkpoint_every": 1, "output_dir": output_dir,
                      "progress": False, "save_dtype": "fp32"}}


def build_files(root: Path) -> None:
    (root / "project").mkdir()
    (root / "project" / "notes.txt").write_text("a user's notes\n")
    (root / "emptydir").mkdir()
    (root / "afile.txt").write_text("a user's file\n")
    (root / "empty.txt").write_bytes(b"")
    (root / "nonutf8.txt").write_bytes(b"\xff\xfe not UTF-8\n")
    (root / "trunc.jsonl").write_text('{"prompt": "a"}\n{"prompt":')
    (root / "prompts.jsonl").write_text('{"prompt": "hello there"}\n')
    (root / "prompts2").mkdir()
    (root / "prompts2" / "prompts.jsonl").write_text('{"prompt": "hello again"}\n')
    for name, value in {"msgs-obj.json": {"role": "user"}, "msgs-empty.json": [],
                        "msgs-role.json": [{"role": "robot", "content": "hi"}],
                        "msgs-nocontent.json": [{"role": "user"}]}.items():
        (root / name).write_text(json.dumps(value))
    (root / "msgs-deep.json").write_text("[" * DEEP + "]" * DEEP)
    (root / "deep.jsonl").write_text('{"prompt": ' + "[" * DEEP + "]" * DEEP + "}\n")
    (root / "bad.yaml").write_text("train:\n  steps: [1\n")
    (root / "nonutf8.yaml").write_bytes(b"train:\n  steps: \xff\n")
    (root / "list.yaml").write_text("- train\n")
    (root / "data-nomanifest").mkdir()
    (root / "data-nomanifest" / "records.txt").write_text("x\n")
    write_shards(root / "data")
    import yaml

    (root / "train.yaml").write_text(yaml.safe_dump(train_config("target", "data", "run")))
    broken = root / "run-broken" / "checkpoints"
    broken.mkdir(parents=True)
    (broken / "latest").write_text("step-00000007\n")


def build_workplace(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    build_targets(root)
    build_drafts(root)
    build_files(root)
    return root


def snapshot(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under `root`."""
    out = {}
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def temporaries(root: Path) -> list[str]:
    """Leftovers of atomic writes (`.NAME.XXXXXXXX.tmp`, `.NAME.old`) anywhere under `root`."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*") if p.name.endswith((".tmp", ".old")))


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """The workplace, built once per test module."""
    return build_workplace(tmp_path_factory.mktemp("matrix") / "work")


@pytest.fixture
def work(template, tmp_path, monkeypatch):
    """A fresh copy of the workplace as the current directory, model-load progress bars off (they
    are not a second line of an error)."""
    from transformers.utils import logging

    root = tmp_path / "work"
    shutil.copytree(template, root)
    monkeypatch.chdir(root)
    logging.disable_progress_bar()
    yield root
    logging.enable_progress_bar()

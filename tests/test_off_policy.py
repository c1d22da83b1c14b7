"""Training from a user's own conversations (`dflash2 regenerate --prompts FILE --off-policy`): one record
per answered assistant turn, the prompt as the target would see it and the answer as its chat template
renders it, up to the end-of-turn token; the manifest says the data is off-policy; and `dflash2 train`
trains a draft on it end to end, naming the directory as off-policy (regenerated data is not named)."""
from __future__ import annotations

import json

import yaml

from dflash2.cli import main as cli
from dflash2.data.chat_files import load_chat_file
from dflash2.data.shards import load_manifest, read_records
from dflash2.targets.chat import encode_messages
from dflash2.training import regenerate as regen
from matrix_util import train_config
from regen_util import char_tokenizer, write_prompts, write_target

STOP = 2   # the tokenizer's </s>, closing an assistant turn in regen_util.TEMPLATE


def test_conversations_become_off_policy_shards_and_train(tmp_path, capsys):
    target, prompts = write_target(tmp_path / "target"), write_prompts(tmp_path / "chats.jsonl")
    out = tmp_path / "offpolicy"
    assert regen.main(["--target", str(target), "--prompts", str(prompts), "--off-policy", "--out", str(out),
                       "--max-new-tokens", "13", "--no-progress"]) == 0
    tokenizer = char_tokenizer()
    stored = {r.id: r for r in read_records(out)}
    want = {}
    for chat in load_chat_file(prompts):
        for turn, (before, answer) in enumerate(chat.answered_turns(), start=1):
            want[f"chats:{chat.id}:{turn}"] = (before, answer)
    # prompts alone have no answer; messages records one; ShareGPT records one before their second question
    assert sorted(stored) == sorted(want) and len(stored) == 5
    assert {r.finish_reason for r in stored.values()} == {"stop", "length"}
    for key, record in stored.items():
        before, answer = want[key]
        assert record.prompt.tolist() == encode_messages(tokenizer, before)
        text = tokenizer.decode(record.response.tolist())
        if len(answer) + 1 <= 13:                                 # "answer</s>" fits: the whole turn, ended
            assert text == answer + "</s>" and record.finish_reason == "stop" and record.response[-1] == STOP
        else:                                                     # cut at --max-new-tokens
            assert (answer + "</s>").startswith(text) and record.finish_reason == "length" and record.response.size == 13
    manifest = load_manifest(out)
    assert manifest["sampling"]["off_policy"] is True and "not the target's" in manifest["sampling"]["responses"]
    assert manifest["runs"][0]["off_policy"] is True and manifest["prompts"]["file"] == "chats.jsonl"

    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(train_config(str(target), str(out), str(tmp_path / "run"))))
    capsys.readouterr()
    assert cli(["train", str(config), "train.steps=2"]) == 0
    note = [line for line in capsys.readouterr().err.splitlines() if "off-policy" in line]
    assert note == [f"note: data.train '{out}' is off-policy (its answers are a file's, not the target's): expect "
                    "a lower tau than from the target's own answers to the same prompts (TRAINING.md §2)"]
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m][-1] == 2

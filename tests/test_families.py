"""`dflash2 families` end to end on the real SmolLM2 target: DFlash v1 and an MTP head (the DFlash2
arm differs from v1 only in two config switches), one training step each from the same config,
measured by the yardstick and by end-to-end speed at both temperatures, one table (`--train-only`
first: the arms trained, nothing measured); a second invocation reuses what exists. And `init-draft --family mtp` writes a head the yardstick measures
like a draft."""
from __future__ import annotations

import json
from pathlib import Path

from dflash2.cli import main as cli_main
from dflash2.eval.yardstick import main as yardstick_main
from dflash2.model.mtp_checkpoint import load_mtp_head
from training_util import one_step_overrides

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data" / "regen" / "smollm2-sharegpt"


def test_families_train_measure_and_tabulate_each_arm_alike(smollm2_cache, tmp_path, monkeypatch, capsys):
    cache, _ = smollm2_cache
    monkeypatch.setenv("DFLASH2_CACHE", str(cache))
    out = tmp_path / "families"
    argv = ["families", str(REPO / "configs" / "smollm2-dflash2.yaml"), *one_step_overrides(DATA), "draft.block_size=4",
            "--datasets", "gsm8k", "--num-prompts", "1", "--max-new-tokens", "5", "--concurrency", "1",
            "--heldout", "1", "--per-benchmark", "1", "--yardstick-tokens", "6", "--arms", "dflash-v1,mtp",
            "--output", str(out)]
    assert cli_main(argv + ["--train-only"]) == 0       # train, then stop: nothing measured yet
    assert all((out / arm / "final").is_dir() for arm in ("dflash-v1", "mtp"))
    assert not (out / "families.json").exists() and not (out / "mtp" / "speed-t0").exists()
    trained = (out / "mtp" / "final" / "model.safetensors").stat().st_mtime_ns
    assert cli_main(argv) == 0                           # measures the arms it trained, without retraining
    assert (out / "mtp" / "final" / "model.safetensors").stat().st_mtime_ns == trained
    result = json.loads((out / "families.json").read_text())
    assert list(result["arms"]) == ["dflash-v1", "mtp"]
    for arm, entry in result["arms"].items():
        assert entry["steps"] == 1 and entry["tokens"] > 0
        assert 1.0 <= entry["tau"]["t0"] <= 4.0 and 1.0 <= entry["tau"]["t1"] <= 4.0
        assert len(entry["position_acceptance"]["t0"]) == 3 and entry["draft_ms_per_cycle"] > 0
        assert set(entry["speed"]) == {"t0-b1", "t1-b1"}
        speed = json.loads((out / arm / "speed-t0" / "results.json").read_text())
        assert speed["overall"]["mismatches"] == 0 and speed["settings"]["block_size"] == 4
        assert speed["settings"]["proposer"] == ("mtp" if arm == "mtp" else "draft")
    head = load_mtp_head(out / "mtp" / "final")
    assert head.config.block_size == 4 and result["arms"]["mtp"]["parameters"] == head.num_parameters()
    prompts = json.loads((out / "yardstick-prompts.json").read_text())["prompts"]
    assert [p["source"] for p in prompts].count(DATA.name) == 1     # one held-out record, then benchmark prompts
    text = (out / "families.md").read_text()
    assert "| mtp |" in text and "## Where each family wins" in text and "4.80" in text
    assert f"target precision: {speed['settings']['dtype']}" in text and entry["dtype"] == speed["settings"]["dtype"]

    stamp = (out / "mtp" / "final" / "model.safetensors").stat().st_mtime_ns
    assert cli_main(argv) == 0   # resumable: nothing retrained or remeasured
    assert (out / "mtp" / "final" / "model.safetensors").stat().st_mtime_ns == stamp
    assert "measured at other commits" not in (out / "families.md").read_text()   # one code version
    assert {e["commit"] for e in result["arms"].values()} == {speed["commit"]}
    results = out / "mtp" / "speed-t0" / "results.json"      # an arm measured by another (earlier) code version
    earlier = json.loads(results.read_text())
    earlier["commit"] = "0123456789abcdef"
    results.write_text(json.dumps(earlier))
    assert cli_main(argv) == 0
    assert "- arms measured at other commits (resumed runs): dflash-v1 " in (out / "families.md").read_text()
    assert ", mtp 0123456" in (out / "families.md").read_text()
    capsys.readouterr()
    for changed, message in ((["train.steps=2"], "trained with config key 'train.steps' = 1, and this run asks for 2"),
                             (["--heldout", "2"], "made with heldout = 1, and this run asks for 2"),
                             (["--num-prompts", "2"], "made with num_prompts = 1, and this run asks for 2")):
        assert cli_main(argv + changed) == 2   # made under other options: refused, not passed off as this run's
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and message in err, err
    assert (out / "mtp" / "final" / "model.safetensors").stat().st_mtime_ns == stamp


def test_init_draft_mtp_and_the_yardstick(smollm2_cache, tmp_path, monkeypatch, capsys):
    cache, _ = smollm2_cache
    monkeypatch.setenv("DFLASH2_CACHE", str(cache))
    assert cli_main(["init-draft", "--target", "smollm2", "--family", "mtp", "--block-size", "3",
                     "--out", str(tmp_path / "head")]) == 0
    assert "untrained MTP head" in capsys.readouterr().out
    head = load_mtp_head(tmp_path / "head")
    assert head.config.origin == "fresh" and head.config.family == "llama"
    table = tmp_path / "yardstick.md"
    assert yardstick_main(["--draft", str(tmp_path / "head"), "--arm", "untrained-mtp", "--data", str(DATA),
                           "--heldout", "1", "--per-benchmark", "1", "--max-new-tokens", "4",
                           "--table", str(table), "--prompts", str(tmp_path / "prompts.json")]) == 0
    row = json.loads(table.with_suffix(".jsonl").read_text().splitlines()[-1])
    assert row["arm"] == "untrained-mtp" and row["tau"]["t0"] >= 1.0

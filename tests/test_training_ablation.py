"""`dflash2 ablation` end to end on the real SmolLM2 target: two arms, one training step each, measured
by real speculative decoding at T=0 and T=1; a second invocation reuses what exists."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image as mpimg

from dflash2.cli import main as cli_main
from dflash2.model.config import DFlash2Config
from training_util import one_step_overrides

REPO = Path(__file__).resolve().parents[1]


def test_ablation_trains_and_measures_each_arm_alike(smollm2_cache, tmp_path, monkeypatch, capsys):
    cache, _ = smollm2_cache
    monkeypatch.setenv("DFLASH2_CACHE", str(cache))
    out = tmp_path / "ablation"
    argv = ["ablation", str(REPO / "configs" / "smollm2-dflash2.yaml"),
            *one_step_overrides(REPO / "data" / "regen" / "smollm2-sharegpt"), "train.grad_accum=1",
            "--arms", "dflash-v1,dflash2", "--datasets", "gsm8k", "--num-prompts", "2", "--t1-num-prompts", "1",
            "--max-new-tokens", "4",
            "--concurrency", "1", "--output", str(out)]
    assert cli_main(argv) == 0
    result = json.loads((out / "ablation.json").read_text())
    assert list(result["arms"]) == ["dflash-v1", "dflash2"]
    for arm, entry in result["arms"].items():
        assert entry["steps"] == 1 and entry["tokens"] > 0
        for temp in ("t0", "t1"):
            assert 1.0 <= entry[temp]["gsm8k"] <= 8.0 and entry[temp]["mean"] == entry[temp]["gsm8k"]
        bench = json.loads((out / arm / "bench-t1" / "results.json").read_text())
        assert bench["settings"]["temperature"] == 1.0 and bench["settings"]["top_k"] == 20
        assert bench["settings"]["num_prompts"] == 1 and entry["t0"]["measured_on"].startswith("2 prompts")
    v1, v2 = (DFlash2Config.from_dict(json.loads((out / arm / "final" / "config.json").read_text()))
              for arm in ("dflash-v1", "dflash2"))
    assert (v1.use_selector, v1.use_conv, v2.use_selector, v2.use_conv) == (False, False, True, True)
    assert mpimg.imread(out / "ablation-curves.png").ndim == 3
    text = (out / "ablation.md").read_text()
    assert "| dflash2 |" in text and "## T=0 (2 prompts per dataset, 4 new tokens)" in text

    stamp = (out / "dflash2" / "final" / "model.safetensors").stat().st_mtime_ns
    assert cli_main(argv + ["train.log_every=2"]) == 0  # resumable: nothing retrained (logging is no budget)
    assert (out / "dflash2" / "final" / "model.safetensors").stat().st_mtime_ns == stamp
    capsys.readouterr()
    assert cli_main(argv + ["train.steps=2"]) == 2      # another budget: the trained arms are not passed off as it
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "trained with config key 'train.steps' = 1, and this run asks for 2" in err, err
    assert (out / "dflash2" / "final" / "model.safetensors").stat().st_mtime_ns == stamp


"""Smoke tests of `dflash2 bench` and `dflash2 analyze` on random tiny models (seconds, no real target).

They check that the commands run end to end through the CLI, write results.json with the
documented keys, results.md and valid PNGs, that speculative outputs equal the autoregressive
ones at T=0 (mismatches == 0), and that a peer that cannot run is reported, not fatal.
"""
from __future__ import annotations

import json

import matplotlib.image as mpimg
import pytest

from dflash2.cli import main as cli_main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SUMMARY_KEYS = {"acceptance_length", "speedup", "tokens_per_second", "mismatches", "time_per_output_token_ms",
                "position_acceptance", "histogram", "baseline_tokens_per_second"}


def assert_pngs(out, names):
    assert names, "no plots written"
    for name in names:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name
        image = mpimg.imread(out / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100, name


def test_bench_smoke(tmp_path):
    out = tmp_path / "bench"
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "Count to five."}\n{"turns": ["Hi there.", "And again?"], "id": "two"}\n')
    status = cli_main(["bench", "--tiny", "--speculate", "always", "--datasets", "gsm8k,mt-bench", "--dataset-file", str(prompts),
                       "--num-prompts", "2", "--max-new-tokens", "16", "--concurrency", "1,2",
                       "--peers", "hf,pld,dflash", "--peers-python", str(tmp_path / "no-such-python"),
                       "--output", str(out)])
    assert status == 0
    results = json.loads((out / "results.json").read_text())
    assert {"datasets", "overall", "peers", "settings", "machine", "commit"} <= set(results)
    assert set(results["datasets"]) == {"gsm8k", "mt-bench", "mine"}
    assert results["datasets"]["mt-bench"]["compared"] == 4        # two conversations x two turns
    for name, entry in list(results["datasets"].items()) + [("overall", results["overall"])]:
        assert SUMMARY_KEYS <= set(entry), name
        assert 1.0 <= entry["acceptance_length"] <= results["settings"]["block_size"]
        for c, by_c in entry["by_concurrency"].items():
            assert by_c["mismatches"] == 0, (name, c)
    overall = results["overall"]
    assert overall["cycles"] == sum(overall["histogram"].values())
    assert overall["new_tokens"] == sum(d["new_tokens"] for d in results["datasets"].values())
    peers = results["peers"]
    assert peers["hf_generate"]["status"] == "ok" and peers["hf_generate"]["overall"]["mismatches"] == 0
    assert peers["hf_prompt_lookup"]["status"] == "ok" and peers["hf_prompt_lookup"]["overall"]["mismatches"] == 0
    assert peers["hf_prompt_lookup"]["overall"]["acceptance_length"] >= 1.0
    assert peers["dflash_reference"]["status"] == "unavailable" and "setup_peers.sh" in peers["dflash_reference"]["reason"]
    markdown = (out / "results.md").read_text()
    assert "**overall**" in markdown and "not a mean of means" in markdown and "dflash_reference" in markdown
    assert_pngs(out, results["plots"])


def test_bench_without_baseline_reports_the_same_acceptance(tmp_path):
    """--no-baseline (draft comparisons) skips the AR runs but decodes exactly as the full bench."""
    common = ["bench", "--tiny", "--speculate", "always", "--datasets", "gsm8k,mt-bench", "--num-prompts", "2", "--max-new-tokens", "12",
              "--concurrency", "2"]
    assert cli_main(common + ["--output", str(tmp_path / "full")]) == 0
    assert cli_main(common + ["--no-baseline", "--output", str(tmp_path / "fast")]) == 0
    full = json.loads((tmp_path / "full" / "results.json").read_text())
    fast = json.loads((tmp_path / "fast" / "results.json").read_text())
    for name in ("gsm8k", "mt-bench"):
        assert fast["datasets"][name]["acceptance_length"] == full["datasets"][name]["acceptance_length"]
        assert fast["datasets"][name]["sequences"] == full["datasets"][name]["sequences"]
        assert fast["datasets"][name]["speedup"] is None and fast["datasets"][name]["mismatches"] is None
    assert fast["overall"]["cycles"] == full["overall"]["cycles"]
    assert_pngs(tmp_path / "fast", fast["plots"])


def test_bench_resume_reuses_only_matching_parts(tmp_path):
    out = tmp_path / "bench"
    argv = ["bench", "--tiny", "--speculate", "always", "--datasets", "gsm8k,mt-bench", "--num-prompts", "2", "--max-new-tokens", "10",
            "--concurrency", "1", "--peers", "hf", "--output", str(out)]
    assert cli_main(argv) == 0
    first = json.loads((out / "results.json").read_text())
    assert first["settings"]["resumed_parts"] == []
    (out / "parts" / "dataset-mt-bench.json").unlink()  # as if interrupted during mt-bench
    assert cli_main(argv + ["--resume"]) == 0
    second = json.loads((out / "results.json").read_text())
    assert second["settings"]["resumed_parts"] == ["dataset-gsm8k", "peers-hf"]
    for name in ("gsm8k", "mt-bench"):
        for key in ("acceptance_length", "new_tokens", "cycles", "histogram", "mismatches"):
            assert second["datasets"][name][key] == first["datasets"][name][key], (name, key)
    assert second["datasets"]["gsm8k"]["seconds"] == first["datasets"]["gsm8k"]["seconds"]  # reused, not rerun
    assert second["peers"]["hf_generate"] == first["peers"]["hf_generate"]
    other = argv[:argv.index("--max-new-tokens") + 1] + ["9"] + argv[argv.index("--max-new-tokens") + 2:]
    assert cli_main(other + ["--resume"]) == 0  # different settings: nothing reused
    assert json.loads((out / "results.json").read_text())["settings"]["resumed_parts"] == []


def test_bench_auto_mode_is_lossless_and_reports_its_choices(tmp_path):
    """The default `--speculate auto` on an untrained draft: outputs equal plain decoding, and the
    report says how many drafts each cycle verified and how long the batch ran without drafting."""
    out = tmp_path / "auto"
    assert cli_main(["bench", "--tiny", "--datasets", "gsm8k", "--num-prompts", "3", "--max-new-tokens", "24",
                     "--concurrency", "1,3", "--output", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["speculate"] == "auto"
    for c, entry in results["overall"]["by_concurrency"].items():
        assert entry["mismatches"] == 0, c
        assert {"drafts_verified_per_cycle", "draft_lengths", "plain_steps", "fallback_seconds",
                "speculation_overhead"} <= set(entry)
        assert entry["plain_steps"] + entry["cycles"] > 0


def test_bench_repeats_pair_every_batch_and_report_the_median_ratio(tmp_path):
    """--repeats 3 decodes the prompt list three times, both decoders in turn per batch: every
    repeat is checked for equality, and speedup_median is the median of the 3 x batches paired ratios."""
    out = tmp_path / "repeats"
    assert cli_main(["bench", "--tiny", "--speculate", "always", "--datasets", "gsm8k", "--num-prompts", "4",
                     "--max-new-tokens", "12", "--concurrency", "2", "--repeats", "3", "--output", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    entry = results["overall"]["by_concurrency"]["2"]
    assert entry["compared"] == 12 and entry["mismatches"] == 0 and entry["sequences"] == 12
    saved = json.loads(next((out / "parts").glob("dataset-*.json")).read_text())["payload"]
    ar, spec = saved["ar"]["2"][0], saved["spec"]["draft"]["2"][0]
    assert len(ar["batch_seconds"]) == len(spec["batch_seconds"]) == 6
    ratios = sorted(((a - ta["prefill_seconds"]) / na) / ((s - ts["prefill_seconds"]) / ns)
                    for a, s, ta, ts, na, ns in zip(ar["batch_seconds"], spec["batch_seconds"], ar["batches"],
                                                    spec["batches"], ar["batch_tokens"], spec["batch_tokens"]))
    assert entry["speedup_median"] == pytest.approx((ratios[2] + ratios[3]) / 2)
    cpu = sorted((ta["cycle_cpu_seconds"] / na) / (ts["cycle_cpu_seconds"] / ns)
                 for ta, ts, na, ns in zip(ar["batches"], spec["batches"], ar["batch_tokens"], spec["batch_tokens"]))
    assert all(t["cycle_cpu_seconds"] > 0 for t in ar["batches"] + spec["batches"])
    assert entry["speedup_cpu_median"] == pytest.approx((cpu[2] + cpu[3]) / 2)
    assert "median pair speedup" in (out / "results.md").read_text()
    assert cli_main(["bench", "--tiny", "--repeats", "0", "--output", str(tmp_path / "bad")]) == 2


def test_speculation_overhead_weighs_drafted_tokens_at_the_plain_step_time():
    """Two rows, 10 plain steps of 0.1 s (20 tokens, 0.05 s a token) and speculative cycles that
    took 0.5 s for 4 tokens: plain steps would have taken 0.2 s for those, so 0.3 s of 1.5 s was lost."""
    from dflash2.decoding.loop.stats import BatchTiming, RowStats
    from dflash2.eval.bench_runs import speculation_overhead

    rows = [RowStats(8, new_tokens=1 + 10 + 2), RowStats(8, new_tokens=1 + 10 + 2)]
    timing = BatchTiming(prefill_seconds=0.4, total_seconds=1.9, plain_steps=10, plain_seconds=1.0, plain_tokens=20)
    assert speculation_overhead(rows, [timing]) == pytest.approx(0.3 / 1.5)
    assert speculation_overhead(rows, [BatchTiming(total_seconds=1.0)]) is None      # no plain steps: `always`


def test_analyze_smoke(tmp_path):
    out = tmp_path / "analyze"
    status = cli_main(["analyze", "--tiny", "--dataset", "gsm8k,humaneval", "--num-prompts", "1",
                       "--max-new-tokens", "16", "--repeats", "2", "--output", str(out)])
    assert status == 0
    results = json.loads((out / "results.json").read_text())
    block = results["settings"]["block_size"]
    recall = results["recall"]
    for key in ("top1", "topk", "topk_given_prefix", "oracle_reach", "top1_convs_off"):
        assert len(recall[key]) == block - 1 and all(0.0 <= v <= 1.0 for v in recall[key]), key
    assert all(t1 <= tk for t1, tk in zip(recall["top1"], recall["topk"]))
    for variant in ("convs_on", "convs_off"):
        acc = results["acceptance"][variant]
        assert 1.0 <= acc["argmax"] <= acc["oracle"] <= block
        assert 1.0 <= acc["selector"] <= acc["oracle"]
        shares = results["attention_share"][variant]
        assert len(shares) == 2 and all(0.0 < s < 1.0 for s in shares)
    assert results["attention_share"]["recompute_max_error"] < 1e-4
    assert results["latency"]["microbench_ms"]["cycle"] > 0
    assert 0.0 <= results["latency"]["shares"]["selector"] < 1.0
    assert (out / "results.md").read_text().startswith("# dflash2 analyze")
    assert_pngs(out, results["plots"])


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    assert cli_main(["bench", "--tiny", "--peers", "nosuch", "--output", str(tmp_path)]) == 2
    assert "unknown peer 'nosuch'" in capsys.readouterr().err
    assert cli_main(["bench", "--tiny", "--datasets", "gsm9k", "--output", str(tmp_path)]) == 2
    assert "unknown benchmark" in capsys.readouterr().err


def test_cycle_profile_accounts_for_the_whole_cycle(capsys, tmp_path):
    """`python -m dflash2.tools.profile.cycles`: per-phase milliseconds add up to the cycle (plus "other"),
    and the cycle is also expressed in plain decoding steps."""
    from dflash2.tools.profile import cycles

    out = tmp_path / "cycles.json"
    assert cycles.main(["--tiny", "--speculate", "always", "--batch", "1,3", "--new-tokens", "12", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| batch |" in table and "realign" in table
    profiles = json.loads(out.read_text())
    assert [p["batch"] for p in profiles] == [1, 3]
    for p in profiles:
        parts = sum(v for k, v in p["ms_per_cycle"].items() if k != "total")
        assert abs(parts - p["ms_per_cycle"]["total"]) < 1e-6 * max(1.0, p["ms_per_cycle"]["total"]) + 1e-9
        assert p["plain_step_ms"] > 0 and p["cycle_in_plain_steps"] > 0 and 0 <= p["non_forward_share"] <= 1


@pytest.mark.parametrize("use_selector", [True, False])
def test_analyze_counts_a_reduced_vocabulary_draft_in_target_ids(use_selector):
    """Teacher-forced on the draft's own greedy block, `analyze` finds the whole block right: the
    logits of a draft with a reduced vocabulary are indexed by draft ids, and what it counts must be
    mapped to target ids first, as decoding does (unmapped, a 40-token vocabulary scores about 0)."""
    from types import SimpleNamespace

    import torch

    from dflash2.decoding.loop.timing import Stopwatch
    from dflash2.decoding.proposers.draft import DraftProposer
    from dflash2.decoding.verifier.adapter import TargetAdapter
    from dflash2.eval.analyze import AnalyzeSettings, AttentionProbe, Tally, teacher_forced
    from dflash2.targets.tiny import tiny_draft, tiny_target

    target = tiny_target("llama", seed=0)
    draft = tiny_draft(target, draft_vocab_size=40, use_selector=use_selector, seed=3)
    draft.bind_target(target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    adapter = TargetAdapter(target, draft.config.target_layer_ids)
    prompt = [5, 17, 33, 2, 9, 41, 7, 12, 60, 3]
    logits, features = adapter.prefill([prompt])
    anchor = int(logits[0, -1].argmax())                        # the target's first greedy token
    proposer = DraftProposer(draft, Stopwatch(None))
    proposer.add_rows(features, adapter.mask)
    block = draft.config.block_size
    proposal = proposer.propose(torch.tensor([anchor]), adapter.next_position.clone(), block, torch.zeros(1))
    drafted = proposal.tokens[0].tolist()                       # target ids, block - 1 of them
    assert not torch.equal(draft.draft_token_ids(), torch.arange(40))   # draft id i is not target id i
    tally = Tally(block - 1)
    pipe = SimpleNamespace(decoder=SimpleNamespace(target=TargetAdapter(target, draft.config.target_layer_ids),
                                                   draft=draft))
    teacher_forced(pipe, [(len(prompt), prompt + [anchor] + drafted)], AnalyzeSettings(top_k=8),
                   {"convs_on": tally}, {"convs_on": AttentionProbe(draft)})
    assert tally.full_blocks == 1                               # the anchor after the prompt: its whole block
    acceptance = tally.acceptance()
    assert acceptance["selector" if use_selector else "argmax"] == block
    assert acceptance["oracle"] == block

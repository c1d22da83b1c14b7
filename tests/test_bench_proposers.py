"""`dflash2 bench --proposer draft,lookup,hybrid`: proposers measured side by side in one run.

Every proposer's decoder runs over the same target (and draft) beside ONE autoregressive baseline,
the decoders in turn batch by batch; each proposer's output equals the baseline's at T=0, each
reports only its own sources' tokens, resuming reuses the saved parts, and bad lists are one-line
errors before anything loads.
"""
from __future__ import annotations

import json

import pytest

from dflash2.cli import main as cli_main
from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.errors import DFlash2Error
from dflash2.eval.bench import loading_proposer, run_sides
from dflash2.pipeline import tiny_pipeline

PROPOSERS = ["draft", "lookup", "hybrid"]


def _bench(tmp_path, out, *extra):
    prompts = tmp_path / "copy.jsonl"   # text that repeats, so lookup has something to propose
    prompts.write_text('{"prompt": "abc abc abc abc abc abc abc abc abc abc"}\n'
                       '{"turns": ["xyz xyz xyz xyz xyz xyz", "xyz xyz xyz again"]}\n')
    return cli_main(["bench", "--tiny", "--speculate", "always", "--proposer", ",".join(PROPOSERS),
                     "--datasets", "gsm8k,mt-bench", "--dataset-file", str(prompts), "--num-prompts", "2",
                     "--max-new-tokens", "14", "--concurrency", "1,2", "--output", str(out), *extra])


def test_proposers_side_by_side_share_one_baseline_and_are_each_lossless(tmp_path):
    out = tmp_path / "side"
    assert _bench(tmp_path, out) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["proposers"] == PROPOSERS and results["settings"]["proposer"] == "draft"
    assert list(results["proposers"]) == PROPOSERS
    assert results["datasets"] == results["proposers"]["draft"]["datasets"]   # the first one's, as before
    for proposer, report in results["proposers"].items():
        assert set(report["datasets"]) == {"gsm8k", "mt-bench", "copy"}
        for name, entry in list(report["datasets"].items()) + [("overall", report["overall"])]:
            for c, by_c in entry["by_concurrency"].items():
                assert by_c["mismatches"] == 0 and by_c["compared"] == by_c["sequences"] > 0, (proposer, name, c)
        overall = report["overall"]["by_concurrency"]
        for c in ("1", "2"):   # one baseline, decoded once: every proposer is measured against the same seconds
            assert overall[c]["baseline_seconds"] == results["proposers"]["draft"]["overall"]["by_concurrency"][c][
                "baseline_seconds"]
    for c in ("1", "2"):
        draft = results["proposers"]["draft"]["overall"]["by_concurrency"][c]
        lookup = results["proposers"]["lookup"]["overall"]["by_concurrency"][c]
        hybrid = results["proposers"]["hybrid"]["overall"]["by_concurrency"][c]
        assert draft["cycles_by_source"].get("lookup", 0) == 0 and draft["cycles_by_source"].get("draft", 0) > 0
        assert lookup["cycles_by_source"].get("draft", 0) == 0 and lookup["accepted_by_source"].get("draft", 0) == 0
        assert set(hybrid["cycles_by_source"]) <= {"draft", "lookup", "tree"}
    assert results["proposers"]["lookup"]["overall"]["cycles_by_source"].get("lookup", 0) > 0
    markdown = (out / "results.md").read_text()
    assert "## Proposers side by side (draft, lookup, hybrid" in markdown and "### Batch 2" in markdown
    assert "proposer draft; all 3 side by side below" in markdown


def test_side_by_side_resumes_from_its_parts(tmp_path):
    out = tmp_path / "side"
    assert _bench(tmp_path, out) == 0
    first = json.loads((out / "results.json").read_text())
    (out / "parts" / "dataset-copy.json").unlink()   # as if interrupted during the last dataset
    assert _bench(tmp_path, out, "--resume") == 0
    second = json.loads((out / "results.json").read_text())
    assert second["settings"]["resumed_parts"] == ["dataset-gsm8k", "dataset-mt-bench"]
    for proposer in PROPOSERS:
        for name in ("gsm8k", "mt-bench"):
            a, b = first["proposers"][proposer]["datasets"][name], second["proposers"][proposer]["datasets"][name]
            for key in ("acceptance_length", "cycles", "histogram", "seconds", "baseline_seconds", "accepted_by_source"):
                assert a[key] == b[key], (proposer, name, key)


class _Recorder:
    """A decoder that records when it was called and returns one distinct token per prompt."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def generate(self, prompts, config):
        from dflash2.decoding.loop.stats import BatchTiming, RowStats

        self.log.append(self.name)
        timing = BatchTiming()
        return [type("R", (), {"tokens": [p[0]], "stats": RowStats(2, new_tokens=1), "timing": timing})()
                for p in prompts]


def test_run_sides_rotates_who_goes_first_and_keeps_prompt_order():
    log = []
    ar = _Recorder("ar", log)
    decoders = {name: _Recorder(name, log) for name in ("a", "b", "c")}
    prompts = [[i] for i in range(8)]
    ar_side, sides = run_sides(ar, decoders, prompts, 2, GenerationConfig(), "test")
    rounds = [log[i:i + 4] for i in range(0, len(log), 4)]
    assert [r[0] for r in rounds] == ["ar", "a", "b", "c"]          # each decoder first once in four batches
    assert all(sorted(r) == ["a", "ar", "b", "c"] for r in rounds)
    assert ar_side.outputs == [[i] for i in range(8)]
    assert all(side.outputs == ar_side.outputs for side in sides.values())
    log.clear()
    _, sides = run_sides(None, decoders, prompts, 4, GenerationConfig(), "test")   # no baseline
    assert "ar" not in log and len(log) == 6 and list(sides) == ["a", "b", "c"]


@pytest.mark.parametrize("value, message", [("draft,bogus", "unknown proposer 'bogus'"),
                                            ("draft,draft", "names a proposer twice"),
                                            (",", "give at least one value")])
def test_bad_proposer_lists_are_one_line_errors(tmp_path, capsys, value, message):
    assert cli_main(["bench", "--tiny", "--proposer", value, "--output", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_pipeline_loads_for_the_first_proposer_that_needs_the_draft():
    assert loading_proposer(()) is None
    assert loading_proposer(("lookup",)) == "lookup"
    assert loading_proposer(("lookup", "hybrid", "draft")) == "hybrid"


def test_decoder_for_shares_the_target_and_draft():
    pipe = tiny_pipeline(seed=0, speculate="always")
    assert pipe.decoder_for("draft") is pipe.decoder
    hybrid, lookup = pipe.decoder_for("hybrid"), pipe.decoder_for("lookup")
    assert hybrid.draft is pipe.decoder.draft and hybrid.target is pipe.decoder.target
    assert hybrid.proposer == "hybrid" and hybrid.speculate == "always"
    assert lookup.draft is None and lookup.target.model is pipe.decoder.target.model and lookup.proposer == "lookup"
    with pytest.raises(DFlash2Error, match="needs a draft"):
        lookup_pipe = type(pipe)(lookup, pipe.tokenizer, pipe.stop_token_ids, "none", False)
        lookup_pipe.decoder_for("hybrid")

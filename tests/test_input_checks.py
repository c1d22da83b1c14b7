"""Input the commands used to accept or misreport: data made by another target, a config's
`target=NAME` override, "no draft" in the Python API, and an acceptance length that is undefined."""
from __future__ import annotations

import json

from dflash2.cli import main
from dflash2.training.config import load_config
from dflash2.training.preflight import check_inputs
from matrix_util import made_by, template, work, write_shards  # noqa: F401 (fixtures)


def test_data_made_by_the_configured_target_is_accepted(work):
    from dflash2.targets.builtin import load_target

    fields = made_by(load_target("target")[0])
    write_shards(work / "data-mine", fields=fields)
    write_shards(work / "data-theirs", fields={**fields, "sampling": {"off_policy": True}})
    assert check_inputs(load_config("train.yaml", ["data.train=[data-mine]"])) == []   # the same target, regenerated
    assert check_inputs(load_config("train.yaml", ["data.train=[data-mine,data-theirs]"])) == ["data-theirs"]


def test_target_name_is_a_top_level_override(work):
    assert load_config("train.yaml", ["target=gemma3"]).target.name == "gemma3"
    assert load_config("train.yaml", ["target.name=gemma3"]).target.name == "gemma3"


def test_json_acceptance_length_is_null_without_a_drafted_cycle(work, capsys):
    assert main(["generate", "--prompt", "hi", "--target", "target", "--no-draft", "--json",
                 "--max-new-tokens", "4"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cycles"] == 0 and report["acceptance_length"] is None


def test_no_draft_has_a_name_in_the_python_api(work):
    from dflash2.pipeline import NO_DRAFT, load_decoder

    plain = load_decoder("target", draft=NO_DRAFT).decoder
    assert plain.draft is None and plain.proposer is None                # no draft: plain decoding
    default = load_decoder("target", draft=None).decoder                  # None still means the default, which
    assert default.proposer == "lookup"                                    # for a target without a trained draft
    assert load_decoder("target", draft=None, proposer="draft").decoder.draft is not None   # is lookup


def test_a_first_regenerate_run_that_fails_leaves_no_manifest(work, capsys, monkeypatch):
    """A failure before any record is stored leaves nothing, so the corrected rerun is not refused."""
    from dflash2.decoding.loop.engine import DecodeSession

    real = DecodeSession.step

    def fail(*args, **kwargs):
        raise RuntimeError("the decoder failed")
    monkeypatch.setattr(DecodeSession, "step", fail)
    argv = ["regenerate", "--target", "target", "--source", "synthetic", "--out", "new", "--num-prompts", "2",
            "--no-progress", "--max-new-tokens", "8"]
    try:
        main(argv)
    except RuntimeError:
        pass
    assert not (work / "new").exists()
    monkeypatch.setattr(DecodeSession, "step", real)
    assert main(argv[:-1] + ["4"]) == 0 and (work / "new" / "manifest.json").is_file()


def test_an_unavailable_peer_is_said_on_the_terminal(work, capsys):
    assert main(["bench", "--tiny", "--datasets", "gsm8k", "--num-prompts", "1", "--max-new-tokens", "4",
                 "--peers", "vllm", "--output", "out"]) == 0
    err = capsys.readouterr().err
    assert any(line.startswith("# peers: ") and "unavailable" in line and "venv" in line for line in err.splitlines()), err

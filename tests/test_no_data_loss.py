"""A user's work is never lost: outputs into existing directories, modes, killed runs' leftovers,
and the messages that say what a run's results mean (--compare, --block-size, --dataset-file)."""
from __future__ import annotations

import json
import os
import stat

import pytest

from dflash2.cli import main
from dflash2.files.atomic import atomic_write, remove_stale_temporaries
from dflash2.model.draft import DFlash2DraftModel
from matrix_util import snapshot, template, work  # noqa: F401 (fixtures)


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def test_init_draft_force_replaces_only_its_own_files(work, capsys):
    notes = (work / "project" / "notes.txt").read_bytes()
    assert run(capsys, "init-draft", "--target", "target", "--out", "project")[0] == 2
    assert sorted(p.name for p in (work / "project").iterdir()) == ["notes.txt"]
    assert run(capsys, "init-draft", "--target", "target", "--out", "project", "--force", "--layers", "1")[0] == 0
    assert DFlash2DraftModel.from_pretrained(work / "project").config.num_hidden_layers == 1
    assert run(capsys, "init-draft", "--target", "target", "--out", "project", "--force", "--layers", "2")[0] == 0
    assert DFlash2DraftModel.from_pretrained(work / "project").config.num_hidden_layers == 2
    assert sorted(p.name for p in (work / "project").iterdir()) == ["config.json", "model.safetensors", "notes.txt"]
    assert (work / "project" / "notes.txt").read_bytes() == notes
    assert run(capsys, "init-draft", "--target", "target", "--out", ".", "--force")[0] == 0  # no traceback
    assert (work / "afile.txt").read_text() == "a user's file\n"


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_written_files_and_directories_follow_the_umask(work, capsys, umask):
    before = os.umask(umask)
    try:
        assert run(capsys, "init-draft", "--target", "target", "--out", "new")[0] == 0
        with atomic_write(work / "plain.txt", "w") as handle:
            handle.write("x")
    finally:
        os.umask(before)
    mode = lambda path: stat.S_IMODE(path.stat().st_mode)  # noqa: E731
    assert mode(work / "new") == 0o777 & ~umask
    assert mode(work / "new" / "model.safetensors") == mode(work / "new" / "config.json") == 0o666 & ~umask
    assert mode(work / "plain.txt") == 0o666 & ~umask


def _metrics_steps(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["split"] == "train"]


def test_train_into_an_existing_run_needs_resume_or_overwrite(work, capsys):
    assert run(capsys, "train", "train.yaml")[0] == 0
    (work / "run" / "my-notes.txt").write_text("mine\n")
    first = snapshot(work / "run")
    code, _, err = run(capsys, "train", "train.yaml")
    assert code == 2 and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert snapshot(work / "run") == first  # nothing appended, nothing pruned
    assert run(capsys, "train", "--overwrite", "train.yaml", "train.steps=3")[0] == 0
    assert _metrics_steps(work / "run") == [1, 2, 3]  # the new run alone, no duplicate steps
    assert (work / "run" / "my-notes.txt").read_text() == "mine\n"
    assert sorted(p.name for p in (work / "run" / "checkpoints").iterdir()) == ["latest", "step-00000002",
                                                                                "step-00000003"]


def test_leftovers_of_a_killed_checkpoint_are_removed_on_the_next_run(work, capsys):
    assert run(capsys, "train", "train.yaml")[0] == 0
    root = work / "run" / "checkpoints"
    ours = [root / ".step-00000003.k1ll3d_x.tmp", root / ".step-00000002.old", work / "run" / ".final.ab12cd34.tmp"]
    for leftover in ours:
        leftover.mkdir()
        (leftover / "trainer_state.pt").write_bytes(b"\0" * 1000)
    (root / ".latest.zz99yy88.tmp").write_text("step-00000003\n")
    users = [work / "run" / ".notes.tmp", root / ".mine.ab12cd34.tmp", work / "run" / "final.ab12cd34.tmp"]
    for path in users:
        path.write_text("a user's\n")
    assert run(capsys, "train", "train.yaml", "--resume", "train.steps=3")[0] == 0
    assert not any(p.exists() for p in ours) and not (root / ".latest.zz99yy88.tmp").exists()
    assert all(p.read_text() == "a user's\n" for p in users)
    assert _metrics_steps(work / "run") == [1, 2, 3]


def test_stale_temporaries_match_only_our_pattern(tmp_path):
    names = [".step-00000001.abcdefgh.tmp", ".step-00000001.old", ".step-00000001.abc.tmp", ".other.abcdefgh.tmp",
             "step-00000001.abcdefgh.tmp", ".step-00000001.ABCDEFGH.tmp"]
    for name in names:
        (tmp_path / name).write_text("x")
    assert remove_stale_temporaries(tmp_path, r"step-\d{8}") == [".step-00000001.abcdefgh.tmp", ".step-00000001.old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])
    # with an age limit (the conversion cache, where another process may be converting right now)
    old, fresh = tmp_path / ".smollm2.gguf.abcdefgh.tmp", tmp_path / ".smollm2.hgfedcba.tmp"
    old.mkdir(), fresh.mkdir()
    os.utime(old, (old.stat().st_atime, old.stat().st_mtime - 7200))
    assert remove_stale_temporaries(tmp_path, r"smollm2(?:\.gguf)?", min_age_s=3600) == [old.name]
    assert fresh.is_dir()


def test_the_pattern_matches_what_atomic_writes_leave(tmp_path):
    """What a killed process leaves (the temporaries of atomic_directory / atomic_write) is exactly
    what the clean-up removes."""
    from dflash2.files.atomic import atomic_directory

    with pytest.raises(FileNotFoundError):  # the clean-up took the temporary away mid-write
        with atomic_directory(tmp_path / "step-00000009") as tmp:
            (tmp / "trainer_state.pt").write_bytes(b"x")
            assert remove_stale_temporaries(tmp_path, r"step-\d{8}") == [tmp.name]
    with pytest.raises(FileNotFoundError):
        with atomic_write(tmp_path / "latest", "w") as handle:
            handle.write("x")
            [temporary] = [p.name for p in tmp_path.iterdir()]
            assert remove_stale_temporaries(tmp_path, "latest") == [temporary]
    assert not list(tmp_path.iterdir())


def test_overwrite_and_resume_parse_in_any_position():
    from dflash2.training.trainer import TrainCommand, parse_command

    assert parse_command(["--overwrite", "c.yaml", "train.steps=3"]) == TrainCommand("c.yaml", ("train.steps=3",),
                                                                                     False, overwrite=True)


def test_compare_at_nonzero_temperature_says_outputs_may_differ(work, capsys):
    base = ("generate", "--prompt", "abc", "--target", "target", "--draft", "draft", "--max-new-tokens", "6", "--compare")
    code, out, _ = run(capsys, *base, "--temperature", "1", "--seed", "3")
    assert code == 0 and "identical to baseline:" in out and "expected at T > 0" in out
    code, out, _ = run(capsys, *base, "--temperature", "1", "--json")
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["identical_expected"] is False
    code, out, _ = run(capsys, *base, "--json")
    report = json.loads(out.strip().splitlines()[-1])
    assert report["identical"] is True and report["identical_expected"] is True


def test_block_size_above_the_trained_one_warns_with_its_cost(work, capsys):
    base = ("generate", "--prompt", "abc", "--target", "target", "--draft", "draft", "--max-new-tokens", "4", "--json")
    code, _, err = run(capsys, *base, "--block-size", "16")
    warnings = [line for line in err.splitlines() if line.startswith("# warning")]
    assert code == 0 and len(warnings) == 1
    assert "--block-size 16 is above the block size 8 this draft was trained with" in warnings[0]
    assert "verifies 16 tokens instead of 8" in warnings[0]
    code, _, err = run(capsys, *base, "--block-size", "4")
    assert code == 0 and "# warning" not in err


def test_bench_takes_every_dataset_file(work, capsys):
    (work / "other.jsonl").write_text('{"prompt": "count to three"}\n')
    code, _, _ = run(capsys, "bench", "--tiny", "--dataset-file", "prompts.jsonl", "--dataset-file", "other.jsonl",
                     "--num-prompts", "1", "--max-new-tokens", "2", "--output", "out")
    results = json.loads((work / "out" / "results.json").read_text())
    assert code == 0 and sorted(results["datasets"]) == ["other", "prompts"]

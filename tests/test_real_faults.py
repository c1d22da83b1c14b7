"""Real faults of the machine, not injected ones: a full disk and a read-only file system (small
tmpfs mounts), allocations the machine cannot hold, thread counts torch cannot honour. Each is one
line `error: ...` naming the user's path or option, exit status 2, and nothing left behind."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dflash2.cli import main
from matrix_util import template, temporaries, work  # noqa: F401 (fixtures)


def _mount(directory: Path, options: str) -> None:
    directory.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip() or 'not root'}): a real full or "
                    "read-only disk needs one")


@pytest.fixture
def mounted(tmp_path):
    """mounted(name, options) -> a fresh tmpfs directory; all are unmounted afterwards."""
    made = []

    def mount(name: str, options: str) -> Path:
        directory = tmp_path / name
        _mount(directory, options)
        made.append(directory)
        return directory
    yield mount
    for directory in reversed(made):
        subprocess.run(["umount", str(directory)], capture_output=True)


def one_line(capsys, argv) -> str:
    code = main(list(argv))
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith(("#", "Loading weights"))]
    assert "Traceback" not in err and code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("argv", [
    ("init-draft", "--target", "target", "--out", "{disk}/draft"),
    ("export", "draft", "--to", "dflash2", "--out", "{disk}/export", "--dtype", "float32"),
    ("train", "train.yaml", "train.output_dir={disk}/run"),
], ids=["init-draft", "export", "train checkpoint"])
def test_a_full_disk_is_one_line_naming_the_output(argv, work, mounted, capsys):
    disk = mounted("full", "size=96k")
    line = one_line(capsys, [part.format(disk=disk) for part in argv])
    assert "No space left on device" in line and str(disk) in line, line
    assert ".tmp" not in line, line
    assert not temporaries(disk), "a temporary file was left on the full disk"


def test_a_read_only_file_system_names_the_users_path_not_a_temporary_one(mounted):
    from dflash2.files.atomic import atomic_directory, atomic_write

    disk = mounted("readonly", "ro,size=64k")
    for write, path in ((atomic_directory, disk / "run"), (lambda p: atomic_write(p, "w"), disk / "table.md")):
        with pytest.raises(OSError) as info:
            with write(path):
                pass
        assert info.value.strerror == "Read-only file system" and info.value.filename == str(path), info.value


def test_thread_counts_beyond_the_cores_warn_and_far_beyond_are_refused():
    from dflash2.errors import DFlash2Error
    from dflash2.runtime.machine import MAX_OVERSUBSCRIPTION, check_threads, usable_cores

    cores = usable_cores()
    assert check_threads(None) is None and check_threads(cores) is None
    assert check_threads(cores + 1).startswith("# warning: --threads")
    with pytest.raises(DFlash2Error, match="more than this machine can run"):
        check_threads(MAX_OVERSUBSCRIPTION * cores + 1)


def test_a_busy_machine_warns_a_measurement_with_several_threads():
    from dflash2.runtime.machine import busy_warning, usable_cores

    cores = usable_cores()
    assert busy_warning(1, load=10.0 * cores) is None                 # one thread waits on no other
    assert busy_warning(2, load=0.0) is None                          # a quiet machine
    warning = busy_warning(2, load=float(cores))
    assert warning.startswith("# warning: this machine is busy") and "--threads 1" in warning


@pytest.mark.parametrize("argv", [
    ("yardstick", "--draft", "draft", "--data", "data", "--table", "{disk}/table.md"),
    ("bench", "--tiny", "--num-prompts", "1", "--output", "{disk}/bench"),
    ("init-draft", "--target", "target", "--out", "{disk}/draft"),
], ids=["yardstick --table", "bench --output", "init-draft --out"])
def test_an_unwritable_output_is_refused_before_any_work(argv, work, mounted, capsys, monkeypatch):
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model started loading before the unwritable output was refused")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr("dflash2.pipeline.tiny_pipeline", refuse)
    disk = mounted("readonly", "ro,size=64k")
    line = one_line(capsys, [part.format(disk=disk) for part in argv])
    assert "is not writable" in line and str(disk) in line, line

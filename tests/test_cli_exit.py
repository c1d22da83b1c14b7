"""`dflash2 generate`, run as the program, ends its process as soon as its output is out, without
the interpreter's teardown (1.2-1.7 s after a model has run); its output arrives whole, piped, and
its exit status is kept. Called as a function, `main` only returns."""
from __future__ import annotations

import subprocess
import sys

from dflash2.cli import main
from matrix_util import write_target

PROGRAM = """import atexit, sys
atexit.register(lambda: sys.stderr.write("teardown ran\\n"))
from dflash2.cli import main
sys.argv = ["dflash2", *sys.argv[1:]]
sys.exit(main())
"""


def _program(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROGRAM, *argv], capture_output=True, text=True, timeout=300)


def test_generate_exits_at_once_with_its_output_whole(tmp_path):
    write_target(tmp_path / "target")
    done = _program("generate", "--target", str(tmp_path / "target"), "--no-draft", "--prompt", "abc",
                    "--max-new-tokens", "4", "--json")
    assert done.returncode == 0, done.stderr
    assert "teardown ran" not in done.stderr
    assert done.stdout.rstrip().endswith("}") and '"new_tokens": 4' in done.stdout   # the report, flushed whole


def test_a_bad_option_keeps_its_status_and_message():
    done = _program("generate", "--prompt", "hi", "--max-new-tokens", "0")
    assert done.returncode == 2 and done.stderr.startswith("error: ") and "teardown ran" not in done.stderr


def test_other_commands_and_main_called_with_a_list_end_normally(tmp_path, capsys):
    done = _program("convert-target", "no-such-target")
    assert done.returncode == 2 and "teardown ran" in done.stderr
    assert main(["generate", "--prompt", "hi", "--max-new-tokens", "0"]) == 2    # returns: the caller goes on
    assert capsys.readouterr().err.startswith("error: ")

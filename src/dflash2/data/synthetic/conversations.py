"""Synthetic code and math user prompts: a seeded, offline training prompt source.

Contract:
- `iter_synthetic_conversations(count=6000, seed=0)` yields `count` single-turn
  `Conversation("synthetic", id, [text])`. Exactly 9 of every 20 are math (grade-school word problems,
  id "math-word-NNNNN", and short competition-style problems, "math-comp-NNNNN", from the 71
  templates of `math*.py`, followed by one of several instructions or none); the rest are
  programming requests ("code-<style>-NNNNN", from `code.py`: Python functions, doctest
  stubs, tasks with assertions, explain / fix-the-bug / write-tests / translate requests, and
  JavaScript, C++, SQL, shell and class or file-handling tasks). NNNNN is the prompt's position,
  so ids are unique.
- Deterministic: prompt i depends only on (seed, i), through its own `random.Random`, so the same
  (count, seed) always gives the same prompts and a smaller count gives a prefix of a larger one.
- Pure standard library: no network, no file reads; 6000 prompts take well under two seconds.
- Every sentence, task and reference solution is written in this file and in `math*.py`,
  `code.py`, `specs.py` and `tasks*.py` (145 Python tasks with
  reference solutions, plus JavaScript, C++, SQL, shell and design tasks); no text is copied from
  any benchmark or data set.
  Numbers are drawn so that answers are sensible (whole numbers where a word problem expects them);
  example outputs and assertions shown in code prompts are computed by running the reference code.
- The "synthetic" training source in `prompts.TRAINING_SOURCES` uses the defaults;
  `training_prompts` deduplicates them and drops any that overlaps a benchmark.
"""
from __future__ import annotations

import random
from typing import Any, Iterator

from dflash2.data.synthetic import math as synthetic_math, math_more as synthetic_math_more
from dflash2.data.conversation import Conversation
from dflash2.data.synthetic.code import render_code
from dflash2.errors import DFlash2Error

INSTRUCTIONS = ("Show your reasoning step by step.", "Explain each step, then state the final answer.",
                "Work it out step by step and give the final answer at the end.", "Please show your work.",
                "Walk me through the solution.", "Solve it and explain how you got the answer.",
                "Think it through carefully, then give the answer.", "Give a short explanation and the answer.",
                "Show the calculation and box the final answer.", "Explain your method clearly.",
                "Reason step by step, then write the final answer on its own line.",
                "I'd like to understand the method, not just the answer.",
                "Reason step by step and put your final answer in \\boxed{}.",
                "Reason it out and write the final answer after \"Answer:\".", "", "", "")
PREFIXES = ("", "", "", "", "", "Quick question: ", "Can you help me with this problem? ", "Homework help: ",
            "Here's one from my practice sheet. ", "Try this one: ", "Math problem: ")
MATH: list[tuple[str, synthetic_math.Template]] = synthetic_math.TEMPLATES + synthetic_math_more.TEMPLATES
MATH_TEMPLATES = tuple(fn.__name__ for _, fn in MATH)


def _math_prompt(r: random.Random) -> tuple[str, str, str]:
    group, template = r.choice(MATH)
    text = r.choice(PREFIXES) + template(r)
    instruction = r.choice(INSTRUCTIONS)
    if instruction:
        text += r.choice(("\n", " ")) + instruction
    return group, text, template.__name__


def _is_math(index: int) -> bool:
    """Exactly 9 of every 20 consecutive positions are math (45%), spread evenly."""
    return (index + 1) * 9 // 20 > index * 9 // 20


def iter_synthetic_items(count: int = 6000, seed: int = 0) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(id, prompt text, meta) for each synthetic prompt; meta names the template or task (for tests)."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise DFlash2Error(f"count must be a non-negative integer, got {count!r}")
    for index in range(count):
        r = random.Random(f"dflash2-synthetic:{seed}:{index}")
        if _is_math(index):
            group, text, template = _math_prompt(r)
            yield f"math-{group}-{index:05d}", text, {"kind": "math", "template": template}
        else:
            style, text, meta = render_code(r)
            yield f"code-{style}-{index:05d}", text, {"kind": "code", **meta}


def iter_synthetic_conversations(count: int = 6000, seed: int = 0) -> Iterator[Conversation]:
    """`count` seeded single-turn code and math prompts (see the module docstring)."""
    for prompt_id, text, _ in iter_synthetic_items(count, seed):
        yield Conversation("synthetic", prompt_id, [text])

"""Programming prompts for the synthetic training source (see `synthetic.py` for the contract).

`render_code(rng)` returns (style, text, meta) for one prompt. Python prompts come from the tasks in
`tasks*.py`, rendered as a plain request, a doctest stub to complete, a request with
assertions to pass, an explain-this-code request, a fix-the-bug request (the bug is a mutation of the
reference that changes its output on a shown input), a write-the-tests request or a translate /
refactor request. JavaScript, C++, SQL, shell and class/file design prompts complete the mix. Every
example value shown is computed by running the reference implementation.
"""
from __future__ import annotations

import json
import random
import re
import textwrap
from typing import Any, Callable

from dflash2.data.synthetic.specs import render_cpp_spec, render_design, render_js_spec, render_shell, render_sql
from dflash2.data.synthetic.tasks import TEXT_TASKS, Task, clone, compile_function
from dflash2.data.synthetic.tasks_num import NUMBER_TASKS

PY_TASKS: list[Task] = TEXT_TASKS + NUMBER_TASKS
Render = Callable[[random.Random], "tuple[str, dict[str, Any]]"]


def imperative(desc: str) -> str:
    """'returns the sum' -> 'return the sum' (the description's first verb, as an infinitive)."""
    verb, _, rest = desc.partition(" ")
    if verb.endswith("ies"):
        verb = verb[:-3] + "y"
    elif verb.endswith(("sses", "shes", "ches", "xes")):
        verb = verb[:-2]
    else:
        verb = verb[:-1]
    rest = re.sub(r"\b(and|then) (returns|leaves|strips|appends)\b", lambda m: f"{m[1]} {m[2][:-1]}", rest)
    return f"{verb} {rest}"


def rename_calls(desc: str, old: str, new: str) -> str:
    """`desc` with calls `old(` renamed (a bare word such as 'product' stays prose)."""
    return re.sub(rf"\b{re.escape(old)}(?=\()", new, desc)


def call_text(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def examples(r: random.Random, task: Task, count: int, fn: Callable | None = None,
             skip_none: bool = False) -> list[tuple[tuple, Any]]:
    """Up to `count` (args, reference output) pairs with distinct, short calls."""
    fn = fn or compile_function(task.key, task.source())
    found: dict[str, tuple[tuple, Any]] = {}
    for attempt in range(count * 6):
        args = task.gen(r)
        out = fn(*clone(args))
        text = call_text(task.key, args)
        short = len(text) + len(repr(out)) < 110 or (attempt == count * 6 - 1 and not found)
        if short and not (skip_none and out is None):
            found.setdefault(text, (args, out))
            if len(found) == count:
                break
    return list(found.values())


def _pick(r: random.Random) -> tuple[Task, str, str]:
    task = r.choice(PY_TASKS)
    name = r.choice(task.names)
    return task, name, rename_calls(task.desc, task.key, name)


def _param_words(params: str) -> str:
    names = [f"`{p.split('=')[0].strip()}`" for p in params.split(",")]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _fence(code: str, lang: str = "python") -> str:
    return f"```{lang}\n{code}```"


EXTRAS = ("Add type hints.", "Include a docstring.", "Don't use any imports.", "Keep it short and readable.",
          "Explain your approach briefly after the code.", "Handle empty input sensibly.",
          "Aim for linear time if you can.", "Add a few example calls at the bottom.", "Please avoid recursion.",
          "Mention the time complexity.", "Use descriptive variable names.", "No external libraries, please.")


def render_fn(r: random.Random) -> tuple[str, dict]:
    task, name, desc = _pick(r)
    sig, inf, pw = f"{name}({task.params})", imperative(desc), _param_words(task.params)
    text = r.choice((f"Write a Python function `{sig}` that {desc}.", f"Implement `{sig}` in Python. It {desc}.",
                     f"I need a Python helper `{sig}` which {desc}. Could you write it?",
                     f"Create a function called `{name}` that takes {pw} and {desc}.",
                     f"In Python, how would I write `{sig}`? It should {inf}.",
                     f"Please write `{name}` in Python: given {pw}, it {desc}.",
                     f"Can you code a Python function named `{name}`? It {desc}.",
                     f"Python question: write `{sig}`, which should {inf}."))
    if r.random() < 0.5:
        (args, out), = examples(r, task, 1)
        text += r.choice((f" For example, `{call_text(name, args)}` should return `{out!r}`.",
                          f" Example: `{call_text(name, args)}` gives `{out!r}`."))
    text += "".join(" " + e for e in r.sample(EXTRAS, r.choice((0, 0, 1, 1, 2))))
    return text, {"task": task.key, "name": name}


def render_stub(r: random.Random) -> tuple[str, dict]:
    task, name, desc = _pick(r)
    summary = imperative(desc).replace("`", "")
    doc = textwrap.fill(summary[0].upper() + summary[1:] + ".", 84, initial_indent="    \"\"\"",
                        subsequent_indent="    ")
    shown = examples(r, task, r.randint(1, 2), skip_none=True)
    tests = "".join(f"    >>> {call_text(name, args)}\n    {out!r}\n" for args, out in shown)
    stub = f"def {name}({task.params}):\n{doc}\n\n{tests}    \"\"\"\n"
    lead = r.choice(("Complete this Python function.", "Fill in the body of the function below so that its "
                     "doctests pass.", "Implement the function below.", "Finish writing this function:",
                     "Here is a stub with a docstring; write the implementation.", "Write the missing code:"))
    return f"{lead}\n{_fence(stub)}", {"task": task.key, "name": name,
                                       "doctests": [(call_text(name, a), repr(o)) for a, o in shown]}


def render_assert(r: random.Random) -> tuple[str, dict]:
    task, name, desc = _pick(r)
    lead = r.choice((f"Write a function that {desc}.", f"Write a Python function to {imperative(desc)}.",
                     f"Create a Python function that {desc}.", f"Write a function to {imperative(desc)}.",
                     f"Implement a function that {desc}."))
    shown = examples(r, task, r.choice((1, 1, 2, 3)))
    asserts = [f"assert {call_text(name, args)} == {out!r}" for args, out in shown]
    many = len(asserts) > 1
    phrase = r.choice(("Your code should pass these tests:" if many else "Your code should pass this test:",
                       "It must pass:", "Make sure this holds:" if not many else "Make sure these hold:",
                       "Your solution should satisfy:", "The following must pass:"))
    sep = "\n" if many or r.random() < 0.5 else " "
    return f"{lead} {phrase}{sep}" + "\n".join(asserts), {"task": task.key, "name": name, "asserts": asserts}


def render_explain(r: random.Random) -> tuple[str, dict]:
    task, name, _ = _pick(r)
    lead = r.choice(("Explain what this Python function does:", "What does the following code do? Explain it "
                     "line by line.", "Can you explain this function to a beginner?", "Describe the purpose of "
                     "this function and walk through how it works.", "I found this in our codebase. What does it "
                     "do, and are there inputs where it misbehaves?", "Summarise what this code computes and "
                     "state its time complexity.", "Add comments to this function explaining each step."))
    text = f"{lead}\n{_fence(task.source(name))}"
    if r.random() < 0.5:
        (args, _), = examples(r, task, 1)
        text += r.choice((f"\nWhat does `{call_text(name, args)}` return?", f"\nTrace it for `{call_text(name, args)}`."))
    return text, {"task": task.key, "name": name}


MUTATIONS = ((" <= ", " < "), (" < ", " <= "), (" >= ", " > "), (" > ", " >= "), (" == ", " != "),
             (" != ", " == "), (r" \+ 1\b", ""), (r" - 1\b", ""), (r"\bmin\(", "max("), (r"\bmax\(", "min("),
             (r"reverse=True", "reverse=False"), (r"\band\b", "or"), (r"\bor\b", "and"), (r"\[1:\]", "[2:]"),
             (r"\[::-1\]", ""), (r"\.lower\(\)", ".upper()"), (r"return True", "return False"),
             (r"return False", "return True"), (r"\+= ", "-= "), (r"\*= ", "+= "), (r"range\(1, ", "range(2, "),
             (r"\.append\(", ".insert(0, "), (r"% 2 == 0", "% 2 == 1"), (r"\[0\]", "[-1]"))
_SITES: list[tuple[Task, str]] = []


def bug_sites() -> list[tuple[Task, str]]:
    """(task, mutated body) for every single-site mutation of a loop-safe reference (no `while`)."""
    if not _SITES:
        for task in PY_TASKS:
            if "while" in task.body:
                continue
            for pattern, repl in MUTATIONS:
                for m in re.finditer(pattern, task.body):
                    line = task.body[task.body.rfind("\n", 0, m.start()) + 1:m.start()].lstrip()
                    if not line.startswith(("import", "from")):
                        _SITES.append((task, task.body[:m.start()] + repl + task.body[m.end():]))
    return _SITES


def _witness(r: random.Random, task: Task, body: str) -> tuple[tuple, Any, Any] | None:
    """(args, good, bad): an input where the mutated body's output differs from the reference's."""
    good_fn, bad_fn = compile_function(task.key, task.source()), compile_function(task.key, task.source(body=body))
    for _ in range(12):
        args = task.gen(r)
        good = good_fn(*clone(args))
        try:
            bad = bad_fn(*clone(args))
        except Exception:  # the mutation crashes here; look for an input where it answers wrongly
            continue
        if repr(bad) != repr(good) and len(call_text(task.key, args)) < 80:
            return args, good, bad
    return None


def render_bug(r: random.Random) -> tuple[str, dict]:
    for _ in range(50):
        task, body = r.choice(bug_sites())
        found = _witness(r, task, body)
        if found:
            break
    else:  # not reached in practice: most mutations are caught within a few inputs
        return render_explain(r)
    args, good, bad = found
    name = r.choice(task.names)
    inf, code, call = imperative(rename_calls(task.desc, task.key, name)), task.source(name, body), call_text(name, args)
    text = r.choice((f"This function should {inf}, but it has a bug. Find and fix it.\n{_fence(code)}",
                     f"Find and fix the bug in this function. It is meant to {inf}.\n{_fence(code)}",
                     f"My `{name}` function gives wrong answers: `{call}` returns `{bad!r}` but it should return "
                     f"`{good!r}`. What's wrong, and how do I fix it?\n{_fence(code)}",
                     f"There's a bug in the code below (it is supposed to {inf}). Explain the bug and give a "
                     f"corrected version.\n{_fence(code)}",
                     f"Debug this Python function. I expected `{call}` to be `{good!r}`, but got `{bad!r}`.\n"
                     f"{_fence(code)}"))
    text += r.choice(("", "", "", "\nPlease explain what was wrong.", "\nShow the corrected function.",
                      "\nAlso suggest a test that would have caught it."))
    return text, {"task": task.key, "name": name, "buggy": code, "args": args, "good": good, "bad": bad}


def render_unittest(r: random.Random) -> tuple[str, dict]:
    task, name, desc = _pick(r)
    sig, edge = f"{name}({task.params})", r.choice(("empty input", "a single element", "large values",
                                                    "invalid arguments", "boundary values"))
    text = r.choice((f"Write pytest unit tests for the following function. Cover typical cases and edge cases."
                     f"\n{_fence(task.source(name))}",
                     f"Write a set of unittest test cases for a function `{sig}` that {desc}.",
                     f"Give me thorough pytest tests for `{sig}`, a function that {desc}. Include at least one "
                     f"test for {edge}.",
                     f"I wrote `{name}` to {imperative(desc)}. Suggest test cases, with expected results, that "
                     f"would catch common mistakes.",
                     f"Write property-based tests with Hypothesis for this function:\n{_fence(task.source(name))}"))
    text += r.choice(("", "", "", "\nUse pytest.mark.parametrize where it fits.", "\nAim for full branch coverage.",
                      "\nKeep each test focused on one behaviour.", "\nGive the tests descriptive names."))
    return text, {"task": task.key, "name": name}


def render_translate(r: random.Random) -> tuple[str, dict]:
    task, name, _ = _pick(r)
    code, lang = _fence(task.source(name)), r.choice(("JavaScript", "TypeScript", "C++", "Java", "Go", "Rust", "C#"))
    text = r.choice((f"Translate this Python function into {lang}:\n{code}",
                     f"Rewrite the following Python code in idiomatic {lang}, keeping the same behaviour.\n{code}",
                     f"How would this function look in {lang}?\n{code}",
                     f"Refactor this function to make it more readable and Pythonic without changing what it "
                     f"returns.\n{code}",
                     f"Can this be made faster or simpler? Suggest an improved version and explain the "
                     f"complexity.\n{code}"))
    return text, {"task": task.key, "name": name}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _js_desc(desc: str) -> str:
    desc = re.sub(r"`(\w+)`", lambda m: f"`{_camel(m.group(1))}`", desc)
    for old, new in (("None", "null"), ("a dictionary", "an object"), ("dictionaries", "objects"),
                     ("dictionary", "object"), ("a list", "an array"), ("list", "array"), ("a tuple", "an array")):
        desc = desc.replace(old, new)
    return desc


def render_js(r: random.Random) -> tuple[str, dict]:
    if r.random() < 0.4:
        return render_js_spec(r), {}
    task, name, desc = _pick(r)
    params = ", ".join(_camel(p.split("=")[0].strip()) for p in task.params.split(","))
    fname = _camel(name)
    text = f"Write a JavaScript function `{fname}({params})` that {_js_desc(rename_calls(desc, name, fname))}."
    (args, out), = examples(r, task, 1)
    try:
        shown = f"`{fname}({', '.join(json.dumps(a) for a in args)})` should return `{json.dumps(out)}`"
        text += r.choice((f" For instance, {shown}.", f" Example: {shown}.", ""))
    except TypeError:
        pass
    text += r.choice(("", "", " Use modern ES syntax.", " Add JSDoc comments.", " Don't use any libraries."))
    return text, {"task": task.key, "name": fname}


def render_cpp(r: random.Random) -> tuple[str, dict]:
    task, name, desc = _pick(r)
    if r.random() < 0.45 or re.search(r"None|dictionar|tuple|dict", desc):
        return render_cpp_spec(r), {}
    desc = desc.replace("a list", "a std::vector").replace("list", "vector")
    text = r.choice((f"Write a C++ function `{name}` that {desc}. Use the standard library where it helps.",
                     f"In modern C++ (C++17), implement `{name}`, which {desc}. Include a small main() that "
                     f"demonstrates it.", f"Write `{name}` in C++: it {desc}. Choose sensible parameter types."))
    return text, {"task": task.key, "name": name}


STYLES: tuple[tuple[str, int, Render], ...] = (
    ("fn", 17, render_fn), ("stub", 13, render_stub), ("assert", 16, render_assert),
    ("explain", 9, render_explain), ("bug", 9, render_bug), ("unittest", 6, render_unittest),
    ("translate", 5, render_translate), ("js", 7, render_js), ("cpp", 4, render_cpp),
    ("sql", 6, lambda r: (render_sql(r), {})), ("shell", 3, lambda r: (render_shell(r), {})),
    ("design", 5, lambda r: (render_design(r), {})))
_WEIGHTS = [w for _, w, _ in STYLES]


def render_code(r: random.Random) -> tuple[str, str, dict]:
    """(style, prompt text, meta) for one programming prompt drawn with `r`."""
    style, _, render = r.choices(STYLES, weights=_WEIGHTS)[0]
    text, meta = render(r)
    return style, text, {"style": style, **meta}

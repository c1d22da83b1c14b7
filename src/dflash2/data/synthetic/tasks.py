"""Python programming tasks for the synthetic prompts: a description, a reference solution and an
input generator each.

Every `Task` here was written for this project. `desc` completes "a function that ..." and starts
with a third-person verb ("returns", "checks", ...); `body` is the reference implementation's body,
whose function is named `key` (recursive calls included); `gen(rng)` draws a tuple of valid
arguments. `run_reference` executes the reference, so the examples and assertions the prompts show
are computed, never typed by hand. This file holds the helpers and the string, list and
dictionary tasks (`TEXT_TASKS`); `tasks_num.py` holds the number, date, parsing and
algorithm tasks.
"""
from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import Any, Callable

WORDS = ("apple river stone cloud tiger paper lemon garden window rocket silver music forest candle "
         "planet button coffee yellow bridge dragon mirror pencil summer winter orange castle magnet "
         "island violin jacket shadow spider basket thunder marble rabbit cherry ladder meadow copper "
         "falcon harbor kettle lantern needle pepper puzzle saddle tunnel velvet walnut zebra anchor "
         "banana cactus dolphin engine feather glacier hammer igloo jungle kayak noodle otter parrot").split()
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _word(r: random.Random) -> str:
    return r.choice(WORDS)


def _words(r: random.Random, lo: int = 2, hi: int = 5) -> list[str]:
    return [r.choice(WORDS) for _ in range(r.randint(lo, hi))]


def _sent(r: random.Random, lo: int = 3, hi: int = 6) -> str:
    return " ".join(_words(r, lo, hi))


def _mixcase(r: random.Random, text: str) -> str:
    return "".join(ch.upper() if r.random() < 0.3 else ch for ch in text)


def _ints(r: random.Random, lo: int = -9, hi: int = 30, n_lo: int = 4, n_hi: int = 8) -> list[int]:
    return [r.randint(lo, hi) for _ in range(r.randint(n_lo, n_hi))]


def _letters(r: random.Random, pool: str, lo: int, hi: int) -> str:
    return "".join(r.choice(pool) for _ in range(r.randint(lo, hi)))


def _date(r: random.Random) -> str:
    return f"{r.randint(1990, 2030)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"


def _roman(n: int) -> str:
    out = ""
    for value, letters in ((1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
                           (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")):
        while n >= value:
            out, n = out + letters, n - value
    return out


def _brackets(r: random.Random) -> str:
    out, stack = "", []
    for _ in range(r.randint(2, 8)):
        if stack and r.random() < 0.45:
            out += {"(": ")", "[": "]", "{": "}"}[stack.pop()]
        else:
            stack.append(r.choice("([{"))
            out += stack[-1]
    out += "".join({"(": ")", "[": "]", "{": "}"}[c] for c in reversed(stack))
    if r.random() < 0.4:  # break it
        i = r.randrange(len(out))
        out = out[:i] + r.choice(")]}([") + out[i + 1:]
    return out


def _nested(r: random.Random, depth: int = 0) -> list:
    return [_nested(r, depth + 1) if depth < 2 and r.random() < 0.3 else r.randint(0, 9)
            for _ in range(r.randint(1 if depth else 2, 3))]


def _email(r: random.Random) -> str:
    name, host = _word(r), _word(r)
    return r.choice((f"{name}@{host}.com", f"{name}.{_word(r)}@{host}.org", f"{name}_{r.randint(1, 99)}@{host}.io",
                     f"{name}@{host}", f"{name}@@{host}.com", f"{name} @{host}.net", f"@{host}.com"))


def _ip(r: random.Random) -> str:
    parts = [str(r.randint(0, 255)) for _ in range(4)]
    kind = r.randint(0, 4)
    if kind == 1:
        parts[r.randrange(4)] = str(r.randint(256, 999))
    elif kind == 2:
        parts = parts[:3]
    elif kind == 3:
        parts[r.randrange(4)] = "0" + str(r.randint(1, 9))
    return ".".join(parts)


@dataclass(frozen=True)
class Task:
    key: str
    params: str
    desc: str
    body: str
    gen: Callable[[random.Random], tuple]
    names: tuple[str, ...]

    def source(self, name: str | None = None, body: str | None = None) -> str:
        """The reference (or `body`) as a `def`, renamed to `name`."""
        return _source(self.key, self.params, body or self.body, name or self.key)


@functools.lru_cache(maxsize=4096)
def _source(key: str, params: str, body: str, name: str) -> str:
    text = f"def {key}({params}):\n" + "".join(f"    {line}\n" for line in body.split("\n"))
    return rename(text, key, name)


@functools.lru_cache(maxsize=512)
def _word_pattern(word: str) -> re.Pattern:
    return re.compile(rf"\b{re.escape(word)}\b")


def rename(text: str, old: str, new: str) -> str:
    """`text` with the whole word `old` replaced by `new`."""
    return text if old == new else _word_pattern(old).sub(new, text)


def clone(value: Any) -> Any:
    """A deep copy of nested lists, dicts and tuples (the only containers task arguments use)."""
    if isinstance(value, list):
        return [clone(v) for v in value]
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(clone(v) for v in value)
    return value


_COMPILED: dict[str, Callable] = {}


def compile_function(key: str, source: str) -> Callable:
    """The function `key` defined by `source` (cached by source text)."""
    if source not in _COMPILED:
        namespace: dict[str, Any] = {}
        exec(compile(source, f"<synthetic {key}>", "exec"), namespace)
        _COMPILED[source] = namespace[key]
    return _COMPILED[source]


def run_reference(task: Task, args: tuple) -> Any:
    return compile_function(task.key, task.source())(*clone(args))


def adder(target: list[Task]) -> Callable[..., None]:
    """A function that appends a Task(key, params, desc, body, gen, (key, *alternative names))."""
    def add(key: str, params: str, desc: str, body: str, gen: Callable, *names: str) -> None:
        target.append(Task(key, params, desc, body, gen, (key, *names)))
    return add


TEXT_TASKS: list[Task] = []  # strings, lists and dictionaries
_t = adder(TEXT_TASKS)
# ----------------------------------------------------------------- strings
_t("count_vowels", "s", "returns how many vowels (a, e, i, o, u, in either case) appear in the string `s`",
   "return sum(1 for ch in s.lower() if ch in 'aeiou')", lambda r: (_mixcase(r, _sent(r)),), "vowel_count", "num_vowels")
_t("reverse_words", "sentence", "returns the words of `sentence` in reverse order, separated by single spaces",
   "return ' '.join(reversed(sentence.split()))", lambda r: (_sent(r),), "flip_words", "words_backwards")
_t("is_palindrome", "text", "checks whether `text` reads the same forwards and backwards, ignoring case and every "
   "character that is not a letter or digit", "cleaned = [ch.lower() for ch in text if ch.isalnum()]\n"
   "return cleaned == cleaned[::-1]", lambda r: (r.choice((lambda w: w + ", " + w[::-1].title(), lambda w: w + " "
   + _word(r)))(_word(r)),), "is_pal", "reads_same_both_ways")
_t("capitalize_words", "sentence", "returns `sentence` with the first letter of every word upper-cased and the rest "
   "of each word unchanged", "return ' '.join(w[:1].upper() + w[1:] for w in sentence.split(' '))",
   lambda r: (_mixcase(r, _sent(r)).lower(),), "title_words")
_t("char_counts", "s", "returns a dictionary mapping each character of `s` other than spaces to the number of "
   "times it occurs", "counts = {}\nfor ch in s:\n    if ch != ' ':\n        counts[ch] = counts.get(ch, 0) + 1\n"
   "return counts", lambda r: (_sent(r, 1, 2),), "letter_frequency", "count_chars")
_t("longest_word", "sentence", "returns the longest word in `sentence`; when several words tie, the first one wins",
   "best = ''\nfor word in sentence.split():\n    if len(word) > len(best):\n        best = word\nreturn best",
   lambda r: (_sent(r),), "find_longest_word")
_t("unique_chars", "s", "returns `s` with repeated characters removed, keeping the first occurrence of each",
   "seen = ''\nfor ch in s:\n    if ch not in seen:\n        seen += ch\nreturn seen",
   lambda r: (_letters(r, "abcdeab", 4, 10),), "drop_repeats", "first_occurrences")
_t("run_length_encode", "s", "compresses `s` with run-length encoding, writing each run as the character followed "
   "by its count (so 'aaab' becomes 'a3b1')", "if not s:\n    return ''\nout = []\ncurrent, count = s[0], 1\n"
   "for ch in s[1:]:\n    if ch == current:\n        count += 1\n    else:\n        out.append(current + str(count))\n"
   "        current, count = ch, 1\nout.append(current + str(count))\nreturn ''.join(out)",
   lambda r: ("".join(r.choice("xyz") * r.randint(1, 4) for _ in range(r.randint(1, 4))),), "rle", "compress_runs")
_t("is_anagram", "a, b", "checks whether the strings `a` and `b` are anagrams of each other, ignoring spaces and "
   "letter case", "return sorted(a.replace(' ', '').lower()) == sorted(b.replace(' ', '').lower())",
   lambda r: (lambda w: (w, r.choice(("".join(r.sample(w, len(w))).upper(), _word(r)))))(_word(r)), "are_anagrams")
_t("caesar_shift", "text, k", "shifts every lowercase letter of `text` forward by `k` places in the alphabet, "
   "wrapping around from 'z' to 'a', and leaves other characters unchanged", "out = ''\nfor ch in text:\n"
   "    if 'a' <= ch <= 'z':\n        out += chr((ord(ch) - ord('a') + k) % 26 + ord('a'))\n    else:\n"
   "        out += ch\nreturn out", lambda r: (_sent(r, 1, 3), r.randint(1, 25)), "caesar", "rotate_letters")
_t("word_counts", "text", "returns a dictionary that maps each word of `text`, lower-cased, to how many times it "
   "occurs", "counts = {}\nfor word in text.lower().split():\n    counts[word] = counts.get(word, 0) + 1\n"
   "return counts", lambda r: (" ".join(_mixcase(r, r.choice(("red", "blue", "green"))) for _ in range(r.randint(3, 7))),),
   "count_words", "word_frequencies")
_t("snake_to_camel", "name", "converts a snake_case identifier such as 'max_item_count' to camelCase "
   "('maxItemCount')", "parts = name.split('_')\nreturn parts[0] + ''.join(p.title() for p in parts[1:])",
   lambda r: ("_".join(_words(r, 2, 4)),), "to_camel_case")
_t("camel_to_snake", "name", "converts a camelCase identifier to snake_case, for example 'parseHttpHeader' to "
   "'parse_http_header'", "out = ''\nfor ch in name:\n    if ch.isupper():\n        out += '_' + ch.lower()\n"
   "    else:\n        out += ch\nreturn out.lstrip('_')",
   lambda r: ((lambda ws: ws[0] + "".join(w.title() for w in ws[1:]))(_words(r, 2, 4)),), "to_snake_case")
_t("first_repeated_char", "s", "returns the first character of `s` that has already appeared earlier in the "
   "string, or None if no character repeats", "seen = set()\nfor ch in s:\n    if ch in seen:\n        return ch\n"
   "    seen.add(ch)\nreturn None", lambda r: (_word(r),), "first_repeat")
_t("first_unique_index", "s", "returns the index of the first character of `s` that occurs exactly once, or -1 "
   "if there is none", "for i, ch in enumerate(s):\n    if s.count(ch) == 1:\n        return i\nreturn -1",
   lambda r: (_letters(r, "abcd", 3, 9),), "first_singleton")
_t("is_pangram", "sentence", "checks whether `sentence` uses every letter of the English alphabet at least once, "
   "ignoring case", "return set('abcdefghijklmnopqrstuvwxyz') <= set(sentence.lower())",
   lambda r: (r.choice((_sent(r, 4, 8), (lambda a: " ".join(a[i:i + 5] for i in range(0, 26, 5)))("".join(r.sample(LETTERS, 26))))),),
   "uses_every_letter")
_t("squeeze_spaces", "text", "collapses every run of whitespace in `text` into a single space and strips leading "
   "and trailing whitespace", "return ' '.join(text.split())",
   lambda r: ("".join(w + " " * r.randint(1, 3) for w in _words(r)),), "normalize_spaces")
_t("count_overlapping", "text, sub", "counts how many times `sub` occurs in `text`, counting overlapping matches",
   "count = 0\nfor i in range(len(text) - len(sub) + 1):\n    if text[i:i + len(sub)] == sub:\n        count += 1\n"
   "return count", lambda r: (_letters(r, "ab", 5, 12), r.choice(("aa", "ab", "aba", "bb", "bab"))), "count_occurrences")
_t("acronym", "phrase", "builds an acronym from the first letter of each word in `phrase`, in upper case",
   "return ''.join(word[0].upper() for word in phrase.split())", lambda r: (_sent(r, 2, 5),), "make_acronym", "initials")
_t("mask_secret", "s, visible", "replaces every character of `s` except the last `visible` ones with '*'",
   "hidden = max(len(s) - visible, 0)\nreturn '*' * hidden + s[hidden:]",
   lambda r: (_letters(r, "0123456789", 6, 14), r.randint(0, 4)), "mask", "hide_digits")
_t("alternate_case", "s", "returns `s` with characters at even indexes upper-cased and those at odd indexes "
   "lower-cased", "return ''.join(ch.upper() if i % 2 == 0 else ch.lower() for i, ch in enumerate(s))",
   lambda r: (_word(r),), "zigzag_case")
_t("replace_vowels", "s, symbol", "replaces every vowel in `s`, in either case, with the string `symbol`",
   "return ''.join(symbol if ch.lower() in 'aeiou' else ch for ch in s)",
   lambda r: (_mixcase(r, _sent(r, 1, 3)), r.choice("*#_-")), "censor_vowels")
_t("is_balanced", "s", "checks whether the brackets (), [] and {} in `s` are balanced and properly nested, "
   "ignoring every other character", "pairs = {')': '(', ']': '[', '}': '{'}\nstack = []\nfor ch in s:\n"
   "    if ch in '([{':\n        stack.append(ch)\n    elif ch in pairs:\n"
   "        if not stack or stack.pop() != pairs[ch]:\n            return False\nreturn not stack",
   lambda r: (_brackets(r),), "brackets_match", "valid_brackets")
_t("common_prefix", "words", "returns the longest prefix shared by all strings in the list `words` (an empty "
   "string for an empty list)", "if not words:\n    return ''\nprefix = words[0]\nfor word in words[1:]:\n"
   "    while not word.startswith(prefix):\n        prefix = prefix[:-1]\nreturn prefix",
   lambda r: ((lambda p: [p + _letters(r, "aeiou", 0, 3) for _ in range(r.randint(2, 4))])(_word(r)[:r.randint(1, 4)]),),
   "longest_common_prefix")
_t("word_lengths", "sentence", "returns a list with the length of each word in `sentence`",
   "return [len(word) for word in sentence.split()]", lambda r: (_sent(r),), "lengths_of_words")
_t("count_upper", "s", "counts the upper-case letters in `s`", "return sum(1 for ch in s if ch.isupper())",
   lambda r: (_mixcase(r, _sent(r, 2, 3)),), "num_capitals")
_t("reverse_each_word", "sentence", "reverses the letters of each word in `sentence` while keeping the words in "
   "their original order", "return ' '.join(word[::-1] for word in sentence.split())", lambda r: (_sent(r),),
   "mirror_words")
_t("remove_digits", "s", "returns `s` with all digit characters removed", "return ''.join(ch for ch in s if not "
   "ch.isdigit())", lambda r: (_letters(r, "abc123xyz9", 5, 10),), "strip_digits")
_t("sum_digit_chars", "text", "adds up every single digit character that appears in `text`",
   "return sum(int(ch) for ch in text if ch.isdigit())", lambda r: (_letters(r, "ab1c2d3 45", 5, 12),),
   "digit_total")
_t("pad_left", "s, width, fill", "pads the string `s` on the left with the character `fill` until it is at least "
   "`width` characters long", "return fill * max(width - len(s), 0) + s",
   lambda r: (str(r.randint(1, 9999)), r.randint(3, 8), r.choice("0*. ")), "left_pad")
_t("truncate", "text, limit", "shortens `text` to at most `limit` characters, ending it with '...' when it has to "
   "cut (`limit` is at least 3)", "if len(text) <= limit:\n    return text\nreturn text[:limit - 3] + '...'",
   lambda r: (_sent(r, 2, 4), r.randint(5, 24)), "shorten", "ellipsize")
_t("has_unique_chars", "s", "checks whether every character in `s` appears only once",
   "return len(set(s)) == len(s)", lambda r: (r.choice((_word(r), "".join(r.sample(LETTERS, r.randint(3, 7))))),),
   "all_distinct_chars")
_t("rotate_string", "s, k", "rotates the string `s` to the left by `k` positions, moving characters from the "
   "front to the end (`k` may exceed the length)", "if not s:\n    return s\nk %= len(s)\nreturn s[k:] + s[:k]",
   lambda r: (_word(r), r.randint(0, 12)), "rotate_left")
_t("interleave", "a, b", "merges two strings by alternating their characters, starting with `a`, then appends "
   "whatever is left of the longer one", "out = []\nfor i in range(max(len(a), len(b))):\n    if i < len(a):\n"
   "        out.append(a[i])\n    if i < len(b):\n        out.append(b[i])\nreturn ''.join(out)",
   lambda r: (_word(r)[:r.randint(2, 6)], _word(r)[:r.randint(2, 6)]), "zip_strings")
_t("count_consonants", "word", "counts the letters of `word` that are not vowels",
   "return sum(1 for ch in word.lower() if ch.isalpha() and ch not in 'aeiou')",
   lambda r: (_mixcase(r, _word(r)),), "consonant_count")
_t("is_rotation", "a, b", "checks whether string `b` can be obtained by rotating string `a`",
   "return len(a) == len(b) and b in a + a",
   lambda r: (lambda w, k: (w, r.choice((w[k:] + w[:k], _word(r)))))(_word(r), r.randint(0, 5)), "is_rotated")
# ----------------------------------------------------------------- lists
_t("second_largest", "nums", "returns the second largest distinct value in the list `nums`, or None if it has "
   "fewer than two distinct values", "values = sorted(set(nums), reverse=True)\n"
   "return values[1] if len(values) > 1 else None", lambda r: (_ints(r, 0, 20, 1, 7),), "runner_up")
_t("running_total", "nums", "returns the running totals of `nums`, where element i is the sum of the first "
   "i + 1 elements", "totals = []\ncurrent = 0\nfor x in nums:\n    current += x\n    totals.append(current)\n"
   "return totals", lambda r: (_ints(r),), "cumulative_sum", "prefix_sums")
_t("chunk", "items, size", "splits the list `items` into consecutive chunks of length `size`; the last chunk may "
   "be shorter", "return [items[i:i + size] for i in range(0, len(items), size)]",
   lambda r: (_ints(r, 0, 9, 3, 9), r.randint(1, 4)), "split_into_chunks", "batched")
_t("flatten", "nested", "flattens an arbitrarily nested list of integers into a single list, keeping the "
   "left-to-right order", "flat = []\nfor item in nested:\n    if isinstance(item, list):\n"
   "        flat.extend(flatten(item))\n    else:\n        flat.append(item)\nreturn flat",
   lambda r: (_nested(r),), "deep_flatten", "flatten_list")
_t("rotate_right", "items, k", "rotates the list `items` to the right by `k` positions",
   "if not items:\n    return []\nk %= len(items)\nreturn items[-k:] + items[:-k]",
   lambda r: (_ints(r, 0, 9, 0, 6), r.randint(0, 8)), "rotate_list")
_t("dedupe", "items", "removes duplicates from the list `items` while keeping the first occurrence of each element "
   "in its original order", "seen = set()\nresult = []\nfor item in items:\n    if item not in seen:\n"
   "        seen.add(item)\n        result.append(item)\nreturn result",
   lambda r: (_ints(r, 0, 6, 3, 9),), "unique_in_order", "remove_duplicates")
_t("differences", "nums", "returns the differences between consecutive elements of `nums` (each element minus the "
   "one before it)", "return [b - a for a, b in zip(nums, nums[1:])]", lambda r: (_ints(r),), "consecutive_diffs")
_t("max_subarray_sum", "nums", "returns the largest sum of any non-empty contiguous slice of `nums`",
   "best = current = nums[0]\nfor x in nums[1:]:\n    current = max(x, current + x)\n    best = max(best, current)\n"
   "return best", lambda r: (_ints(r, -8, 8),), "best_slice_sum", "kadane")
_t("move_zeros", "nums", "moves every zero in `nums` to the end while keeping the order of the other elements, "
   "returning a new list", "rest = [x for x in nums if x != 0]\nreturn rest + [0] * (len(nums) - len(rest))",
   lambda r: (_ints(r, 0, 4),), "zeros_to_end")
_t("count_evens", "nums", "counts the even numbers in `nums`", "return sum(1 for x in nums if x % 2 == 0)",
   lambda r: (_ints(r),), "num_even")
_t("product", "nums", "returns the product of all numbers in `nums` (1 for an empty list)",
   "result = 1\nfor x in nums:\n    result *= x\nreturn result", lambda r: (_ints(r, -4, 9, 0, 5),), "multiply_all")
_t("missing_number", "nums", "finds the one number missing from `nums`, a list that holds every integer from 0 to "
   "n except one, in any order", "n = len(nums)\nreturn n * (n + 1) // 2 - sum(nums)",
   lambda r: (lambda n, k: (r.sample([i for i in range(n + 1) if i != k], n),))(*(lambda n: (n, r.randint(0, n)))(r.randint(3, 9))),
   "find_missing")
_t("merge_sorted", "a, b", "merges two sorted lists `a` and `b` into one sorted list without calling sort",
   "i = j = 0\nmerged = []\nwhile i < len(a) and j < len(b):\n    if a[i] <= b[j]:\n        merged.append(a[i])\n"
   "        i += 1\n    else:\n        merged.append(b[j])\n        j += 1\nreturn merged + a[i:] + b[j:]",
   lambda r: (sorted(_ints(r, 0, 20, 1, 5)), sorted(_ints(r, 0, 20, 1, 5))), "merge_two_sorted")
_t("common_elements", "a, b", "returns the sorted list of distinct values that appear in both `a` and `b`",
   "return sorted(set(a) & set(b))", lambda r: (_ints(r, 0, 9), _ints(r, 0, 9)), "shared_values", "intersection")
_t("value_range", "nums", "returns the difference between the largest and the smallest value in `nums`",
   "return max(nums) - min(nums)", lambda r: (_ints(r),), "spread")
_t("two_sum", "nums, target", "returns the indices (i, j), i < j, of the first pair in `nums` whose values add up to "
   "`target`, scanning i and then j from the left, or None if no pair does", "for i in range(len(nums)):\n"
   "    for j in range(i + 1, len(nums)):\n        if nums[i] + nums[j] == target:\n            return (i, j)\n"
   "return None", lambda r: (lambda xs: (xs, r.choice(xs) + r.choice(xs)))(_ints(r, 0, 12)), "pair_with_sum")
_t("count_pairs_with_sum", "nums, target", "counts the pairs of positions i < j in `nums` whose values add up to "
   "`target`", "count = 0\nfor i in range(len(nums)):\n    for j in range(i + 1, len(nums)):\n"
   "        if nums[i] + nums[j] == target:\n            count += 1\nreturn count",
   lambda r: (_ints(r, 0, 6), r.randint(2, 10)), "pairs_summing_to")
_t("moving_average", "nums, k", "returns the average of every window of `k` consecutive values in `nums`, each "
   "rounded to two decimals", "return [round(sum(nums[i:i + k]) / k, 2) for i in range(len(nums) - k + 1)]",
   lambda r: (_ints(r, 0, 20), r.randint(2, 3)), "window_means")
_t("split_even_odd", "nums", "splits `nums` into a tuple of two lists, the even numbers and then the odd numbers, "
   "each in their original order", "evens = [x for x in nums if x % 2 == 0]\nodds = [x for x in nums if x % 2 != 0]\n"
   "return evens, odds", lambda r: (_ints(r, 0, 20),), "partition_parity")
_t("argmax", "nums", "returns the index of the largest value in `nums` (the first such index on ties)",
   "best = 0\nfor i in range(1, len(nums)):\n    if nums[i] > nums[best]:\n        best = i\nreturn best",
   lambda r: (_ints(r, 0, 9),), "index_of_max")
_t("is_sorted", "nums", "checks whether `nums` is sorted in non-decreasing order",
   "return all(a <= b for a, b in zip(nums, nums[1:]))",
   lambda r: (r.choice((sorted(_ints(r, 0, 9)), _ints(r, 0, 9))),), "is_ascending")
_t("count_above", "nums, threshold", "counts how many values in `nums` are strictly greater than `threshold`",
   "return sum(1 for x in nums if x > threshold)", lambda r: (_ints(r, 0, 20), r.randint(0, 20)), "num_greater_than")
_t("prefix_max", "nums", "returns a list whose element i is the largest of the first i + 1 elements of `nums`",
   "out = []\nfor x in nums:\n    out.append(x if not out else max(out[-1], x))\nreturn out",
   lambda r: (_ints(r),), "running_max")
_t("transpose", "matrix", "returns the transpose of a rectangular matrix given as a list of rows",
   "return [list(row) for row in zip(*matrix)]",
   lambda r: ((lambda c: [_ints(r, 0, 9, c, c) for _ in range(r.randint(1, 3))])(r.randint(1, 3)),), "flip_matrix")
_t("diagonal_sum", "matrix", "returns the sum of the main diagonal of a square matrix given as a list of rows",
   "return sum(matrix[i][i] for i in range(len(matrix)))",
   lambda r: ((lambda n: [_ints(r, 0, 9, n, n) for _ in range(n)])(r.randint(1, 3)),), "trace")
_t("sum_of_squares", "nums", "returns the sum of the squares of the numbers in `nums`",
   "return sum(x * x for x in nums)", lambda r: (_ints(r, -6, 9),), "square_sum")
_t("clamp_all", "nums, low, high", "returns a copy of `nums` in which values below `low` are raised to `low` and "
   "values above `high` are lowered to `high`", "return [min(max(x, low), high) for x in nums]",
   lambda r: (_ints(r, 0, 20), r.randint(0, 6), r.randint(10, 16)), "clip_values")
_t("longest_increasing_run", "nums", "returns the length of the longest run of consecutive elements of `nums` that "
   "strictly increase (0 for an empty list)", "if not nums:\n    return 0\nbest = current = 1\n"
   "for a, b in zip(nums, nums[1:]):\n    current = current + 1 if b > a else 1\n    best = max(best, current)\n"
   "return best", lambda r: (_ints(r, 0, 9, 0, 9),), "longest_rising_streak")
_t("majority_element", "nums", "returns the value that makes up more than half of `nums`, or None if no value does",
   "for x in nums:\n    if nums.count(x) * 2 > len(nums):\n        return x\nreturn None",
   lambda r: (_ints(r, 1, 3, 3, 7),), "majority")
_t("kth_smallest", "nums, k", "returns the k-th smallest value in `nums`, counting from 1",
   "return sorted(nums)[k - 1]", lambda r: (lambda xs: (xs, r.randint(1, len(xs))))(_ints(r)), "nth_smallest")
_t("sign_changes", "nums", "counts how often the sign flips between consecutive non-zero values of `nums`, "
   "skipping zeros", "signs = [x > 0 for x in nums if x != 0]\nreturn sum(1 for a, b in zip(signs, signs[1:]) if a != b)",
   lambda r: (_ints(r, -5, 5),), "count_sign_flips")
_t("every_nth", "items, n", "returns every n-th element of `items`, starting with the n-th one",
   "return items[n - 1::n]", lambda r: (_ints(r, 0, 9, 3, 9), r.randint(1, 3)), "take_every_nth")
_t("mode", "nums", "returns the most common value in `nums`, choosing the smallest value when several are equally "
   "common", "counts = {}\nfor x in nums:\n    counts[x] = counts.get(x, 0) + 1\n"
   "return min(counts, key=lambda x: (-counts[x], x))", lambda r: (_ints(r, 0, 5),), "most_common")
# ----------------------------------------------------------------- dictionaries
_t("invert_dict", "d", "swaps the keys and values of the dictionary `d`, whose values are all distinct",
   "return {value: key for key, value in d.items()}",
   lambda r: (dict(zip(r.sample(WORDS, 3), r.sample(range(1, 20), 3))),), "swap_keys_values")
_t("add_counts", "a, b", "merges two dictionaries of counts, adding up the values of keys that appear in both",
   "merged = dict(a)\nfor key, value in b.items():\n    merged[key] = merged.get(key, 0) + value\nreturn merged",
   lambda r: tuple({k: r.randint(1, 9) for k in r.sample(("x", "y", "z", "w"), r.randint(1, 3))} for _ in "ab"),
   "merge_counts", "combine_tallies")
_t("group_by_length", "words", "groups the strings in `words` by length, returning a dictionary from each length to "
   "the list of words of that length in their original order", "groups = {}\nfor word in words:\n"
   "    groups.setdefault(len(word), []).append(word)\nreturn groups", lambda r: (_words(r, 3, 5),), "bucket_by_length")
_t("top_k_words", "words, k", "returns the `k` most frequent strings in `words`, most frequent first, breaking ties "
   "alphabetically", "counts = {}\nfor w in words:\n    counts[w] = counts.get(w, 0) + 1\n"
   "return sorted(counts, key=lambda w: (-counts[w], w))[:k]",
   lambda r: ([r.choice(("cat", "dog", "owl", "bee")) for _ in range(r.randint(4, 8))], r.randint(1, 3)), "most_frequent")
_t("filter_by_value", "d, minimum", "returns a new dictionary with only the entries of `d` whose value is at least "
   "`minimum`", "return {k: v for k, v in d.items() if v >= minimum}",
   lambda r: ({w: r.randint(0, 20) for w in r.sample(WORDS, 4)}, r.randint(5, 15)), "keep_large_values")
_t("key_of_max", "d", "returns the key with the largest value in the non-empty dictionary `d` (the first such key "
   "in iteration order on ties)", "return max(d, key=d.get)",
   lambda r: ({w: r.randint(0, 9) for w in r.sample(WORDS, 3)},), "argmax_key")
_t("keys_by_value", "d", "returns the keys of `d` sorted by value from largest to smallest, breaking ties by key",
   "return sorted(d, key=lambda k: (-d[k], k))",
   lambda r: ({w: r.randint(0, 5) for w in r.sample(WORDS, 4)},), "rank_keys")
_t("deep_get", "data, path", "follows the list of keys `path` through nested dictionaries in `data` and returns the "
   "value found, or None when a key is missing", "current = data\nfor key in path:\n"
   "    if not isinstance(current, dict) or key not in current:\n        return None\n    current = current[key]\n"
   "return current", lambda r: ({"user": {"name": _word(r), "address": {"city": _word(r)}}, "id": r.randint(1, 99)},
   r.choice((["user", "name"], ["user", "address", "city"], ["id"], ["user", "email"], ["user", "name", "x"]))),
   "get_nested")
_t("count_by_initial", "words", "returns a dictionary mapping each first letter to how many words in `words` start "
   "with it", "counts = {}\nfor word in words:\n    counts[word[0]] = counts.get(word[0], 0) + 1\nreturn counts",
   lambda r: (_words(r, 3, 6),), "initial_counts")
_t("order_total", "prices, quantities", "computes the total cost of an order, where `prices` maps item names to unit "
   "prices and `quantities` maps item names to how many were bought", "total = 0\n"
   "for item, qty in quantities.items():\n    total += prices[item] * qty\nreturn total",
   lambda r: (lambda p: (p, {k: r.randint(1, 5) for k in r.sample(list(p), 2)}))(
       {w: r.randint(1, 12) for w in r.sample(("tea", "bread", "milk", "eggs", "jam"), 3)}), "basket_cost")

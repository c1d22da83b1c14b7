"""Lookup proposals: the tokens that followed a row's most recent tokens where those tokens occurred
before, in the row's own prompt and output (prompt lookup) or in recent requests (a shared,
bounded suffix index). No model runs: the proposal is a deterministic function of the text, so
for sampled rows it is a point-mass draft (q one-hot; `acceptance.sample_accept` keeps it exact).

Contract:
- `NgramIndex(max_ngram)`: an incremental index of one token sequence. `extend(tokens)` appends
  tokens (max_ngram dict updates per token); `match(suffix, limit)` -> `Match | None`: for the
  longest n (max_ngram down to 1) such that the last n tokens of `suffix` occurred before with a
  token after them, the tokens that followed their most recent occurrence (up to `limit`), with n,
  how often the n-gram was seen and how many of its latest occurrences in a row were followed by
  the same token (agreement).
- `lookup_confidence(match)` -> one confidence in (0, 1) per proposed token: the prior that it is
  right given it was reached, growing with match length and agreement, shrinking with
  disagreement. The policy calibrates it online like the draft's confidence (its own
  `AcceptanceModel` table per source), so only its ordering has to be informative.
- `SuffixStore(max_tokens, max_ngram)`: the cross-request index (suffix decoding): `add(tokens)`
  stores a finished request's text, evicting the oldest requests beyond `max_tokens` tokens in all
  (with their index entries); `match(suffix, limit)` as above. One store may be shared by every
  session of a decoder (a lock guards it).
- `LookupProposer(max_ngram, store)`: the per-row indexes of a running batch, following the batch
  like the draft proposer: `add_rows(sequences)` (prompt + first token, rows come last),
  `extend(tokens_per_row)` after each cycle, `select_rows(rows)` (dropped rows' text goes to the
  store); `propose(limit)` -> one `Lookup` per row (tokens, confidence; empty: no match), the
  longer of the row's own match and the store's.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

DEFAULT_MAX_NGRAM = 4
DEFAULT_STORE_TOKENS = 1 << 20


@dataclass(frozen=True)
class Match:
    tokens: list[int]     # what followed the most recent occurrence
    n: int                # matched n-gram length
    seen: int             # occurrences of the n-gram (with a following token)
    agree: int            # latest occurrences in a row followed by the same token as the most recent


@dataclass(frozen=True)
class Lookup:
    tokens: list[int]
    confidence: list[float]


def lookup_confidence(match: Match) -> list[float]:
    """First token: agreement share shrunk by a short match, (agree / (seen + 1)) * n / (n + 1);
    later tokens continue the copy, each conditionally likelier: (n + i) / (n + i + 1)."""
    first = match.agree / (match.seen + 1) * match.n / (match.n + 1)
    return [first] + [(match.n + i) / (match.n + i + 1) for i in range(1, len(match.tokens))]


class _Table:
    """n-gram -> [continuation position, seen, agree, document] (document None: the indexed
    row's own sequence)."""

    def __init__(self, max_ngram: int):
        self.max_ngram = max_ngram
        self.entries: dict[tuple, list] = {}

    def index(self, seq: list[int], t: int, document: list[int] | None = None) -> None:
        """Record that seq[t] followed the n-grams ending at t - 1."""
        for n in range(1, min(self.max_ngram, t) + 1):
            key = tuple(seq[t - n:t])
            entry = self.entries.get(key)
            if entry is None:
                self.entries[key] = [t, 1, 1, document]
            else:
                before = (seq if entry[3] is None else entry[3])[entry[0]]
                entry[:] = [t, entry[1] + 1, entry[2] + 1 if before == seq[t] else 1, document]

    def match(self, suffix: list[int], limit: int, own: list[int] | None = None) -> Match | None:
        """The longest indexed n-gram ending `suffix`; `own` is the sequence of entries without a document."""
        for n in range(min(self.max_ngram, len(suffix)), 0, -1):
            entry = self.entries.get(tuple(suffix[-n:]))
            if entry is not None:
                seq = own if entry[3] is None else entry[3]
                return Match(seq[entry[0]:entry[0] + limit], n, entry[1], entry[2])
        return None


class NgramIndex:
    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM):
        self.tokens: list[int] = []
        self.table = _Table(max_ngram)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.tokens.append(token)
            self.table.index(self.tokens, len(self.tokens) - 1)

    def match(self, suffix: list[int] | None = None, limit: int = 8) -> Match | None:
        found = self.table.match(self.tokens if suffix is None else suffix, limit, self.tokens)
        return found if found is not None and found.tokens else None


class SuffixStore:
    def __init__(self, max_tokens: int = DEFAULT_STORE_TOKENS, max_ngram: int = DEFAULT_MAX_NGRAM):
        self.max_tokens = max_tokens
        self.table = _Table(max_ngram)
        self.documents: deque[list[int]] = deque()
        self.tokens = 0
        self.lock = threading.Lock()

    def add(self, tokens: list[int]) -> None:
        document = list(tokens[-self.max_tokens:])
        with self.lock:
            self.documents.append(document)
            self.tokens += len(document)
            for t in range(1, len(document)):
                self.table.index(document, t, document)
            while self.tokens > self.max_tokens:
                self._evict(self.documents.popleft())

    def _evict(self, document: list[int]) -> None:
        self.tokens -= len(document)
        entries = self.table.entries
        for t in range(1, len(document)):
            for n in range(1, min(self.table.max_ngram, t) + 1):
                key = tuple(document[t - n:t])
                entry = entries.get(key)
                if entry is not None and entry[3] is document:
                    del entries[key]

    def match(self, suffix: list[int], limit: int) -> Match | None:
        with self.lock:
            found = self.table.match(suffix, limit)
        return found if found is not None and found.tokens else None

    def __len__(self) -> int:
        return len(self.documents)


class LookupProposer:
    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM, store: SuffixStore | None = None):
        self.max_ngram = max_ngram
        self.store = store
        self.rows: list[NgramIndex] = []

    def add_rows(self, sequences: list[list[int]]) -> None:
        for sequence in sequences:
            index = NgramIndex(self.max_ngram)
            index.extend(sequence)
            self.rows.append(index)

    def extend(self, tokens: list[list[int]]) -> None:
        for index, new in zip(self.rows, tokens):
            index.extend(new)

    def select_rows(self, rows: list[int]) -> None:
        keep = set(rows)
        if self.store is not None:
            for i, index in enumerate(self.rows):
                if i not in keep:
                    self.store.add(index.tokens)
        self.rows = [self.rows[i] for i in rows]

    def propose(self, limit: int) -> list[Lookup]:
        out = []
        for index in self.rows:
            found = index.match(limit=limit)
            if self.store is not None:
                shared = self.store.match(index.tokens[-self.max_ngram:], limit)
                if shared is not None and (found is None or shared.n > found.n):
                    found = shared
            out.append(Lookup([], []) if found is None else Lookup(found.tokens, lookup_confidence(found)))
        return out

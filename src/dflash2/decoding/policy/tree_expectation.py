"""Expected tokens of a two-branch token tree: a row's draft path and a second branch (lookup's
proposal, or the draft lattice's second path) verified together in one target pass.

Contract (pure functions of per-token acceptance probabilities, each given its token was reached):
- `tree_options(draft, lookup, shared)` -> per tree width w (nodes below the anchor) the best
  (expected tokens, nodes, draft branch length, second branch length) of at most w nodes, the two
  branches sharing their first `shared` tokens; empty when one branch is a prefix of the other.
- `best_per_width(options)`: several such lists of one row, each tagged with its second branch's
  source -> per width the option that expects the most tokens.
`decoding.policy` prices each width like any verified token and weighs it against a single path.
"""
from __future__ import annotations


def tree_options(draft: list[float], lookup: list[float], shared: int) -> list[tuple[float, int, int, int]]:
    """A row's draft path and a second branch (lookup's, or the lattice's second path) verified
    together as a tree, sharing their first `shared` tokens; `draft` / `lookup` are each token's
    acceptance probability given it was reached. ->
    per tree width w (nodes below the anchor) the best (expected tokens, nodes, draft length, lookup
    length) of at most w nodes; (0.0, 0, 0, 0) where no tree fits. Shared tokens count with the likelier source's
    probability; at the divergence the two tokens differ, so at most one is accepted: their
    probabilities are scaled to sum to at most 1. Empty when one branch is a prefix of the other
    (the longer path is then the whole tree)."""
    if shared >= min(len(draft), len(lookup)):
        return []
    reach, base = 1.0, 1.0
    for a, c in zip(draft[:shared], lookup[:shared]):
        reach *= max(a, c)
        base += reach
    both = draft[shared] + lookup[shared]
    start = reach / both if both > 1 else reach

    def gains(p: list[float]) -> list[float]:     # expected tokens from the first j divergent nodes
        out, r = [0.0], start
        for a in p[shared:]:
            r *= a
            out.append(out[-1] + r)
        return out

    draft_gain, lookup_gain = gains(draft), gains(lookup)
    best = [(0.0, 0, 0, 0)] * (len(draft) + len(lookup) - shared + 1)
    for i in range(1, len(draft_gain)):
        for j in range(1, len(lookup_gain)):
            expected = base + draft_gain[i] + lookup_gain[j]
            if expected > best[shared + i + j][0]:
                best[shared + i + j] = (expected, shared + i + j, shared + i, shared + j)
    for w in range(1, len(best)):
        if best[w - 1][0] > best[w][0]:
            best[w] = best[w - 1]
    return best


def best_per_width(options: list[tuple[list[tuple[float, int, int, int]], str]]) -> list[tuple[float, int, int, int, str]]:
    """Several `tree_options` lists of one row, each with its second branch's source -> per width the
    option that expects the most tokens (empty when none has any)."""
    widest = max((len(o) for o, _ in options), default=0)
    best = []
    for w in range(widest):
        candidates = [(*o[min(w, len(o) - 1)], name) for o, name in options if o]
        best.append(max(candidates, key=lambda c: c[0]))
    return best

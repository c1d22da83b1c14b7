"""Whether a draft pays in an engine, and with which settings: pure arithmetic over measurements.

One speculative cycle with at most k draft tokens costs a verify pass of width k + 1 plus
everything else the cycle does (the draft's passes, feeding it the target's features, sampling),
and commits E(k) tokens on average (accepted drafts + the target's own token). Plain decoding
commits 1 token per step of a one-token pass plus its own sampling. In units of T(1), the target's
one-token forward pass:

    speedup(k) = E(k) (1 + S) / (C(k + 1) + D(k)),   C(w) = T(w) / T(1),
    D(k) = (cycle time - T(k + 1)) / T(1),            S = (plain step time - T(1)) / T(1)

Contract:
- `Measurements`: C(w) for w = 1..K+1 (`width_cost`), D(k) (`draft_cost`) and E(k) (`expected`) for
  k = 1..K, each k measured as the engine runs it (a draft block of k + 1 positions). Where
  measured, `measured_speedup[k]` (engine tokens/s with n-max k over plain) checks the arithmetic.
- `advise(m)` -> `Advice`: `speedup` per k; `best` the k of the largest speedup when it is above 1
  (else None: do not speculate); `bound` per k, E(k) (1 + S) / (1 + D(k)): what any confidence
  cut-off (`--spec-draft-p-min`) could reach at most, since it only shortens the verified drafts
  (a verify pass costs at least T(1), and a cut draft commits at most what the whole one does).
  `p_min_may_pay` lists the k whose bound exceeds 1 while the whole block does not pay.
- `Advice.lines(engine)` prints it for llama.cpp (`--spec-draft-n-max`, `--spec-draft-p-min`) and
  for vLLM (`num_speculative_tokens`; its cost curve is another machine's, so the break-even is
  printed: k pays where a (k+1)-token verify plus the draft's pass costs less than E(k) steps).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Measurements:
    width_cost: dict[int, float]      # w -> T(w) / T(1), w = 1..K+1
    draft_cost: dict[int, float]      # k -> draft time per cycle / T(1)
    expected: dict[int, float]        # k -> tokens committed per cycle with at most k drafts
    plain_overhead: float = 0.0       # S: a plain step's time beyond T(1), over T(1)
    measured_speedup: dict[int, float] = field(default_factory=dict)   # k -> engine tok/s ratio to plain
    where: str = ""                   # the engine, model file and machine, in words


@dataclass(frozen=True)
class Advice:
    speedup: dict[int, float]
    bound: dict[int, float]
    best: int | None
    p_min_may_pay: tuple[int, ...]
    measurements: Measurements

    def lines(self) -> list[str]:
        m = self.measurements
        ks = sorted(self.speedup)
        out = [f"speculation advice ({m.where}):",
               "  verify cost T(w)/T(1), w = 1..%d: %s" % (max(m.width_cost),
                                                          " ".join(f"{m.width_cost[w]:.2f}" for w in sorted(m.width_cost))),
               "  n-max k        " + " ".join(f"{k:>5}" for k in ks),
               "  E(k) tokens    " + " ".join(f"{m.expected[k]:5.2f}" for k in ks),
               "  other D(k)     " + " ".join(f"{m.draft_cost[k]:5.2f}" for k in ks)
               + f"   (a plain step: 1 + {m.plain_overhead:.2f})",
               "  speedup        " + " ".join(f"{self.speedup[k]:5.2f}" for k in ks)]
        if m.measured_speedup:
            out.append("  measured       " + " ".join(f"{m.measured_speedup[k]:5.2f}" if k in m.measured_speedup
                                                      else "    -" for k in ks))
        if self.best is not None:
            out.append(f"  llama.cpp: --spec-draft-n-max {self.best} (expected {self.speedup[self.best]:.2f}x of plain "
                       "decoding); --spec-draft-p-min 0 (no cut-off: the arithmetic counts whole blocks)")
        else:
            out.append("  llama.cpp: do not speculate with this draft here: no --spec-draft-n-max pays "
                       f"(best {max(self.speedup.values()):.2f}x of plain decoding at n-max "
                       f"{max(self.speedup, key=self.speedup.get)})")
            if self.p_min_may_pay:
                out.append("  a --spec-draft-p-min cut-off could pay at n-max " + ", ".join(map(str, self.p_min_may_pay))
                           + " (at most " + ", ".join(f"{self.bound[k]:.2f}x" for k in self.p_min_may_pay)
                           + "): measure it with llama-speculative-simple")
            else:
                out.append(f"  no --spec-draft-p-min can make it pay: even a verify pass as cheap as one step gives at "
                           f"most {max(self.bound.values()):.2f}x (the draft's own pass costs "
                           f"{min(m.draft_cost.values()):.2f} steps or more)")
        out.append("  vLLM num_speculative_tokens k pays where a (k+1)-token verify plus the draft pass costs less "
                   "than E(k) one-token steps: " + ", ".join(f"k={k}: {m.expected[k]:.2f}" for k in ks))
        return out


def advise(m: Measurements) -> Advice:
    ks = sorted(m.expected)
    missing = [k for k in ks if k + 1 not in m.width_cost or k not in m.draft_cost]
    if missing:
        raise ValueError(f"no verify or draft cost for n-max {missing[0]}")
    plain = 1.0 + m.plain_overhead
    speedup = {k: m.expected[k] * plain / (m.width_cost[k + 1] + m.draft_cost[k]) for k in ks}
    bound = {k: m.expected[k] * plain / (1.0 + m.draft_cost[k]) for k in ks}
    top = max(ks, key=speedup.get)
    best = top if speedup[top] > 1.0 else None
    may = tuple(k for k in ks if best is None and bound[k] > 1.0)
    return Advice(speedup, bound, best, may, m)

"""When to speculate and how many draft tokens to verify: the cost side of the decoding loop.

Contract:
- `SpeculationPolicy(mode, costs)`, mode `auto` | `always` | `never`:
  - `never`: plain decoding, no draft pass, ever.
  - `always`: a draft pass every cycle and the whole block verified (the classical loop).
  - `auto` (the default): per cycle, verify only as many draft tokens as pay for themselves, and
    fall back to plain decoding for the batch when speculation does not pay, probing again later.
- `plan(b)` -> `CyclePlan(draft, probe)`: whether this cycle runs the draft (False: a plain
  one-token step), and whether it is a probe (the first speculative cycle of the decoder or after
  a fallback: its length is chosen optimistically, to learn what the draft is worth). In `auto`
  the first cycle at a batch size whose plain step this run has not timed is a plain step
  (`unmeasured`; `choose` verifies nothing then either).
- `drafted(b, seconds)`: the draft pass just ran and took `seconds` (known before the length is
  chosen, so even the first choice weighs it).
- `choose(b, offer, block, probe)` -> `Choice`: given the `Offer` (per row, each source's
  confidence in its tokens: the draft's when its pass ran, lookup's when there is a lookup
  proposer), the room k for drafts in this cycle's pass (0..block-1) and, per row, the source and
  number of its tokens to verify, chosen to maximise expected committed tokens per second:
      rate(k) = sum_r max_s E_{r,s}(min(k, T_{r,s})) / (t_draft(b) + t_verify(b, k + 1) + t_host),
      E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j,
  where a_{r,s,j} is the calibrated probability that token j of source s for row r is accepted
  given tokens 1..j-1 were (`AcceptanceModel`, one table per source, from the source's own
  confidence; in a probe -- the draft's, or lookup's (`_lookup_choice`) -- at an optimistic bound,
  mean + `optimism` standard deviations, so that they are tried; otherwise at the posterior mean,
  so that an ordinary cycle does not pay for exploration), t_draft only when the draft pass ran,
  and the times from `costs` (`decoding.policy.costs.CostModel`; in a probe at its optimistic figures, so
  that figures this run has not observed -- a calibration stored or measured under another load --
  cannot rule speculation out without it being measured). Plain decoding's rate is
  b / (t_verify(b, 1) + t_host). A fixed batch (`Offer.remaining`: each row's room, batches of
  `generate`, no queue to refill them) is rated instead by the plain decoding time a cycle saves
  per second (`rate`, `decoding.policy.horizon`): what ends its last row soonest. Rows of one pass may
  verify different sources and lengths: each row's block is its own. A third option per row, when
  the offer says where the draft's and lookup's tokens stop agreeing (`Offer.shared`: greedy rows
  of a target that can verify trees), is both as a tree (`tree_options`: the shared prefix once,
  then both branches; at most one of the two diverging tokens can be accepted): its expected
  tokens against its width, the nodes it adds to the pass, priced by the same per-token verify
  cost (k may then exceed block - 1). `choose_length(b, confidence, greedy, block, probe)` is
  `choose` for the draft alone. A sampled row's draft confidence is never seen (`Offer.of`): a
  choice that depends on a random draw biases the output.
- `worth_drafting(b, offer, block)`: with the lookup offer in hand, before the draft pass, whether
  the draft at its usual yield (a moving average of its k and expected tokens a row) beats the
  lookup alone, pass included; before the draft has a yield, only when lookup leaves some row
  uncovered (so its probe measures it where lookup cannot serve, instead of losing a cycle that
  lookup already covers and falling back for it). The yield is renewed only by draft passes, so
  after `renew` cycles skipped in a row one pass runs anyway (`renew` doubles while the draft's
  tokens are not chosen, back to `min_backoff` when they are): a yield learnt on text that lookup
  served better cannot keep the draft off for good once the text changes.
- Lookup costs no pass and is chosen cycle by cycle at its mean; when only its optimistic bound or
  figures this run has not observed would verify more, a lookup probe verifies that once,
  budgeted like a fallback (see `_lookup_choice`).
- Falling back (the draft pass only) is decided by what the draft's cycles realised, never by one
  block: a block the draft is unsure of (the best length 0, or in a probe not paying even at the
  optimistic bound) is verified without its tokens (`without`: lookup's, or a plain step), and
  its pass is what that cycle loses. Each draft cycle's gain -- the plain decoding time it saved
  (`_realised_loss`: by the objective the choice is made by) beyond what the best choice without
  the draft was expected to save (`Choice.baseline`: nothing for a plain step, lookup's expected
  gain in `hybrid`), less its own time, in plain steps -- goes into `evidence`
  (`decoding.policy.evidence.GainEvidence`: exponentially weighted, shrunk towards gain 0, older with
  every decoded step). The draft pass stops only when even the evidence's optimistic bound (mean
  + `optimism` standard errors) is a loss: a draft that pays on balance is never switched off by
  a run of unlucky blocks (which the old rules did: one rejected probe, one unsure block or a few
  rejected blocks each stopped it for dozens to hundreds of steps), and one that loses its pass
  every cycle stops after a few. A fallback lasts long enough that what the draft cycles lost on
  balance since the last one (`stretch`, summed one-sidedly) is at most `budget` of the
  fallback's time; at least `backoff` steps, which doubles after each fallback (up to
  `max_backoff`) and returns to `min_backoff` while the evidence's mean is a gain. The first
  draft cycle after a fallback (and the very first) is a probe: its length is chosen at the
  optimistic bound of the calibration and costs, to learn what the draft is worth now. So a
  draft that never pays costs at most `budget` of plain decoding's time after its first few
  cycles. `sources` (2 for `hybrid`, whose draft and lookup are both explored) splits `budget`
  between them, so exploring both costs at most what exploring one does.
- `fresh()`: a policy with the same settings and cost model that has learned nothing of the draft.
- `observe(record)` feeds back what a cycle did (`CycleRecord`): the acceptance per row and source
  (calibration) and the measured times (costs).
All numbers are plain Python floats: the policy changes what is verified, never what is output
(acceptance is exact for any number of verified drafts).
"""
from __future__ import annotations

import math
from dataclasses import replace

from dflash2.decoding.policy.acceptance_model import AcceptanceModel, expectations_by_length
from dflash2.decoding.policy.costs import CostModel
from dflash2.decoding.policy.cycle import LATTICE, SOURCES, Choice, CyclePlan, CycleRecord, Offer
from dflash2.decoding.policy.evidence import GainEvidence
from dflash2.decoding.policy.horizon import saved_seconds, step_curve
from dflash2.decoding.policy.tree_expectation import best_per_width, tree_options

SPECULATE_MODES = ("auto", "always", "never")
DRAFT_SCALE_WEIGHT = 8.0   # the draft's confidence is a trained model's probability: its table-wide calibration
                           # moves only as evidence worth 8 reached tokens says (lookup's heuristic one: 2)


class SpeculationPolicy:
    def __init__(self, mode: str = "auto", costs: CostModel | None = None, min_backoff: int = 8,
                 max_backoff: int = 512, budget: float = 0.02, optimism: float = 1.0, margin: float = 0.0,
                 sources: int = 1):
        if mode not in SPECULATE_MODES:
            raise ValueError(f"speculate mode must be one of {', '.join(SPECULATE_MODES)}, got {mode!r}")
        self.mode = mode
        self.costs = costs or CostModel()
        self.acceptance = AcceptanceModel(scale_weight=DRAFT_SCALE_WEIGHT)   # the draft's calibration
        self.lookup_acceptance = AcceptanceModel()    # the lookup proposer's
        self.lattice_acceptance = AcceptanceModel()   # the draft's second path's, from its fork on
        self.min_backoff, self.max_backoff, self.margin = min_backoff, max_backoff, margin
        self.budget, self.optimism, self.sources = budget, optimism, sources
        self.backoff = min_backoff
        self.plain_left = 0      # cycles left in the current fallback (no draft pass)
        self.probing = True      # the next draft pass is a probe (the first one, or after a fallback)
        self.evidence = GainEvidence()   # what draft cycles gained, in plain steps (the fallback's judge)
        self.stretch = 0.0       # seconds the draft cycles since the last fallback lost, on balance
        self.outlook: tuple[float, float] | None = None   # the draft's usual (k, expected tokens a row)
        self.lookup_wait = 0     # lookup cycles before the next lookup probe may run (`_lookup_choice`)
        self.lookup_backoff = min_backoff
        self.skipped = 0         # consecutive cycles `worth_drafting` skipped the draft pass
        self.renew = min_backoff  # skipped cycles before one draft pass renews the outlook (doubling while it
        #                           does not pay, back to `min_backoff` when the draft's tokens are verified)

    def fresh(self) -> "SpeculationPolicy":
        """The same settings and cost model, nothing learned of the proposers, no fallback under way."""
        return SpeculationPolicy(self.mode, self.costs, self.min_backoff, self.max_backoff, self.budget,
                                 self.optimism, self.margin, self.sources)

    def _table(self, source: str) -> AcceptanceModel:
        return {"draft": self.acceptance, "lookup": self.lookup_acceptance, LATTICE: self.lattice_acceptance}[source]

    # ------------------------------------------------------------------ decisions
    def plan(self, b: int) -> CyclePlan:
        if self.mode == "never":
            return CyclePlan(draft=False)
        if self.mode == "always":
            return CyclePlan(draft=True)
        if self.plain_left > 0:
            self.plain_left -= 1
            self.evidence.age()
            if self.plain_left == 0:
                self.probing = True
            return CyclePlan(draft=False)
        if self.unmeasured(b):
            return CyclePlan(draft=False)
        return CyclePlan(draft=True, probe=self.probing)

    def unmeasured(self, b: int) -> bool:
        """`auto` has not timed a plain step of b rows in this run: the next cycle is one (free against
        plain decoding), since every choice is weighed against it and a figure only calibrated or
        predicted (a stored table of other batch sizes: then a one-row plain step reads as dear as
        the narrowest pass it has) would decide unchecked: a speculation that the policy
        believes pays never takes the plain step that would show it does not."""
        return self.mode == "auto" and (b, 1) not in self.costs.observed_s

    def drafted(self, b: int, seconds: float) -> None:
        self.costs.observe_draft(b, seconds)

    def plain_step_seconds(self, b: int) -> float:
        return self.costs.verify(b, 1) + self.costs.host(b, False)

    def plain_rate(self, b: int) -> float:
        return b / max(self.plain_step_seconds(b), 1e-9)

    def cycle_seconds(self, b: int, k: int, drafted: bool = True, optimistic: bool = False) -> float:
        """A cycle verifying k drafts a row, with or without the draft pass (k = 0 and no pass: a plain
        step); `optimistic`: the target pass at the cost model's optimistic figure (a probe's)."""
        if k == 0 and not drafted:
            return self.plain_step_seconds(b)
        return ((self.costs.draft(b) if drafted else 0.0) + self.costs.verify(b, k + 1, optimistic)
                + self.costs.host(b, True))

    def _probabilities(self, offer: Offer, optimism: float = 0.0) -> dict[str, list[list[float]]]:
        """source -> per row the acceptance probability of each token, at `optimism` (the bound of a
        probe, the draft's or lookup's; 0: the posterior mean, what an ordinary cycle expects)."""
        return {name: [self._table(name).probabilities(c, g, optimism) for c, g in zip(confidence, offer.greedy)]
                for name, confidence in offer.sources()}

    def _expectations(self, offer: Offer, optimism: float = 0.0) -> dict[str, list[list[float]]]:
        """source -> per row [E(0), ..., E(T)] (see `_probabilities`)."""
        return {name: [expectations_by_length(p) for p in rows]
                for name, rows in self._probabilities(offer, optimism).items()}

    def _trees(self, offer: Offer, optimism: float = 0.0) -> list[list[tuple[float, int, int, int, str]]] | None:
        """Per row and tree width the best tree (`tree_options` with the second branch's source
        appended): the draft's path with lookup's, or with the lattice's second path (whose tokens
        before the fork are the draft's own, at the draft's calibration), whichever expects more at
        that width; empty: no tree; None when no row may verify one."""
        if offer.draft is None or (offer.shared is None and offer.forks is None):
            return None
        p = self._probabilities(offer, optimism)
        trees = []
        for r, draft in enumerate(p["draft"]):
            options = []
            if offer.shared is not None and offer.lookup is not None and offer.shared[r] is not None:
                options.append((tree_options(draft, p["lookup"][r], offer.shared[r]), "lookup"))
            if offer.forks is not None and offer.forks[r] is not None:
                fork = offer.forks[r]
                second = draft[:fork] + self.lattice_acceptance.probabilities(offer.lattice[r][fork:], True, optimism)
                options.append((tree_options(draft, second, fork), LATTICE))
            trees.append(best_per_width(options))
        return trees if any(trees) else None

    def _best(self, b: int, expectations: dict[str, list[list[float]]], drafts: int, drafted: bool,
              every: bool = False, trees: list[list[tuple[float, int, int, int, str]]] | None = None,
              optimistic: bool = False, remaining: list[int] | None = None) -> Choice:
        """The k (0..drafts, or up to the widest tree) of the highest rate, each row taking its best
        source at k (a tree of at most k nodes included, its width priced like any verified token);
        `every`: the largest k, every row verifying all that its best option offers; `optimistic`: at
        the cost model's optimistic figures (a probe's); `remaining`: a fixed batch's rows' room (see
        `rate`)."""
        room = max([drafts] + [len(t) - 1 for t in trees or []])
        best = None   # the first k's choice stands until one beats it (a rate can be negative)
        steps = self._plain_steps(b, remaining)
        for k in ([room] if every else range(room + 1)):
            per_row, sources, lengths, branches, seconds = [], [], [], [], []
            for r in range(b):
                row_best, source, length, branch, second = (-1.0 if every else 1.0), "", 0, (0, 0), ""
                for name, rows in expectations.items():
                    n = min(k, drafts, len(rows[r]) - 1)
                    if rows[r][n] > row_best and n > 0:
                        row_best, source, length = rows[r][n], name, n
                if trees and trees[r]:
                    tree_expected, nodes, n_draft, n_second, name = trees[r][min(k, len(trees[r]) - 1)]
                    if tree_expected > row_best and nodes:
                        row_best, source, length, branch, second = tree_expected, "tree", nodes, (n_draft, n_second), name
                per_row.append(max(row_best, 1.0))
                sources.append(source)
                lengths.append(length)
                branches.append(branch)
                seconds.append(second)
            width = max(lengths, default=0)
            rate = self.rate(b, per_row, self.cycle_seconds(b, width, drafted, optimistic), remaining, steps)
            if best is None or rate > best.rate:
                tree = "tree" in sources
                best = Choice(width, sum(per_row), rate, tuple(sources), tuple(lengths),
                              tuple(branches) if tree else (), tuple(seconds) if tree else ())
        return best

    def _plain_steps(self, b: int, remaining: list[int] | None) -> list[float] | None:
        """A plain step's seconds at 1..b rows, where a fixed batch's rate needs them."""
        return None if remaining is None or b == 1 else step_curve(b, self.plain_step_seconds)

    def rate(self, b: int, expected: list[float], seconds: float, remaining: list[int] | None = None,
             steps: list[float] | None = None) -> float:
        """What a cycle of `seconds` committing `expected[r]` tokens a row is worth per second: tokens
        per second; for a fixed batch (`remaining`, b > 1) the plain decoding time it saves per second
        (`horizon.saved_seconds`), in plain decoding's tokens per second (a plain step: `plain_rate`),
        so that the time until the last row ends is what is minimised. (One row: the same choice.)"""
        seconds = max(seconds, 1e-9)
        if remaining is None or b == 1:
            return sum(expected) / seconds
        steps = steps or self._plain_steps(b, remaining)
        return saved_seconds(remaining, expected, steps) / seconds * b / max(steps[-1], 1e-9)

    def _pays(self, rate: float, without: float) -> bool:
        return rate >= without * (1 + self.margin)

    def _lost(self, b: int, seconds: float, tokens: float) -> float:
        """What a speculative cycle of `seconds` committing `tokens` lost against plain steps."""
        return seconds - tokens / b * self.plain_step_seconds(b)

    def _realised_loss(self, record: CycleRecord) -> float:
        """What a cycle lost against plain decoding, by what it committed: its time beyond that of the
        plain decoding it saved -- plain steps committing as many tokens, or, for a fixed batch
        (`Offer.remaining`), the plain decoding time until its last row ends (`horizon.saved_seconds`:
        the objective `rate` chooses by; rows carried far ahead while others lag save little when a
        plain step costs about the same for fewer rows)."""
        b, remaining = record.b, record.offer.remaining
        committed = [accepted + 1 for accepted in record.accepted]
        if remaining is None:
            return self._lost(b, record.seconds, sum(committed))
        return record.seconds - saved_seconds(remaining, committed, step_curve(b, self.plain_step_seconds))

    def worth_drafting(self, b: int, offer: Offer, block: int) -> bool:
        """Before the draft pass, with the lookup offer in hand: whether the draft, at what it usually
        gives, is expected to add more than its pass costs; before it has a yield, whether lookup
        leaves some row uncovered (where the draft's probe can show what it is worth)."""
        if self.mode != "auto" or offer.lookup is None:
            return True
        lookup = self._expectations(offer)
        alone = self._best(b, lookup, block - 1, drafted=False, remaining=offer.remaining)
        if self.outlook is None:   # the draft's probe waits for a cycle with a row that lookup leaves uncovered
            return not all(alone.sources)
        k, per_row = round(self.outlook[0]), self.outlook[1]
        mixed = [max(per_row, row[min(k, len(row) - 1)]) for row in lookup["lookup"]]
        if self.rate(b, mixed, self.cycle_seconds(b, k, True), offer.remaining) > alone.rate:
            self.skipped = 0
            return True
        self.skipped += 1        # the outlook ages while the draft does not run: one pass now and then renews it
        if self.skipped < self.renew:
            return False
        self.skipped, self.renew = 0, min(2 * self.renew, self.max_backoff)
        return True

    def choose(self, b: int, offer: Offer, block: int, probe: bool = False) -> Choice:
        """What to verify this cycle, by expected committed tokens per second; see the module docstring."""
        drafts = block - 1
        drafted = offer.draft is not None
        if self.mode == "always":
            return self._best(b, self._expectations(offer), drafts, drafted, every=True, trees=self._trees(offer),
                              remaining=offer.remaining)
        if self.unmeasured(b):
            return self._best(b, {}, 0, drafted)
        if not drafted:                          # lookup alone, or nothing
            return self._lookup_choice(b, offer, drafts)
        optimism = self.optimism if probe else 0.0
        expectations = self._expectations(offer, optimism)
        choice = self._best(b, expectations, drafts, True, trees=self._trees(offer, optimism), optimistic=probe,
                            remaining=offer.remaining)
        without = self._best(b, {n: e for n, e in expectations.items() if n != "draft"}, drafts, False,
                             optimistic=probe, remaining=offer.remaining)
        if not probe:
            self._follow_outlook(choice, expectations["draft"])
            if choice.k and ("draft" in choice.sources or "tree" in choice.sources):
                self.renew = self.min_backoff
        # what the draft cycle is measured against: the best choice without it, at the posterior mean
        mean = without if not probe or offer.lookup is None else self._best(
            b, {n: e for n, e in self._expectations(offer).items() if n != "draft"}, drafts, False,
            remaining=offer.remaining)
        baseline = self._expected_loss(b, mean)
        if choice.k == 0 or (probe and not self._pays(choice.rate, without.rate)):
            # nothing worth verifying from the draft this cycle, even at a probe's optimistic bound: its
            # pass is what the cycle loses (`observe` weighs it with the rest of the evidence)
            return replace(without, baseline=baseline)
        return replace(choice, baseline=baseline)

    def _expected_loss(self, b: int, choice: Choice) -> float:
        """What a cycle without the draft pass, as chosen, is expected to lose against plain decoding
        (negative: to gain; 0 for a plain step), by the objective its rate was chosen by."""
        seconds = self.cycle_seconds(b, choice.k, drafted=False)
        return seconds - choice.rate * seconds / self.plain_rate(b)

    def _lookup_choice(self, b: int, offer: Offer, drafts: int) -> Choice:
        """Lookup costs no pass, so it is chosen cycle by cycle, at its mean acceptance and the cost
        model's figures. What those rule out is tried in a lookup probe: lookup at its optimistic
        bound (mean + `optimism` sd) and the optimistic figures (a calibration that overstates wide
        passes, bins that have seen little), verified once when it would verify more; the next probe
        waits long enough that what one can lose at the mean (its time beyond that of plain steps
        committing its expected tokens) is at most `budget` of the waiting cycles' time (at least
        `lookup_backoff` cycles, doubling). So neither a calibration nor a young bin can switch lookup
        off, and exploring a lookup that does not pay costs at most `budget`."""
        expectations = self._expectations(offer)
        choice = self._best(b, expectations, drafts, False, remaining=offer.remaining)
        if self.mode != "auto" or offer.lookup is None:
            return choice
        if self.lookup_wait > 0:
            self.lookup_wait -= 1
            return choice
        optimistic = self._best(b, self._expectations(offer, self.optimism), drafts, False, optimistic=True,
                                remaining=offer.remaining)
        if optimistic.k <= choice.k:
            return choice
        expected = sum(max(expectations[source][r][n], 1.0) if source else 1.0
                       for r, (source, n) in enumerate(zip(optimistic.sources, optimistic.lengths)))
        lost = self._lost(b, self.cycle_seconds(b, optimistic.k, False), expected)
        self.lookup_wait = self._fallback_length(b, lost, self.lookup_backoff)
        self.lookup_backoff = min(2 * self.lookup_wait, self.max_backoff)
        return optimistic

    def choose_length(self, b: int, confidence: list[list[float]], greedy: list[bool], block: int,
                      probe: bool = False) -> int:
        """`choose` for a draft alone: the number of drafts to verify."""
        return self.choose(b, Offer(greedy, confidence), block, probe).k

    def _follow_outlook(self, choice: Choice, draft: list[list[float]]) -> None:
        """The draft's usual k and expected tokens a row at it (a moving average)."""
        per_row = sum(row[min(choice.k, len(row) - 1)] for row in draft) / max(len(draft), 1)
        if self.outlook is None:
            self.outlook = (float(choice.k), per_row)
        else:
            self.outlook = tuple(0.8 * old + 0.2 * new for old, new in zip(self.outlook, (choice.k, per_row)))

    def _fallback_length(self, b: int, lost_seconds: float, backoff: int) -> int:
        """Plain steps enough that `lost_seconds` is at most `budget` of their time, at least
        `backoff` of them, at most `max_backoff`."""
        share = self.budget / self.sources      # each explored source its share: hybrid's two cost what one does
        needed = math.ceil(max(lost_seconds, 0.0) / max(share * self.plain_step_seconds(b), 1e-12))
        return min(max(backoff, needed), self.max_backoff)

    def _fall_back(self, b: int) -> None:
        """Cycles without the draft pass long enough that what the draft cycles since the last fallback
        lost on balance is at most `budget` of their time, at least `backoff` of them; the next
        fallback is at least twice as long (`backoff` returns to `min_backoff` once the evidence says
        the draft gains)."""
        self.plain_left = self._fallback_length(b, self.stretch, self.backoff)
        self.backoff = min(2 * self.plain_left, self.max_backoff)
        self.stretch = 0.0

    # ------------------------------------------------------------------ feedback
    def observe(self, record: CycleRecord) -> None:
        """What a cycle did: the acceptance per row (calibration, per source) and the measured times
        (costs; the draft pass's time itself came through `drafted`)."""
        b, offer, choice = record.b, record.offer, record.choice
        self.costs.observe_verify(b, record.width, record.verify_seconds)
        self.costs.observe_host(b, record.drafted or record.width > 1, record.host_seconds)
        offered = dict(offer.sources())
        for r, (source, verified, accepted) in enumerate(zip(choice.sources, record.verified, record.accepted)):
            if source == "tree":                 # each branch calibrates its own source
                (n_draft, n_second), (draft_accepted, second_accepted) = choice.branches[r], record.branch_accepted[r]
                self.acceptance.observe(offer.draft[r], True, n_draft, draft_accepted)
                # the lattice branch's own tokens start at the fork, reached when the draft's before it were accepted
                if choice.second_source(r) == LATTICE:
                    fork = offer.forks[r]
                    if second_accepted >= fork:
                        self.lattice_acceptance.observe(offer.lattice[r][fork:], True, n_second - fork,
                                                        second_accepted - fork)
                else:
                    self.lookup_acceptance.observe(offer.lookup[r], True, n_second, second_accepted)
            elif source and verified:
                self._table(source).observe(offered[source][r], offer.greedy[r], verified, accepted)
        if record.drafted and self.mode == "auto":
            self._weigh(record)

    def _weigh(self, record: CycleRecord) -> None:
        """A draft cycle, judged by what it realised beyond the best choice without the draft
        (`Choice.baseline`), in plain steps: into the evidence; the draft pass stops when even the
        evidence's optimistic bound is a loss (see the module docstring)."""
        b = record.b
        loss = self._realised_loss(record) - record.choice.baseline
        self.evidence.add(-loss / max(self.plain_step_seconds(b), 1e-9))
        self.stretch = max(0.0, self.stretch + loss)
        self.probing = False
        if self.evidence.mean() > 0.0:
            self.backoff = self.min_backoff
        if self.plain_left == 0 and self.evidence.upper(self.optimism) < 0.0:
            self._fall_back(b)

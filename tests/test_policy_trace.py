"""The speculation policy makes the choices it made when its trace was recorded: every cycle of the
synthetic scenarios of `policy_trace` (plans, draft passes, per row its source and length, trees,
fallbacks) equals tests/fixtures/policy_trace.json.gz (tests/policy_trace.py says when it was
recorded; scripts/decode_trace.py does the same for whole decodes of the default target)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from policy_trace import SCENARIOS, run

RECORDED = json.loads(gzip.decompress((Path(__file__).parent / "fixtures" / "policy_trace.json.gz").read_bytes()))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_the_policy_makes_the_recorded_choices(scenario):
    trace = json.loads(json.dumps(run(scenario)))
    recorded = RECORDED[scenario.name]
    assert len(trace) == len(recorded)
    for cycle, (now, then) in enumerate(zip(trace, recorded)):
        assert now == then, f"cycle {cycle} of {scenario.name}"


def test_the_trace_exercises_every_kind_of_choice():
    """Probes, fallbacks, skipped draft passes, lookup, trees of both kinds and plain steps all occur:
    a trace without them would show nothing about them."""
    cycles = [c for trace in RECORDED.values() for c in trace]
    assert sum(c[1] and c[2] for c in cycles) > 10                  # probes
    assert sum(1 for c in cycles if c[-1] > 0) > 500                # cycles in a fallback
    assert sum(c[0] and not c[2] for c in cycles) > 100             # planned, but the draft pass skipped
    sources = [s for c in cycles for s in c[4]]
    assert all(sources.count(s) > 50 for s in ("draft", "lookup", "tree", ""))
    assert sum("lattice" in c[7] for c in cycles) > 10 and sum("lookup" in c[7] for c in cycles) > 10

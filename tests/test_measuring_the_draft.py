"""Commands that measure the draft itself (analyze, cycle profiles, yardstick, ablation, export's
check) decode with the `draft` proposer: the default `hybrid` would mix lookup's tokens into what
they report as the draft's acceptance, and the draft's path alone: a second branch from its
lattice would add the tree's wins to it."""
from __future__ import annotations

from dataclasses import replace

from dflash2.argparsing import ModelSettings
from dflash2.pipeline import build_pipeline


def test_measuring_the_draft_pins_the_proposer_unless_one_was_asked():
    assert ModelSettings().measuring_the_draft().proposer == "draft"
    assert ModelSettings(proposer="lookup").measuring_the_draft().proposer == "lookup"
    tiny = build_pipeline(ModelSettings(tiny=True).measuring_the_draft())
    assert tiny.decoder.draft is not None and not tiny.decoder.lattice
    assert build_pipeline(replace(ModelSettings(tiny=True), lattice=True)).decoder.lattice


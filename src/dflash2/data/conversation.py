"""A prompt as every prompt source hands it on.

Contract: `Conversation(dataset, id, turns)`: the dataset it came from, an id (a string) and the
user turns in order. The model's replies are never stored here: a benchmark or regeneration run
generates them (turn k+1 is sent after the target's own answer to turn k).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Conversation:
    """User turns of one conversation; the model's replies are generated, never stored here."""

    dataset: str
    id: str
    turns: list[str] = field(default_factory=list)

    @property
    def prompt(self) -> str:
        """The first user turn."""
        return self.turns[0]

"""What a knob offers the search from the best of now: `Offer`, a move with the finding it answers, made from a
`Best` (the best's settings and what its trace advises).

A knob whose module defines `offer(best) -> Offer | None` is proposed by the search wherever that returns a move
(`advisor.search.strategy` turns it into a proposal on the best, ranks it by expected improvement with every
other candidate, and keeps or reverts it by the same rules). The ladders that follow the session's history (the
workers, the batch) and the knobs one finding's advice turns on (`Knob.advice`) are the strategy's own. Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROUND_GAIN = 0.02  # what a change no rule advises is ranked at: a measured experiment, tried last


@dataclass(frozen=True)
class Best:
    """The best of now as a knob's offer reads it."""

    knobs: Any  # its settings, one attribute a knob (`advisor.trials.knobs.Knobs`)
    advice: dict[str, Any]  # its trace's recommendations by finding id (predicted_gain, knobs, bound)
    bound: str | None  # what bounds its step ("input", "copy", "compute", ...)
    device: dict[str, Any]  # the session's device facts (type, gpu)
    cores: int  # the CPU cores one rank has
    workers: int  # DataLoader workers in effect (set, or the script's)
    threads: int | None  # torch threads in effect (set, or the script's)
    space: Any  # the values the search may give (`SearchSpace`: allows, permits, amp, pinned_copies)
    ranks: int  # processes per node

    @property
    def accelerator(self) -> bool:
        """Whether the trials run on CUDA."""
        return self.device.get("type") == "cuda"


@dataclass(frozen=True)
class Offer:
    """A move a knob offers: its moves (knob → value), how it reads, its folder's slug, the gain its advice
    predicts (else its place in the round), the bound it addresses, whether that gain is a prediction, and the id
    of the change it is proposed as (None: the knob's `proposed_as`)."""

    moves: dict[str, Any]
    change: str
    slug: str
    gain: float
    bound: str | None
    predicted: bool = True
    recommendation: str | None = None

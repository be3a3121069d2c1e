"""What a proposal is, and the one way it is made: the current best's settings with its moves applied.

Every proposal, whatever path makes it (first moves, pairs, late pairs, swaps, re-tries, recoveries, the
user's --try), is made by `on_best`: the best's settings with its *moves* (knob → value) applied. A change
proposed again later carries its moves, never the settings of its time; `check_on_best` holds each trial
to that before it runs (`ProposalError`: a bug of the search, never the user's). Pure and torch-free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from advisor.search.record import TrialRow
from advisor.knobs import COMPANIONS
from advisor.trials.knobs import Knobs


@dataclass(frozen=True)
class Proposal:
    """A candidate next trial: the change, the knobs it gives, why, and the bound it addresses."""

    recommendation: str
    change: str
    slug: str
    knobs: Knobs
    predicted_gain: float
    bound: str | None = None
    helps_now: bool = True
    why: str | None = None  # why it is tried, where not the bound (a setting the user asked for)
    base: Knobs | None = None  # the best's settings it was made on; None: a re-measure of a setting, not a move
    moves: tuple[tuple[str, Any], ...] = ()  # knob → value, each knob once: knobs == base + moves
    # Whether `predicted_gain` is a prediction (the what-if model's or a rule's); else only the proposal's place
    # in the order (a round over the knobs, a knob taken off, a --try no advice speaks for): "no prediction".
    predicted: bool = True
    # The share of the step the trace says the change can take back at most (a loader wait); None: none bounds it.
    recoverable: float | None = None

    @property
    def move_dict(self) -> dict[str, Any]:
        """The moves as a mapping."""
        return dict(self.moves)


class ProposalError(RuntimeError):
    """A proposal that breaks the search's invariant (a bug of the search, not of the user's script)."""


def on_best(best: Knobs, moves: dict[str, Any], recommendation: str, change: str, slug: str,
            predicted_gain: float, bound: str | None = None, helps_now: bool = True,
            why: str | None = None, predicted: bool = True, recoverable: float | None = None) -> Proposal:
    """The one way a proposal is made: the best's settings `best` with `moves` (knob → value) applied."""
    return Proposal(recommendation, change, slug, dataclasses.replace(best, **moves), predicted_gain, bound,
                    helps_now, why, best, tuple(sorted(moves.items())), predicted, recoverable)


def merged_moves(*groups: dict[str, Any]) -> dict[str, Any] | None:
    """Several changes' moves as one change; None where two give one knob different values (a pair never
    holds two values of one knob)."""
    merged: dict[str, Any] = {}
    for moves in groups:
        for knob, value in moves.items():
            if knob in merged and merged[knob] != value:
                return None
            merged[knob] = value
    return merged


def check_on_best(proposal: Proposal, best: Knobs) -> None:
    """The invariant of every trial the search proposes: made on `best` (the best the decision compares
    against), its knobs the base with its moves applied, each knob moved once, and a move that changes
    something. A re-measure (no base) is exempt."""
    if proposal.base is None:
        return
    knobs = [k for k, _ in proposal.moves]
    if len(set(knobs)) != len(knobs):
        raise ProposalError(f"{proposal.change}: two values of one knob in one trial ({knobs})")
    if proposal.base != best:
        raise ProposalError(f"{proposal.change}: made on {proposal.base.label()}, but the best is {best.label()}")
    if proposal.knobs != dataclasses.replace(proposal.base, **proposal.move_dict):
        raise ProposalError(f"{proposal.change}: its knobs are not its base with its moves applied")
    if proposal.knobs == best and proposal.moves:
        raise ProposalError(f"{proposal.change}: its moves change nothing on the best")


def own_moves(moves: dict[str, Any], best: Knobs, user: dict[str, Any]) -> dict[str, Any]:
    """The moves that set a knob to what it is in effect already: the best's value, else the script's own
    (its autocast, its fused optimizer, its loader's workers...). A proposal holding one is never made: it
    would measure and credit what the script did all along."""
    now = best.to_dict()
    return {k: v for k, v in moves.items()
            if k not in COMPANIONS and (now.get(k) if now.get(k) is not None else user.get(k)) == v}


def moves_of(row: TrialRow, base_knobs: dict[str, Any] | None) -> dict[str, Any]:
    """A recorded trial's moves: as its row says, or (a record from before rows kept them) what its knobs
    turned from the best it was measured against."""
    if isinstance(row.get("moves"), dict):
        return dict(row.moves)
    before = base_knobs or {}
    return {k: v for k, v in row.knobs.items() if v != before.get(k)}

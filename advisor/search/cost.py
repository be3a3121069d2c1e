"""What a trial costs in wall time, and what that buys: candidates priced by their seconds (a compile's first steps
hold the compile: each knob's `first_steps_held`), a compile that measured slower not compiled again in another
layout, and the time left to the answer. Pure functions over the session record and its trials' records. Torch-free.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from advisor.knobs import KNOBS, compiled
from advisor.search.record import SessionRecord, TrialRow
from advisor.search.expected import value
from advisor.search.proposal import Proposal
from advisor.search.timing import row_record, session_time, trial_time

TRIAL_PRIOR_S = 10.0  # a trial's wall time before the session has timed one
HOLDING = tuple(k for k in KNOBS if k.first_steps_held)  # their first steps hold more than a step (a compile)
LAYOUTS = frozenset(k.name for k in KNOBS if k.layout)


def held_s(row: TrialRow) -> float:
    """What a trial's first steps held beyond its steps (its compile), in seconds."""
    return sum(k.first_steps_held(row) or 0.0 for k in HOLDING)


def trial_seconds(out: Path, state: SessionRecord) -> float:
    """A trial's wall time in this session: the median of its trials' (start to end), less what a compile held;
    TRIAL_PRIOR_S before any was timed."""
    spans = []
    for row in state.trials or []:
        own = trial_time(row_record(out, row))
        if own is not None and own["duration_s"] > 0:
            spans.append(own["duration_s"] - held_s(row))
    return statistics.median(spans) if spans else TRIAL_PRIOR_S


def first_steps_seconds(knob: Any, state: SessionRecord) -> float:
    """What the knob's first steps will add to a trial: the longest this session's took on this machine (the first
    compile of a graph; a second one of the same graph is a cache hit), else its prior."""
    measured = [s for t in state.trials or [] if (s := knob.first_steps_held(t)) is not None]
    return max(measured) if measured else knob.first_steps_prior_s


def seconds(proposal: Proposal, out: Path, state: SessionRecord) -> float:
    """A candidate's price in wall time: a trial's, and its first steps' (a compile's) on top where it turns on a
    knob that holds them in a setting not run before in this session."""
    run_before = any(t.knobs == proposal.knobs.to_dict() for t in state.trials or [])
    extra = sum(first_steps_seconds(k, state) for k in HOLDING if getattr(proposal.knobs, k.name) and not run_before)
    return trial_seconds(out, state) + extra


def by_cost(proposals: list[Proposal], out: Path, state: SessionRecord) -> list[Proposal]:
    """The candidates by expected improvement per second of wall time (the strategy's order among equals): a
    compile's gain must pay for its compile as well as its trial."""
    if not any(getattr(p.knobs, k.name) for p in proposals for k in HOLDING):
        return proposals  # every trial costs about the same: the strategy's order stands
    price = {id(p): seconds(p, out, state) for p in proposals}
    order = {id(p): i for i, p in enumerate(proposals)}
    return sorted(proposals, key=lambda p: (-round(value(p, state) / price[id(p)], 9), order[id(p)]))


def slower_compile(proposal: Proposal, decision: Any, second: Proposal | None, min_gain: float) -> bool:
    """Whether a follow-up `second` would compile again in another layout after the compile `proposal` measured
    slower beyond its noise: not done unless the model says the layout was the cause (it predicts the compile
    without it to gain at least `min_gain`)."""
    if second is None or decision is None or not compiled(proposal.knobs) or not compiled(second.knobs):
        return False
    if decision.gain >= -decision.noise:  # within the noise, or faster: the swap may still tell
        return False
    layout_only = {k for k, v in proposal.knobs.to_dict().items() if second.knobs.to_dict().get(k) != v} <= LAYOUTS
    return layout_only and not (second.predicted and second.predicted_gain >= min_gain)


def answer_seconds(out: Path, state: SessionRecord, max_trials: int, running: int = 1,
                   time_budget_s: float | None = None) -> float:
    """The time left to the answer, at most: the trials the budget still allows after the `running` ones, each a
    trial's time in this session; no more than what the --time-budget leaves after the trial running now."""
    per = trial_seconds(out, state)
    answer = max(0, max_trials - len(state.trials or []) - running) * per
    if time_budget_s is not None:
        spent = (session_time(out, state) or {}).get("wall_s", 0.0)
        answer = min(answer, max(0.0, time_budget_s - spent - per))
    return answer

"""Expected improvement: one scale on which every candidate trial is ranked, a first move, a pair or a re-measure.

A candidate carries a predicted gain μ (the what-if model's, else the rules' figure: a relative change of
samples/s) and an uncertainty σ: the prior spread of that kind of change on this kind of device. The session's
own measured rows of that kind correct both (`calibrated`): a miss measured from the best of now moves the
next price by what it missed, a miss from an earlier best widens σ. Its value is the expected
improvement over the best, E[max(0, X)] for X ~ N(μ, σ²) = μ·Φ(μ/σ) + σ·φ(μ/σ): a change the model prices at
+0 % is still worth a trial where its spread is wide (AMP under fp32 matrix products, pinned copies beside
a loader that binds), and a re-measure of a move read within its noise is worth only what it can still
change (its gain, with the standard error of one more measurement). Bayesian optimisation's acquisition
function, on the what-if model as the surrogate. The arithmetic and the priors are `advisor.analysis.worth`'s,
which ranks a diagnosis's advice on the same scale (a spread never wider than what the trace's evidence can
take back). Pure functions over the session record.
"""

from __future__ import annotations

import math
from typing import Any

from advisor.search.record import SessionRecord, TrialRow
from advisor.analysis.worth import EVIDENCE, expected_improvement, kinds, prior_spread, samples_gain, worth
from advisor.search.predictions import predicted_change, session_params
from advisor.search.proposal import Proposal

# Of the model's error on a kind of change from one best (its spread's variance), the part the kind's settings
# share: a worker count the model overpriced by 80 points at 2 workers is overpriced at 4 too (the cost of moving
# batches between processes it leaves out is the same), while a setting's own part keeps a neighbour worth a
# trial where the miss was small.
SHARED = 0.8


def calibrated(recommendation: str | None, state: SessionRecord, prior: float,
               priced: float | None = None) -> tuple[float, float]:
    """What the session's own measured rows of this kind of change say of the model's next price of it: (the
    shift of its mean, its σ).

    Rows measured from another best (the step has changed since) only narrow or widen the spread: each row's
    error counts as one more draw beside the prior. Rows measured from the best of now that the model priced as
    it prices this setting (`priced`, a relative change of samples/s), within one standard error of the row's
    measurement (its noise is two), are settings it cannot tell apart on this step (the rungs of a ladder, all
    priced alike), so they share its error here: of its variance SHARED is common to them, the rest each
    setting's own. Each such row's error (measured less predicted) is one draw of the common part, with its
    setting's own part and its measurement's noise; the posterior of the common part moves the mean, and its
    variance with a new setting's own part makes the σ. No row of the kind: (0, prior)."""
    mine = set(kinds(recommendation))
    rows = [t for t in state.trials or [] if t.get("predicted_samples_gain") is not None
            and t.gain is not None and set(kinds(t.recommendation)) == mine]
    # Each row's price as the model gives it now, calibrated on what the session measured: a miss the
    # calibration has taken in (a worker hand-off learnt from the trial that missed) is not counted again. The
    # calibration is read once for both uses below; a sketch of a session (trials without names) has none.
    named = rows and all(t.name for t in state.trials or [])
    params = session_params(state) if named else None
    now = repriced(state, rows, params)
    here, elsewhere = [], []
    for t in rows:
        alike = (priced is not None and t.get("base") is not None and t.base == state.best
                 and abs(now[id(t)] - priced) <= (t.noise or 0.0) / 2)
        (here if alike else elsewhere).append(t)
    errors = [t.gain - now[id(t)] for t in elsewhere]
    # A parameter the calibration took from these rows explains them by construction: each spends one row's say
    # on the spread (degrees of freedom), so a miss just absorbed neither widens σ nor narrows it to nothing.
    spent = fitted(state, rows, params)
    sigma = math.sqrt((prior ** 2 + sum(e * e for e in errors)) / max(1, 1 + len(errors) - spent))
    if not here or sigma <= 0:
        return 0.0, sigma
    own = (1 - SHARED) * sigma ** 2
    draws = [(t.gain - now[id(t)], own + (t.noise or 0.0) ** 2 / 4) for t in here]
    precision = 1 / (SHARED * sigma ** 2) + sum(1 / v for _, v in draws)
    return sum(e / v for e, v in draws) / precision, math.sqrt(1 / precision + own)


def fitted(state: SessionRecord, rows: list[TrialRow], params: dict[str, float] | None) -> int:
    """How many of the model's parameters (`params`, the session's calibration; None: none read) the calibration
    takes from these rows: those it sets otherwise when they are left out."""
    names = frozenset(t.name for t in rows if t.name)
    if params is None or not names:
        return 0
    without = session_params(state, names)
    return sum(1 for k, v in params.items() if without.get(k) != v)


def repriced(state: SessionRecord, rows: list[TrialRow],
             params: dict[str, float] | None) -> dict[int, float]:
    """Each measured row's predicted change of samples/s (by the row's id) by the model as calibrated now
    (`params`, the session's `session_params`), where the model prices it; else (or with no params) the price it
    ran at."""
    trials = {t.name: t for t in state.trials or []}
    out = {}
    for t in rows:
        base = trials.get(t.get("base")) if params is not None and t.get("base") is not None else None
        now = predicted_change(state, t.base, base.knobs, t.knobs, params) if base is not None else None
        out[id(t)] = t.predicted_samples_gain if now is None else now
    return out


def prior_for(recommendation: str | None, state: SessionRecord, helps_now: bool = False) -> float:
    """σ of a change of this kind on this session's device before the session measured any: wider where it
    addresses the bound the trace shows."""
    accelerator = (state.device or {}).get("type") == "cuda"
    return prior_spread(recommendation, accelerator) * (EVIDENCE if helps_now else 1.0)


def value(proposal: Proposal, state: SessionRecord) -> float:
    """The expected improvement of a proposal over the best: its predicted gain moved by what the session
    measured of its kind, with its kind's spread (`calibrated`)."""
    prior = prior_for(proposal.recommendation, state, proposal.helps_now)
    shift, sigma = calibrated(proposal.recommendation, state, prior,
                              samples_gain(min(proposal.predicted_gain, 1 - 1e-3)))
    return worth(proposal.predicted_gain, sigma, proposal.recoverable, shift)


def rank(proposals: list[Proposal], state: SessionRecord) -> list[Proposal]:
    """Proposals by expected improvement, the largest first (ties: those that address the bound)."""
    return sorted(proposals, key=lambda p: (-round(value(p, state), 6), not p.helps_now, -p.predicted_gain))


def remeasure_value(gain: float, noise: float) -> float:
    """What measuring a move read within its noise once more can still change: the expected improvement of its
    gain as read, with one more measurement's standard error (`noise` is two of the difference's)."""
    return expected_improvement(gain, noise / 2)


def measured_kinds(state: SessionRecord) -> set[str]:
    """The kinds of change some trial of the session measured, as a first move or in a pair."""
    return {k for t in state.trials or [] if t.status == "ok" for k in kinds(t.recommendation)}


def untried(proposals: list[Proposal], state: SessionRecord, done: set[str] | None = None) -> list[Proposal]:
    """The proposals whose kind of change no trial of the session has measured yet (`done`: those kinds, where
    the caller knows more): levers the trace points at, not yet measured on any best."""
    done = measured_kinds(state) if done is None else done
    return [p for p in proposals if not set(kinds(p.recommendation)) & done]


def deferred_for(decision: Any, proposal: Proposal, others: list[Proposal], state: SessionRecord) -> str | None:
    """Why a move read within its noise is not measured again now, or None: a lever the session has not measured
    yet (of `others`, the proposals after it) is worth more than the re-measure can still change."""
    if decision is None:
        return None
    levers = untried(others, state, measured_kinds(state) | set(kinds(proposal.recommendation)))
    if not levers:
        return None
    worth, rival = max(((value(p, state), p) for p in levers), key=lambda pair: pair[0])
    again = remeasure_value(decision.gain, decision.noise)
    if worth <= again:
        return None
    return f"{rival.change}, not measured yet, is worth more (expected {100 * worth:+.1f}% against " \
           f"{100 * again:+.1f}% for this once more)"


def levers_left(proposals: list[Proposal], state: SessionRecord) -> str:
    """Where the budget ends before every lever the trace points at was measured: those left, kept in the record
    (`unmeasured`) and said after the stop's note ("" where none is left)."""
    left = untried(proposals, state)
    state.unmeasured = [p.change for p in left]
    return f"; never measured: {', '.join(state.unmeasured)}" if left else ""

"""The predicted gain each proposal carries, from the what-if model, corrected by what the session measured.

Each best trial's step graph (`advisor.analysis.whatif.step_graph`) is kept in the session record when it
is diagnosed (the record's `graphs`); a proposal's change from that best is simulated on it, with the
model's parameters calibrated from every trial the session measured so far (each row's `base`, the best
it was tried against, its measured gain and the knobs it turned): the AMP speed-up of this script's
kernels, the batch scaling, what the workers delivered. Changes the model has no transformation for
(TF32, cuDNN autotuning, DDP's arguments, prefetch depth) keep the rules' figure. The session's
own prediction error (median absolute, sign agreement) is kept for the report. Pure functions over the
session record.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from advisor.search.record import PredictionError, SessionRecord, TrialRow
from advisor.knobs import COMPANIONS, MODELLED, ORDERED, making
from advisor.analysis.whatif import StepGraph, calibrate, predict, step_graph
from advisor.trials.knobs import Knobs

NOT_PREDICTIONS = ("confirm",)  # re-measures of a setting already measured: no change was predicted


def _changed(row: TrialRow) -> bool:
    """Whether a row measured a change that was predicted: not a re-measure, nor a knob found not applicable."""
    return row.recommendation not in NOT_PREDICTIONS and row.decision != "not applicable"


def remember_graph(state: SessionRecord, name: str, diagnosis: Any) -> None:
    """Keep the step graph of a diagnosed trial (the best, before proposals are made from it)."""
    graph = step_graph(diagnosis) if diagnosis is not None else None
    if graph is not None:
        state.setdefault("graphs", {})[name] = dataclasses.asdict(graph)


def graph_of(state: SessionRecord, name: str | None) -> StepGraph | None:
    """The step graph kept for a trial, or None."""
    data = (state.get("graphs") or {}).get(name) if name else None
    return StepGraph(**data) if isinstance(data, dict) else None


def model_changes(before: Knobs | dict[str, Any], after: Knobs | dict[str, Any],
                  user_values: dict[str, Any]) -> dict[str, Any] | None:
    """What a change sets, in the model's terms (knob → the effective value after it); None when it turns
    a knob the model has no transformation for (`advisor.knobs.MODELLED`), or nothing."""
    a = before.to_dict() if isinstance(before, Knobs) else dict(before)
    b = after.to_dict() if isinstance(after, Knobs) else dict(after)
    turned = {k for k, v in b.items() if v != a.get(k)} - COMPANIONS  # persistent_workers goes with the workers
    if not turned or turned - set(MODELLED):
        return None

    def value(knobs: dict[str, Any], name: str) -> Any:
        v = knobs.get(name)
        return user_values.get(name) if v is None else v
    out: dict[str, Any] = {}
    for k in sorted(turned):
        term = MODELLED[k].term
        if k in ORDERED:  # a count
            v = value(b, k)
            if v is None:
                return None
            out[term] = int(v or 0)
        else:  # a flag, on where each knob that makes the change is (pinned copies: pin_memory and non_blocking)
            out[term] = all(bool(value(b, n)) for n in making(term))
    return out


def observations(state: SessionRecord, leave_out: frozenset[str] = frozenset()
                 ) -> list[tuple[StepGraph, dict[str, Any], float]]:
    """(base graph, change, measured relative change of samples/s) of every measured trial of the session (but
    those named in `leave_out`): the gain its decision read (against the best measured again beside it where the
    load had changed, pooled at one load), else its first figure over its base's: a trial's first figure and its
    base's read at two loads."""
    rows = {t.name: t for t in state.trials or []}
    out = []
    for t in rows.values():
        if t.name in leave_out:
            continue
        base = rows.get(t.get("base"))
        graph = graph_of(state, t.get("base"))
        if base is None or graph is None or t.status != "ok" or not _changed(t):
            continue
        if not t.samples_per_s or not base.samples_per_s:
            continue
        changes = model_changes(base.knobs, t.knobs, state.user_values or {})
        if changes is not None:
            gain = t.gain
            out.append((graph, changes, gain if gain is not None else t.samples_per_s / base.samples_per_s - 1))
    return out


def session_params(state: SessionRecord, leave_out: frozenset[str] = frozenset()) -> dict[str, float]:
    """The model's parameters for this script and device: the priors, corrected by what was measured (but the
    trials named in `leave_out`)."""
    return calibrate(observations(state, leave_out))


def predicted_change(state: SessionRecord, base_name: str, before: Knobs | dict[str, Any],
                     after: Knobs | dict[str, Any], params: dict[str, float] | None = None) -> float | None:
    """The model's relative change of samples/s from the trial `base_name` (knobs `before`) to `after`;
    None where it has no graph of the base or no transformation for the change."""
    graph = graph_of(state, base_name)
    changes = model_changes(before, after, state.user_values or {})
    if graph is None or changes is None:
        return None
    return predict(graph, changes, session_params(state) if params is None else params)


def step_share(samples_change: float) -> float:
    """A relative change of samples/s as the share of step time it saves (the unit proposals carry):
    the inverse of `advisor.search.state.samples_gain`."""
    return 1 - 1 / (1 + max(samples_change, -0.99))


def reprice(proposals: list[Any], state: SessionRecord, name: str, knobs: Knobs | dict[str, Any]) -> list[Any]:
    """Proposals with the model's predicted gain where it can simulate the change from the trial `name`
    (the best, with `knobs`)."""
    if graph_of(state, name) is None:
        return proposals
    params = session_params(state)
    out = []
    for p in proposals:
        change = predicted_change(state, name, knobs, p.knobs, params)
        out.append(p if change is None else dataclasses.replace(p, predicted_gain=step_share(change), predicted=True))
    return out


def prediction_error(state: SessionRecord) -> PredictionError | None:
    """How far the session's predictions were from what it measured: over its trials with both, the median
    absolute difference of the relative changes of samples/s, and the share whose signs agreed."""
    pairs = [(t.predicted_samples_gain, t.gain) for t in state.trials or []
             if t.get("predicted_samples_gain") is not None and t.gain is not None
             and _changed(t)]
    if not pairs:
        return None
    return PredictionError(trials=len(pairs), median_abs=statistics.median(abs(p - m) for p, m in pairs),
                           sign_agreement=sum((p > 0) == (m > 0) for p, m in pairs) / len(pairs))

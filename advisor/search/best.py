"""The best of now, as the loop holds it: its trial (with the knobs it found not applicable dropped), its
diagnosis, measurement and bound (kept in the record), and what keeping a candidate makes of it. Torch-free."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from advisor.search.record import BestBound, SessionRecord
from advisor.search.applicable import applied_only
from advisor.search.bounds import Bound, trial_bound
from advisor.search.predictions import remember_graph
from advisor.search.state import best_row
from advisor.search.trial_runner import diagnose_trial, measured
from advisor.trials.record import TrialResult, load_trial
from advisor.trials.record.measurement import Measurement


def best_trial(out: Path, state: SessionRecord) -> TrialResult:
    """The record's best trial, as the base of what follows."""
    return applied_only(load_trial(out / best_row(state).folder))


def measured_best(out: Path, state: SessionRecord) -> Measurement:
    """The best as measured last (its runs pooled)."""
    return measured(out, state, load_trial(out / best_row(state).folder))


def bound_of(out: Path, state: SessionRecord, best: TrialResult) -> tuple[Any, Measurement, Bound]:
    """Diagnosis, measurement and bound of the best trial; the bound, its step graph and its recommendations are
    kept in the record."""
    diagnosis = diagnose_trial(best)
    measurement = measured(out, state, best)
    bound = trial_bound(best.status, diagnosis, measurement)
    state.bound = BestBound(name=bound.name, label=bound.label, evidence=list(bound.evidence))
    remember_graph(state, best.name, diagnosis)
    state.recommendations = [dataclasses.asdict(r) for r in diagnosis.recommendations] if diagnosis else []
    return diagnosis, measurement, bound


def keep(state: SessionRecord, result: TrialResult) -> TrialResult:
    """A candidate kept: the record's best and final settings are its own; it, as the base of what follows."""
    best = applied_only(result)
    state.best = result.name
    state.final_knobs = best.knobs.to_dict()
    return best

"""Re-measures beside the loop: the best run again beside a candidate when the machine changed (the end's
confirmation is `advisor.search.ending`'s), a decision made at one load where no trial is left for that, and
every run of a setting, pooled. Torch-free."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from advisor.search.record import SessionRecord, TrialRow
from advisor.search.applicable import in_effect
from advisor.search.budget import reserve
from advisor.search.decision import Decision
from advisor.search.drift import at_one_load, holds_across_loads, load_text, machine_changed
from advisor.search.proposal import Proposal
from advisor.search.state import SessionOptions, best_row, trial_row
from advisor.search.strategy import knobs_key
from advisor.search.trial_runner import TrialRunner, figures_text, measure_record, own_bound, run_one, trial_record
from advisor.trials.knobs import Knobs
from advisor.trials.record.adaptive import Against, windows_target
from advisor.trials.record.measurement import Measurement


def beside_best(run: TrialRunner, out: Path, state: SessionRecord, options: SessionOptions,
                record: dict[str, Any], index: int, log: Callable[[str], None], in_time: bool = True):
    """When the measurements say the machine changed (`advisor.search.drift`), run the best once more,
    right after the candidate: (its row, the best's and the candidate's measurements at one load, why); both
    measurements None when that run failed, the candidate's alone (with the best's as just measured) when
    none of its windows ran at a load the best ran at; None when nothing changed or the budget has no room (its
    trials, or `in_time`: the --time-budget's, `Policy.time_for`)."""
    # Within the budget less the trials kept back for confirming the best at the end.
    if not run.remeasure or not in_time or len(state.trials) + 2 > options.max_trials - reserve(options, run):
        return None
    top, runs = best_row(state), best_runs(out, state)
    changed = machine_changed(runs, record)
    if changed is None:
        return None
    log(f"  {changed}: measuring the best ({top.name}) again beside it")
    proposal = once_more(top, "the best, measured again", "best-again")
    # All its windows: they are the best's at this load, which the speedup at one load reads too (ended once settled
    # against the candidate, a strong drift's replays read their speedups 14 % off instead of within 10 %).
    fresh, fresh_record, fresh_measure = run_one(run, state, index + 1, proposal, "best-again", log)
    row = trial_row(index + 1, fresh, fresh_record, proposal, state, fresh_measure if fresh.ok else None,
                    own_bound(fresh, fresh_measure) if fresh.ok else None)
    row.update(decision="measured" if fresh.ok else "failed", load=load_text(fresh_record),
               reason=f"{top.name} again, beside trial {index:02d}: {changed}" if fresh.ok else
               f"trial {fresh.status}: {fresh.message}")
    log(f"  {figures_text(row, state.unit)}: the best as measured now")
    if not fresh.ok:
        return row, None, None, changed
    # The load may have moved again by the time the best ran: the two decide on their windows at one load
    # (this run of the best or earlier ones); where none ran at one load the candidate's measurement is None.
    matched = measured_at_one_load([fresh_record, *runs_of(out, state, top.knobs)], [record])
    return (row, *(matched or (fresh_measure, None)), changed)

def settling(measurement: Measurement, options: SessionOptions) -> Against | None:
    """What a re-measure's windows are compared with: `measurement` (the other side of its comparison); they end
    once settled against it, and never after the session's windows (a re-measure is never longer than a trial)."""
    target = windows_target(measurement.samples_per_s, measurement.relative_se, options.min_gain, options.windows)
    return dataclasses.replace(target, max_windows=options.windows) if target is not None else None


def run_folders(out: Path, state: SessionRecord, row: TrialRow) -> list[Path]:
    """The folders of a row's runs: its own, then those pooled with it."""
    return [out / row.folder, *(out / f for f in state.pooled.get(row.name, []))]

def best_runs(out: Path, state: SessionRecord) -> list[dict[str, Any]]:
    """The best's records: its own run, then those pooled with it."""
    return [trial_record(folder) for folder in run_folders(out, state, best_row(state))]

def without_best_again(out: Path, state: SessionRecord, record: dict[str, Any], decision: Decision,
                       decide_on: Callable[[Measurement, Measurement], Decision]) -> tuple[Decision, str | None]:
    """The decision on a candidate where the machine changed since the best ran, and no trial was left to run the
    best again beside it (`beside_best`): made on the two settings' windows at one load where there are some
    (`decide_on`), else standing only where the load worked against it (`across_loads`); with why the machine
    changed (None: it did not, and the decision is as it was). A loaded drift_live session, out of room for the
    best again, kept batch 64 at +178 % (noise 147 %) over a best measured under a CPU hog."""
    changed = machine_changed(best_runs(out, state), record)
    if changed is None:
        return decision, None
    top = best_row(state)
    matched = measured_at_one_load(runs_of(out, state, top.knobs), [record])
    if matched is not None:
        return decide_on(*matched), changed
    return across_loads(decision, record, trial_record(out / top.folder), False), changed

def measured_at_one_load(a_runs: list[dict[str, Any]],
                         b_runs: list[dict[str, Any]]) -> tuple[Measurement, Measurement] | None:
    """The measurements of two settings' runs cut to their windows at one load (`drift.at_one_load`), or None."""
    matched = at_one_load(a_runs, b_runs)
    return (measure_record(matched[0]), measure_record(matched[1])) if matched is not None else None

def across_loads(decision: Decision, candidate: dict[str, Any], best: dict[str, Any], again: bool) -> Decision:
    """A decision between a candidate and the best run at two loads: it stands where the load only worked
    against it, with no trial left to measure again; else nothing is kept (the candidate runs `again`)."""
    if not again and holds_across_loads(decision.keep, candidate, best):
        side = "less" if decision.keep else "more"  # of the machine than the best had
        return dataclasses.replace(decision, inconclusive=False, reason=f"{decision.reason}; measured with {side} "
                                   "of the machine than the best, which only worked against this result")
    why = "not measured at the load the best ran at" + (", measured again" if again else "")
    return dataclasses.replace(decision, keep=False, inconclusive=False, reason=f"{why}: {decision.reason}")

def beside_fresh_best(out: Path, state: SessionRecord, best: TrialRow, fresh_best: Measurement,
                      candidate_runs: list[dict[str, Any]]) -> tuple[Measurement, Measurement]:
    """A candidate run again after the best was measured at another load: the best's and the candidate's
    windows at one load where there are some, else the best as measured last and the candidate's latest run."""
    return (measured_at_one_load(runs_of(out, state, best.knobs), candidate_runs)
            or (fresh_best, measure_record(candidate_runs[:1])))

def runs_of(out: Path, state: SessionRecord, knobs: dict[str, Any]) -> list[dict[str, Any]]:
    """The records of every run of a setting that measured, latest first."""
    key = knobs_key(knobs)
    return [trial_record(out / t.folder) for t in reversed(state.trials)
            if t.status == "ok" and t.samples_per_s and knobs_key(t.knobs) == key]

def once_more(row: TrialRow, why: str, bound: str) -> Proposal:
    """A setting of the session run again as it ran (its knobs in effect), `why` added to its first change."""
    return Proposal("confirm", f"{first_change(row.change)} ({why})", bound, Knobs.from_dict(in_effect(row)), 0.0,
                    predicted=False)

def first_change(change: str) -> str:
    """A row's change as first tried, without what a re-measure added to it."""
    for suffix in (" (confirming the best)", " (the best, measured again)", " (again)"):
        change = change.removesuffix(suffix)
    return change

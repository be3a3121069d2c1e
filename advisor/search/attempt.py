"""One trial of the search: a proposal made on the best, run, judged against that best (beside the best measured
again where the machine changed), its row recorded, and an inconclusive gain measured once more where nothing
the session has not measured yet is worth more. Torch-free: the trial runs in the policy's runner."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import msgspec

from advisor.search.record import SessionRecord
from advisor.search.applicable import not_applicable, refused_knobs
from advisor.search.decision import Decision
from advisor.search.drift import load_text
from advisor.search.expected import deferred_for
from advisor.search.policy import Policy
from advisor.search.predictions import prediction_error
from advisor.search.proposal import Proposal, check_on_best
from advisor.search.draws import between, measured_spread
from advisor.search.remeasures import across_loads, beside_best, beside_fresh_best, run_folders, settling, \
    without_best_again
from advisor.search.simplify import keep_simpler, simplifies
from advisor.analysis.worth import samples_gain
from advisor.knobs.compile import note_payback, row_text
from advisor.search.state import best_row, save, trial_row
from advisor.search.trial_runner import decide_row, figures_text, measured, own_bound, predicted_text, \
    recorded_losses, run_one, trial_record
from advisor.trials.knobs import Knobs
from advisor.trials.record import TrialResult
from advisor.trials.record.adaptive import windows_target
from advisor.trials.record.measurement import Measurement

GIVES_WAY = "in place of "  # a proposal's `why` that names the setting it stands in for (one that failed)


def attempt(policy: Policy, state: SessionRecord, proposal: Proposal, why: str, best_knobs: Knobs,
            best_measure: Measurement, reference_losses: list[float], log: Callable[[str], None],
            others: list[Proposal] = ()) -> tuple[TrialResult, Decision | None]:
    """Run a proposal made on the best (`best_knobs`, measured as `best_measure`), decide it against that best
    and record its row; an inconclusive gain is measured once more and decided on both runs together, unless a
    lever of `others` (the proposals after it) not yet measured is worth more (`deferred_for`). Returns the
    (last) result and its decision."""
    run, out, options = policy.run, policy.out, policy.options
    check_on_best(proposal, best_knobs)
    index = len(state.trials)
    # The unit the measured change will have; None where nothing predicted it.
    predicted = samples_gain(proposal.predicted_gain) if proposal.predicted else None
    log(f"trial {index:02d}: {proposal.change} ({why}; "
        + (f"predicted {100 * predicted:+.0f}% {state.unit})" if predicted is not None else "no prediction)"))
    target = windows_target(best_measure.samples_per_s, best_measure.relative_se, options.min_gain, options.windows)
    result, record, measurement = run_one(run, state, index, proposal, proposal.slug, log, target)
    losses = recorded_losses(result.path)
    beside = beside_best(run, out, state, options, record, index, log, policy.time_for(state)) if result.ok else None
    # The machine changed: decide on the best measured beside; where none of the candidate's windows ran at
    # the load the best ran at then (`unmatched`), the candidate runs again beside it before anything is decided.
    unmatched = beside is not None and beside[1] is not None and beside[2] is None
    if beside is not None and beside[1] is not None:
        best_measure, measurement = beside[1], beside[2] or measurement
    decision = policy.judge(best_measure, measurement, losses, reference_losses, proposal) if result.ok else None
    unmeasured = None  # the machine changed, and no trial was left to run the best again beside the candidate
    if beside is None and decision is not None and run.remeasure:
        decision, unmeasured = without_best_again(out, state, record, decision, lambda b, c: policy.judge(
            b, c, losses, reference_losses, proposal))
    if decision is not None and simplifies(proposal):  # one run of it against the best's runs: their draws too
        decision = keep_simpler(decision, options.min_gain,
                                between(measured_spread(state, run), 1, len(run_folders(out, state, best_row(state)))))
    row = trial_row(index, result, record, proposal, state, measurement, own_bound(result, measurement))
    row.load = load_text(record)
    # Against the best as the decision measured it (beside the candidate, when the machine changed).
    note_payback(row, msgspec.structs.replace(best_row(state), samples_per_s=best_measure.samples_per_s))
    refused = not_applicable(row, proposal, state)
    partly = bool(refused_knobs(row.get("outcomes"), row.knobs))
    # A trial whose windows followed the comparison measured to its cap already: no new process for it.
    again = decision is not None and run.remeasure and not partly and (  # partly: not what was proposed
        (decision.inconclusive and not run.adaptive and beside is None
         and len(state.trials) + 2 <= options.max_trials and policy.time_for(state))
        or (unmatched and len(state.trials) + 3 <= options.max_trials and policy.time_for(state)))
    deferred = deferred_for(decision, proposal, others, state) if again and not unmatched else None
    again = again and deferred is None
    if unmatched:
        decision = across_loads(decision, record, trial_record(out / beside[0].folder), again)
    decide_row(row, result, decision, again and not unmatched)
    row.base = state.best  # what the change was measured against: the model's calibration reads it
    if proposal.why and proposal.why.startswith(GIVES_WAY):  # the setting it stands in for, said in the row
        row.reason = f"{proposal.why}; {row.reason}"
    if refused is not None:  # nothing was changed: whatever it measured, it is not kept
        row.update(decision="not applicable", reason=refused)
        decision = dataclasses.replace(decision, keep=False, inconclusive=False) if decision is not None else None
    if beside is not None:
        row.drift = beside[3]
        row.reason = f"{beside[3]}: measured the best again beside it; {row.reason}"
    elif unmeasured is not None:  # not `drift`: that row field says the best was measured again beside it
        row.reason = f"{unmeasured}: no trial left to measure the best again beside it; {row.reason}"
    if deferred is not None:
        row.reason += f"; not measured again: {deferred}"
    state.trials.append(row)
    if beside is not None:
        state.trials.append(beside[0])
        if beside[1] is not None and (decision is None or not decision.keep):
            beside[0].update(decision="kept", reason=beside[0].reason + "; the best, as measured now")
            state.best = beside[0].name  # what comes next is compared with the figure measured now
        elif beside[1] is not None:  # the candidate beat it, measured side by side: the old best gives way
            beside[0].update(decision="reverted", reason=beside[0].reason + f"; {result.name} is faster")
    state.prediction_error = prediction_error(state)
    log(f"  {figures_text(row, state.unit)}: {row.decision}, {row.reason}{predicted_text(row)}")
    if row_text(row):
        log(f"  {row_text(row)}")
    runs = [(result, record)]
    while again:
        result, record, decision, row = once_more(policy, state, proposal, runs, best_measure, unmatched,
                                                  reference_losses, log)
        runs.insert(0, (result, record))
        # A first run that could not be compared (none of its windows at the best's load) is no reading: the run
        # beside the best is the first that counts, and one within its noise is measured once more like any other.
        again, unmatched = (unmatched and result.ok and decision is not None and decision.inconclusive
                            and decision.gain > 0 and len(state.trials) + 1 <= policy.options.max_trials
                            and policy.time_for(state)
                            and deferred_for(decision, proposal, others, state) is None), False
    return result, decision


def once_more(policy: Policy, state: SessionRecord, proposal: Proposal, runs: list[tuple[TrialResult, dict]],
              best_measure: Measurement, unmatched: bool, reference_losses: list[float],
              log: Callable[[str], None]) -> tuple[TrialResult, dict[str, Any], Decision | None, dict[str, Any]]:
    """A gain the noise could hide, measured again: the same settings run once more and decided on this run with
    the earlier ones (`runs`, latest first) at one load, or pooled with the latest; its row recorded."""
    run, out, options = policy.run, policy.out, policy.options
    save(state)
    index = len(state.trials)
    log(f"trial {index:02d}: {proposal.change}, again")
    # Its windows end once settled against the best (as measured beside it, where it was), at most the session's.
    result, record, _ = run_one(run, state, index, proposal, f"{proposal.slug}-again", log,
                                settling(best_measure, options))
    # Beside the best just measured, or after a run that was not (the machine changed): the two at one load.
    one_load = unmatched or len(runs) > 1
    if one_load and result.ok:
        best_measure, measurement = beside_fresh_best(out, state, best_row(state), best_measure,
                                                      [record, *(r for _, r in runs)])
    else:
        measurement = measured(out, state, result, [runs[0][0].path])
    losses = recorded_losses(result.path) + recorded_losses(runs[0][0].path)
    decision = policy.judge(best_measure, measurement, losses, reference_losses, proposal) if result.ok else None
    row = trial_row(index, result, record, proposal, state, measurement, own_bound(result, measurement))
    decide_row(row, result, decision, False)
    row.update(change=f"{proposal.change} (again)", base=state.best,
               reason=row.reason + (" (beside the best, at one load)" if unmatched else
                                        " (its runs at one load with the best's)" if one_load else " (both runs)"))
    state.trials.append(row)
    state.prediction_error = prediction_error(state)
    log(f"  {figures_text(row, state.unit)}: {row.decision}, {row.reason}{predicted_text(row)}")
    if decision is not None and decision.keep and not one_load:
        state.pooled[result.name] = [os.path.relpath(runs[0][0].path, out)]
    return result, record, decision, row

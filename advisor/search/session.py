"""The optimization session: baseline → diagnose → apply what addresses the bound → measure → keep or revert → …

Each trial is a real, profiled run of the user's unchanged script (advisor.trials.process.runner), or of
a notebook's step in its own process (advisor.api), or a recorded trial served from a response surface
(advisor.trials.process.replay): a runner turns (name, knobs) into a finished trial; everything else is
the same. What to try and whether it helped is the search's (advisor.search: bounds, strategy, state);
how a trial runs and what it measured, `advisor.search.trials`; pairs, re-measures and knobs that were
not applicable, `advisor.search.policies`. This module runs the loop, persists it after every trial
(session.json, atomically, so a session killed at any moment resumes with `--resume DIR`, losing at most
the trial in flight) and writes the outputs. Torch-free: trials run elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

from advisor.errors import AdvisorError
from advisor.trials.knobs import Knobs
from advisor.search.bounds import trial_bound
from advisor.search.drift import load_text
from advisor.search.timing import session_time
from advisor.trials.record.adaptive import against
from advisor.trials.record.measurement import Measurement
from advisor.search.state import SESSION_FILE, SessionOptions, best_row, discard_unstarted, load_state, lock_session, \
    compile_payback, new_state, reference_row, samples_gain, save, trial_row
from advisor.report.formatting import compile_text
from advisor.search.outputs import batch_notes, finish_outputs, out_of_memory_note
from advisor.search.predictions import prediction_error, remember_graph
from advisor.search.space import own_text, pending_try, user_space
from advisor.search.decision import decide
from advisor.search.proposal import Proposal, check_on_best
from advisor.search.strategy import SearchSpace, propose, recovery_plan, turned
from advisor.search.expected import deferred_for, levers_left
from advisor.trials.process.profiler_check import cuda_profiler_problem
from advisor.trials.record import TrialResult, load_trial
from advisor.trials.process.runner import TrialFailed
from advisor.trials.process.targets import absolute_step, absolute_target, parse_target
from advisor.search.trials import TrialRunner, decide_row, diagnose_trial, end_left_behind, figures_text, lint_script, \
    measured, own_bound, predicted_text, recorded_losses, run_one, subprocess_runner, trial_record
from advisor.search.simplify import keep_simpler, simplifies, swap_proposal, takes_off, unproven_knobs, \
    without_proposal
from advisor.search.policies import applied_only, beside_best, late_pair, not_applicable, pair_proposal, \
    pairs, pairs_on, refused_knobs, reserve, across_loads, beside_fresh_best, session_speedup, speedup_note, \
    without_best_again, SPEEDUP_BUDGET, SPEEDUP_DRAWS
from advisor.search.ending import PAIR_TRIALS, baseline_again, best_after, confirm_best, speedup_in_turns



# --- the session ------------------------------------------------------------------------------------

def run_session(target: str, out: Path, options: SessionOptions, *, command: str = "", resume: bool = False,
                log: Callable[[str], None] = print, runner: TrialRunner | None = None,
                script: bool = True, space: SearchSpace | None = None,
                extra: dict[str, Any] | None = None,
                progress: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the session until a full round over the knobs keeps nothing or the budget is
    spent; return the record.

    Trials run in subprocesses unless `runner` runs them some other way (the notebook API runs them in
    its own process; a replay serves recorded ones; a runner whose `remeasure` is False cannot measure
    a setting twice). `script=False`: the target only names a step (e.g. "<notebook>:train_step"), so
    there is no script to check or patch. `space`: the values the search may give each knob (those a
    recorded surface holds); `extra`: fields added to a new session record; `progress`: told where each
    trial of the subprocess runner is while it runs (`run_trial`'s `on_progress`). Before the baseline of a
    new session whose trials may run on CUDA, the profiler is checked in a fresh process: where its trace
    would hold no GPU kernels, or --device cuda finds no device, the session stops with why and the fix.
    """
    out = Path(out).resolve()
    if runner is None and script and not resume:
        # A CUDA baseline whose trace would hold no kernels (CUPTI refused) is not measured at all.
        problem = cuda_profiler_problem(options.device)
        if problem:
            raise AdvisorError(problem)
    if resume and not out.is_dir():
        raise AdvisorError(f"{out}: no such folder: there is no session to resume")
    if resume and not (out / SESSION_FILE).is_file():
        raise AdvisorError(f"{out}: no {SESSION_FILE} here: not a session folder, nothing to resume")
    created = not out.exists()
    lock = lock_session(out)  # one session at a time per folder, for as long as this one runs
    try:
        return _run_locked(target, out, options, command, resume, log, runner, script, space, extra, progress)
    finally:
        os.close(lock)
        if not (out / SESSION_FILE).exists():  # it failed before it began: leave nothing behind
            discard_unstarted(out, created)


def _run_locked(target: str, out: Path, options: SessionOptions, command: str, resume: bool,
                log: Callable[[str], None], runner: TrialRunner | None, script: bool, space: SearchSpace | None,
                extra: dict[str, Any] | None, progress: Callable[[Any], None] | None = None) -> dict[str, Any]:
    if resume:
        state = load_state(out)
        if state.get("status") == "done":  # nothing to resume: say so, and leave the record as it is
            stopped = next((n for n in reversed(state["notes"]) if str(n).startswith("stopped")),
                           f"{len(state['trials'])} trial(s), best {state.get('best')}")
            log(f"{out}: this session is done ({stopped}); nothing to resume. Its report: {out / 'report.html'}")
            return state
        end_left_behind(state, log)
        target, options = state["target"], SessionOptions.from_dict(state["options"])
        state["status"] = "running"
    else:
        if (out / SESSION_FILE).exists():
            raise AdvisorError(f"{out}: already holds a session; use --resume {out} or another --out")
        if script:  # absolute paths: a session resumed from another working folder finds its files
            target = absolute_target(target)
            options = dataclasses.replace(options, step=absolute_step(options.step))
        path = str(parse_target(target)[0]) if script else None
        state = new_state(target, path, out, options, command, lint_script(Path(path)) if path else None)
        state.update(extra or {})
    (out / "trials").mkdir(parents=True, exist_ok=True)
    save(state)
    log(options.budget_text())
    started = time.monotonic()
    try:
        _sequence(runner or subprocess_runner(target, out, options, state, progress), out, options, state, started, log,
                  user_space(space or SearchSpace(), options.only, options.skip))
    except KeyboardInterrupt:
        state["status"] = "interrupted"
        state["notes"].append("interrupted: the report shows the trials finished so far")
        try:  # the report of what was measured, as for any session; a second Ctrl-C leaves the record alone
            finish_outputs(out, state)
        except (Exception, KeyboardInterrupt) as problem:
            log(f"no report: {type(problem).__name__}: {problem}")
        state["notes"].pop()  # a resumed session goes on; the note was for this report
        save(state)
        log(f"interrupted: resume with  advisor profile --resume {out}")
        raise
    except Exception as exc:  # the session ends with its record and a report that say what went wrong
        state["status"] = "failed"
        state["notes"].append(f"failed: {exc}" if isinstance(exc, AdvisorError) else
                              f"failed: {type(exc).__name__}: {exc}")
        try:
            finish_outputs(out, state)
        except Exception as problem:  # the record is saved; a report that cannot be made must not hide why
            log(f"no report: {type(problem).__name__}: {problem}")
            save(state)
        raise
    return state


def _baseline(run: TrialRunner, state: dict[str, Any], log: Callable[[str], None]) -> None:
    log("trial 00: baseline")
    baseline, record, measurement = run_one(run, state, 0, None, "baseline", log)
    state["device"] = record.get("device_facts")
    state["memory_cap"] = record.get("memory_cap")
    state["user_values"] = record.get("user_values") or {}
    state["own_settings"] = record.get("own_settings") or {}
    state["training_loader"] = record.get("training_loader")
    state["sites"] = record.get("sites") or {}
    state["unit"] = measurement.unit
    if record.get("single_rank_job"):
        state["notes"].append("the script called init_process_group: each trial runs it as a one-rank job "
                              "(--nproc-per-node N runs N ranks)")
        log(f"  note: {state['notes'][-1]}")
    if baseline.ok and measurement.unit == "steps/s":
        state["notes"].append("no step took a batch from a DataLoader or as an argument: speed is measured in "
                              "steps/s, and the batch-size and DataLoader knobs do not apply")
    row = trial_row(0, baseline, record, None, state, measurement,
                    own_bound(baseline, measurement) if baseline.ok else None)  # the report's verdict shows it
    row["decision"] = "baseline" if baseline.ok else "failed"
    row["reason"] = "the user's own settings" if baseline.ok else f"{baseline.status}: {baseline.message}"
    if state["own_settings"]:
        row["reason"] += f"; the script's own: {own_text(state['own_settings'], state)}"
        log(f"  the script's own: {own_text(state['own_settings'], state)}")
    row["speedup"] = 1.0 if baseline.ok else None
    state["trials"].append(row)
    state["baseline"] = state["best"] = baseline.name
    state["final_knobs"] = Knobs().to_dict()
    if baseline.status == "oom":
        state["notes"].append(out_of_memory_note(record))
    losses = recorded_losses(baseline.path)
    if baseline.ok and losses and not all(math.isfinite(x) for x in losses):
        state["notes"].append("the baseline's loss is not finite: changes are checked for a finite loss only, "
                              "not for one close to the baseline's")
    if baseline.ok and not losses:
        state["notes"].append("the step returned no loss and ran no backward() of a scalar: each change's loss "
                              "check (finite, within 25% of the baseline's) is skipped")
    log(f"  {figures_text(row, state['unit'])}")
    save(state)


def _recover_from_oom(run: TrialRunner, state: dict[str, Any], log: Callable[[str], None], space: SearchSpace) -> None:
    """Try the recovery plan in order until a configuration fits (resumable: tried ones are skipped); only the
    knobs the user lets the search turn (--only, --skip)."""
    tried = {json.dumps(t["knobs"], sort_keys=True) for t in state["trials"]}
    for proposal in recovery_plan(state):
        if (json.dumps(proposal.knobs.to_dict(), sort_keys=True) in tried
                or not space.permits(turned({}, proposal.knobs))
                or (proposal.knobs.checkpointing and not space.allows("checkpointing"))):
            continue
        check_on_best(proposal, Knobs())
        index = len(state["trials"])
        log(f"trial {index:02d}: {proposal.change} (the baseline ran out of memory)")
        result, record, measurement = run_one(run, state, index, proposal, proposal.slug, log)
        row = trial_row(index, result, record, proposal, state, measurement, own_bound(result, measurement))
        if result.ok:
            row.update(decision="kept", reason="fits in memory", speedup=1.0)
            state["best"] = result.name
            state["final_knobs"] = result.knobs.to_dict()
            if proposal.recommendation == "oom-smaller-batch":
                state["notes"].append(
                    f"Only a smaller batch fits: {proposal.change}. This changes training: scale the learning "
                    "rate down with the batch, or find memory elsewhere (activation checkpointing, a smaller "
                    "model).")
        else:
            row.update(decision="failed", reason=f"{result.status}: {result.message}")
        state["trials"].append(row)
        log(f"  {row['decision']}: {row['reason']}")
        save(state)
        if result.ok:
            return


def _bound_of(out: Path, state: dict[str, Any], best: TrialResult):
    """Diagnosis, measurement and bound of the best trial; the bound is kept in the record."""
    diagnosis = diagnose_trial(best)
    measurement = measured(out, state, best)
    bound = trial_bound(best.status, diagnosis, measurement)
    state["bound"] = {"name": bound.name, "label": bound.label, "evidence": list(bound.evidence)}
    remember_graph(state, best.name, diagnosis)
    state["recommendations"] = [dataclasses.asdict(r) for r in diagnosis.recommendations] if diagnosis else []
    return diagnosis, measurement, bound


def _sequence(run: TrialRunner, out: Path, options: SessionOptions, state: dict[str, Any], started: float,
              log: Callable[[str], None], space: SearchSpace) -> None:
    if not state["trials"]:
        _baseline(run, state, log)
    if reference_row(state) is None and state["trials"][0]["status"] == "oom":
        _recover_from_oom(run, state, log, space)
    reference = reference_row(state)
    if reference is None:
        first = load_trial(out / state["trials"][0]["folder"])
        if first.traceback and first.status != "oom":
            log(first.traceback.rstrip())
        what = "no configuration fits in memory" if first.status == "oom" else f"baseline trial {first.status}"
        raise TrialFailed(f"{what}: {first.message} (trial folder {first.path})")
    reference_losses = recorded_losses(out / reference["folder"])
    best = applied_only(load_trial(out / best_row(state)["folder"]))
    remeasure = getattr(run, "remeasure", True)
    while True:
        diagnosis, best_measure, bound = _bound_of(out, state, best)
        asked = pending_try(options, state, best.knobs, diagnosis)  # the user's --try settings come first
        unproven = [] if asked else unproven_knobs(state)  # then a knob the best holds without a gain of its own
        proposals = ([asked] if asked else [without_proposal(best.knobs, unproven[0])] if unproven
                     else propose(diagnosis, bound, best, state, options, space))
        if not proposals:  # before the round ends: the fastest reverted change not yet paired, with its next move
            late = late_pair(out, state, options, space, best.knobs)
            proposals = [late] if late is not None else []
        if not proposals:
            state["notes"].append("stopped: a full round over the knobs kept nothing more"
                                  if len(state["trials"]) > 1 else "stopped: nothing to try")
            break
        if len(state["trials"]) >= options.max_trials - reserve(options, remeasure, pairs(run)):
            if options.max_trials > 1:  # one trial is a diagnosis-only run, not a budget that ran out
                state["notes"].append(f"stopped after {options.max_trials} trials (--max-trials) with "
                                      f"{len(proposals)} change(s) left to try{levers_left(proposals, state)}")
            break
        if options.time_budget_s is not None and time.monotonic() - started > options.time_budget_s:
            state["notes"].append(f"stopped: time budget of {options.time_budget_s:.0f} s spent (--time-budget)"
                                  f"{levers_left(proposals, state)}")
            break
        proposal = proposals[0]
        why = proposal.why or (f"addresses the bound: {bound.label}" if proposal.helps_now and bound.name
                               else f"a round over the knobs; the bound is {bound.label}")
        result, decision = _try(run, out, state, options, proposal, why, best.knobs, best_measure,
                                reference_losses, log, remeasure, proposals[1:])
        second, second_why = None, ""  # a next move on a change that did not pay, measured against the best
        row = next(t for t in state["trials"] if t["name"] == result.name) if result.ok else None
        # A change found not applicable changed nothing: no swap or pair is made on it (it is never proposed again).
        if (decision is not None and not decision.keep and row is not None and row["decision"] != "not applicable"
                and not decision.reason.startswith("loss")):
            # Model knobs interact: one that did not pay beside another the best holds is tried in its place.
            second = swap_proposal(state, best.knobs, proposal)
            second_why = second.why if second is not None else ""
        if (second is None and decision is not None and not decision.keep and "+" not in proposal.recommendation
                and not takes_off(proposal.recommendation)
                and pairs_on(decision, row, bound)):
            # Noise hides a small first step, and some changes pay only with a second (pinned copies with
            # more workers): a change that moved the bound, or addressed it, without paying is a base for
            # the move its own trace calls for next, measured together against the best.
            second = pair_proposal(result, proposal, state, options, space, best.knobs)
            state.setdefault("paired", []).append(result.name)
            second_why = f"together with {proposal.change}"
        first_result = result
        for _ in range(PAIR_TRIES):
            if second is None or len(state["trials"]) >= options.max_trials - reserve(options, remeasure, pairs(run)):
                break
            now = measured(out, state, load_trial(out / best_row(state)["folder"]))  # the best as measured last
            result, decision = _try(run, out, state, options, second, second_why, best.knobs, now,
                                    reference_losses, log, remeasure)
            if result.ok or "+" not in second.recommendation:
                break
            # A pair that could not run (a setting that fails) gives way to the nearest one of its direction: the
            # first move with its next second move.
            failed = second
            second = pair_proposal(first_result, proposal, state, options, space, best.knobs,
                                   why=f"in place of {failed.change}, which failed")
            second_why = second.why if second is not None else ""
        if decision is not None and decision.keep:
            best = applied_only(result)
            state["best"] = result.name
            state["final_knobs"] = best.knobs.to_dict()
        elif state["best"] != best.name:  # the best, measured again beside a candidate, stays the best
            best = applied_only(load_trial(out / best_row(state)["folder"]))
        save(state)
    in_turns = None
    if pairs(run):  # the baseline and the best side by side, windows in turns, after the best is confirmed
        # The first round before any pair for the speedup; a later one (the two still within the noise) only
        # before the speedup's second pair, its second draw of the two settings' levels.
        kept_back = options.max_trials >= SPEEDUP_BUDGET
        best = confirm_best(run, out, state, options, best, reference_losses, log, remeasure,
                            leave=PAIR_TRIALS if kept_back else 0,
                            leave_later=PAIR_TRIALS * SPEEDUP_DRAWS if kept_back else 0)
        in_turns = speedup_in_turns(run, out, state, options, reference, log) if remeasure else None
        if state["best"] != best.name:  # slower than the baseline in turns: the session went back to it
            best = applied_only(load_trial(out / best_row(state)["folder"]))
        side_by_side = False
    else:
        baseline = baseline_again(run, out, state, options, reference, log, remeasure)
        best = confirm_best(run, out, state, options, best, reference_losses, log, remeasure)
        side_by_side = baseline is not None and best_after(run, out, state, options, baseline, log)
    _bound_of(out, state, best)
    if in_turns is not None:
        state["speedup"], state["speedup_basis"] = in_turns, "in turns"
        if state["best"] != reference["name"]:  # else the note of the way back says it
            state["notes"].append(speedup_note(state, reference))
    else:
        state["speedup"], state["speedup_basis"] = session_speedup(out, state, reference)
        if state["speedup_basis"] != "direct" or side_by_side:
            state["notes"].append(speedup_note(state, reference, side_by_side))
    state["notes"].extend(batch_notes(state, options))
    state["time"] = session_time(out, state)
    state["status"] = "done"
    save(state)
    finish_outputs(out, state)


PAIR_TRIES = 2  # a pair that fails gives way once to the next second move of the same first move
GIVES_WAY = "in place of "  # a proposal's `why` that names the setting it stands in for (one that failed)


def _try(run: TrialRunner, out: Path, state: dict[str, Any], options: SessionOptions, proposal: Proposal, why: str,
         best_knobs: Knobs, best_measure: Measurement, reference_losses: list[float], log: Callable[[str], None],
         remeasure: bool, others: list[Proposal] = ()) -> tuple[TrialResult, Any]:
    """Run a proposal made on the best (`best_knobs`, measured as `best_measure`), decide it against that best
    and record its row; an inconclusive gain is measured once more and decided on both runs together, unless a
    lever of `others` (the proposals after it) not yet measured is worth more (`deferred_for`). Returns the
    (last) result and its decision."""
    check_on_best(proposal, best_knobs)
    index = len(state["trials"])
    # The unit the measured change will have; None where nothing predicted it.
    predicted = samples_gain(proposal.predicted_gain) if proposal.predicted else None
    log(f"trial {index:02d}: {proposal.change} ({why}; predicted "
        + (f"{100 * predicted:+.0f}% {state['unit']})" if predicted is not None else "no prediction)"))
    target = against(best_measure.samples_per_s, best_measure.relative_se, options.min_gain, options.windows)
    result, record, measurement = run_one(run, state, index, proposal, proposal.slug, log, target)
    losses = recorded_losses(result.path)
    beside = beside_best(run, out, state, options, record, index, log, remeasure) if result.ok else None
    # The machine changed: decide on the best measured beside; where none of the candidate's windows ran at
    # the load the best ran at then (`unmatched`), the candidate runs again beside it before anything is decided.
    unmatched = beside is not None and beside[1] is not None and beside[2] is None
    if beside is not None and beside[1] is not None:
        best_measure, measurement = beside[1], beside[2] or measurement
    decision = (decide(best_measure, measurement, losses, reference_losses, options.min_gain,
                       addresses_bound=proposal.helps_now) if result.ok else None)
    unmeasured = None  # the machine changed, and no trial was left to run the best again beside the candidate
    if beside is None and decision is not None and remeasure:
        decision, unmeasured = without_best_again(out, state, record, decision, lambda b, c: decide(
            b, c, losses, reference_losses, options.min_gain, addresses_bound=proposal.helps_now))
    if decision is not None and simplifies(proposal):
        decision = keep_simpler(decision, options.min_gain)
    row = trial_row(index, result, record, proposal, state, measurement, own_bound(result, measurement))
    row["load"] = load_text(record)
    if (row.get("compile") or {}).get("compile_s") is not None:
        # Against the best as the decision measured it (beside the candidate, when the machine changed).
        before = dict(best_row(state), samples_per_s=best_measure.samples_per_s)
        row["compile"]["pays_back_after_steps"] = compile_payback(row["compile"]["compile_s"], before, row)
    refused = not_applicable(row, proposal, state)
    partly = bool(refused_knobs(row.get("outcomes"), row["knobs"]))
    # A trial whose windows followed the comparison measured to its cap already: no new process for it.
    again = decision is not None and remeasure and not partly and (  # partly: not what was proposed
        (decision.inconclusive and not getattr(run, "adaptive", False) and beside is None
         and len(state["trials"]) + 2 <= options.max_trials)
        or (unmatched and len(state["trials"]) + 3 <= options.max_trials))
    deferred = deferred_for(decision, proposal, others, state) if again and not unmatched else None
    again = again and deferred is None
    if unmatched:
        decision = across_loads(decision, record, trial_record(out / beside[0]["folder"]), again)
    decide_row(row, result, decision, again and not unmatched)
    row["base"] = state.get("best")  # what the change was measured against: the model's calibration reads it
    if proposal.why and proposal.why.startswith(GIVES_WAY):  # the setting it stands in for, said in the row
        row["reason"] = f"{proposal.why}; {row['reason']}"
    if refused is not None:  # nothing was changed: whatever it measured, it is not kept
        row.update(decision="not applicable", reason=refused)
        decision = dataclasses.replace(decision, keep=False, inconclusive=False) if decision is not None else None
    if beside is not None:
        row["drift"] = beside[3]
        row["reason"] = f"{beside[3]}: measured the best again beside it; {row['reason']}"
    elif unmeasured is not None:  # not `drift`: that row field says the best was measured again beside it
        row["reason"] = f"{unmeasured}: no trial left to measure the best again beside it; {row['reason']}"
    if deferred is not None:
        row["reason"] += f"; not measured again: {deferred}"
    state["trials"].append(row)
    if beside is not None:
        state["trials"].append(beside[0])
        if beside[1] is not None and (decision is None or not decision.keep):
            beside[0].update(decision="kept", reason=beside[0]["reason"] + "; the best, as measured now")
            state["best"] = beside[0]["name"]  # what comes next is compared with the figure measured now
        elif beside[1] is not None:  # the candidate beat it, measured side by side: the old best gives way
            beside[0].update(decision="reverted", reason=beside[0]["reason"] + f"; {result.name} is faster")
    state["prediction_error"] = prediction_error(state)
    log(f"  {figures_text(row, state['unit'])}: {row['decision']}, {row['reason']}{predicted_text(row)}")
    if compile_text(row.get("compile")):
        log(f"  {compile_text(row['compile'])}")
    if again:
        # A gain the noise could hide: run the same settings once more and decide on both runs'
        # windows together (twice the windows, about 1/√2 of the noise).
        save(state)
        first, first_record = result, record
        index = len(state["trials"])
        log(f"trial {index:02d}: {proposal.change}, again")
        result, record, _ = run_one(run, state, index, proposal, f"{proposal.slug}-again", log)
        if unmatched and result.ok:  # beside the best just measured: the two at one load, not pooled
            best_measure, measurement = beside_fresh_best(out, state, best_row(state), best_measure,
                                                          [record, first_record])
        else:
            measurement = measured(out, state, result, [first.path])
        losses = recorded_losses(result.path) + recorded_losses(first.path)
        decision = (decide(best_measure, measurement, losses, reference_losses, options.min_gain,
                           addresses_bound=proposal.helps_now) if result.ok else None)
        row = trial_row(index, result, record, proposal, state, measurement, own_bound(result, measurement))
        decide_row(row, result, decision, False)
        row.update(change=f"{proposal.change} (again)", base=state.get("best"),
                   reason=row["reason"] + (" (beside the best, at one load)" if unmatched else " (both runs)"))
        state["trials"].append(row)
        state["prediction_error"] = prediction_error(state)
        log(f"  {figures_text(row, state['unit'])}: {row['decision']}, {row['reason']}{predicted_text(row)}")
        if decision is not None and decision.keep and not unmatched:
            state["pooled"][result.name] = [os.path.relpath(first.path, out)]
    return result, decision



"""The optimization session: baseline → diagnose → apply what addresses the bound → measure → keep or revert → …

Each trial is a real, profiled run of the user's unchanged script (advisor.trials.runner), or of a notebook's
step in its own process (advisor.api), or a recorded trial served from a response surface
(advisor.trials.replay): a runner turns (name, knobs) into a finished trial; everything else is the same.
What to try and whether it helped is the search's (advisor.search: measurement, bounds, strategy,
state); this module runs the loop, persists it after every trial (session.json, atomically, so a
session killed at any moment resumes with `--resume DIR`, losing at most the trial in flight) and
writes the outputs. Torch-free: trials run elsewhere.
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
from advisor.trials.storage import number
from advisor.search.bounds import trial_bound
from advisor.search.drift import at_load, load_text, machine_changed, mean_load, pair_changed, same_load
from advisor.search.timing import session_time
from advisor.trials.adaptive import against
from advisor.trials.measurement import Measurement, job, measure, noise
from advisor.search.state import SESSION_FILE, SessionOptions, best_row, discard_unstarted, load_state, lock_session, \
    compile_payback, new_state, reference_row, samples_gain, save, trial_row
from advisor.report.formatting import compile_text
from advisor.search.outputs import batch_notes, finish_outputs, out_of_memory_note
from advisor.search.predictions import prediction_error, remember_graph, reprice
from advisor.search.space import pending_try, user_space
from advisor.search.strategy import Proposal, SearchSpace, decide, knobs_key, propose, recovery_plan, turned
from advisor.trials.profiler_check import cuda_profiler_problem
from advisor.trials.record import TRIAL_FILE, TrialResult, load_trial
from advisor.trials.runner import TrialFailed, end_trial_processes, run_trial, trial_processes
from advisor.trials.targets import absolute_step, absolute_target, parse_target

TrialRunner = Callable[[str, Knobs], TrialResult]  # (trial name, knobs) -> the finished trial


# --- what a trial measured --------------------------------------------------------------------------

def trial_record(folder: Path) -> dict[str, Any]:
    """The trial.json of a trial folder."""
    return json.loads((Path(folder) / TRIAL_FILE).read_text())


def recorded_losses(folder: Path | str) -> list[float]:
    """Losses returned by the profiled steps of a trial."""
    record = trial_record(Path(folder))
    losses = (number(s, "loss") for s in record.get("steps", []) if isinstance(s, dict) and s.get("recorded"))
    return [x for x in losses if x is not None]


def measured(out: Path, state: dict[str, Any], result: TrialResult, extra: list[Path] = ()) -> Measurement:
    """A trial's steady-state measurement, pooled with earlier runs of the same settings; of the whole
    job for a data-parallel trial (each rank's runs pooled, the ranks summed)."""
    folders = [result.path, *extra, *(out / f for f in state["pooled"].get(result.name, []))]
    return measure_record([trial_record(folder) for folder in folders])


def measure_record(records: list[dict[str, Any]]) -> Measurement:
    """The measurement of one or more records of the same settings (every rank's, when there are ranks)."""
    ranks = [r.get("ranks") for r in records]
    if all(isinstance(rs, list) and rs for rs in ranks):
        width = min(len(rs) for rs in ranks)
        return job([measure(rs[i].get("steps", []) for rs in ranks) for i in range(width)])
    return measure(r.get("steps", []) for r in records)


def diagnose_trial(result: TrialResult):
    """The diagnosis (with recommendations) of a trial's trace; None when it has no trace. A data-parallel
    trial is diagnosed as a job: its straggler's figures, with the job's bound and advice (a rank that
    waits for another is not what to fix)."""
    from advisor.analysis.analyze import analyze_path
    from advisor.analysis.job import job_diagnosis, jobs_of
    from advisor.code.lint import script_findings

    if not any(result.path.glob("*.pt.trace.json*")):
        return None
    diagnoses = analyze_path(result.path, linter=script_findings)
    jobs = jobs_of(diagnoses) if len(diagnoses) > 1 else []
    return job_diagnosis(jobs[0]) if jobs else diagnoses[0]


def lint_script(script: Path) -> list[dict] | None:
    """`advisor lint` findings on the script, for the report; None when it cannot be checked."""
    from advisor.code.lint import LintError, lint_file

    try:
        return [f.to_dict() for f in lint_file(script)]
    except LintError:
        return None


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


def subprocess_runner(target: str, out: Path, options: SessionOptions, state: dict[str, Any],
                      progress: Callable[[Any], None] | None = None) -> TrialRunner:
    """Trials of the script in fresh subprocesses (the CLI's way), in `out/trials/<name>`; the DataLoader
    knobs go to the training loader the baseline found. The trial in flight is in the record (its
    process and token), so that `--resume` after a kill can end what it left behind."""
    def started(name: str) -> Callable[[int, str], None]:
        def record(pid: int, token: str) -> None:
            state["running_trial"] = {"name": name, "pid": pid, "token": token}
            save(state)
        return record

    def run(name: str, knobs: Knobs, against: dict[str, Any] | None = None) -> TrialResult:
        try:
            return run_trial(target, knobs, out / "trials" / name, name=name, steps=options.steps,
                             wait=options.wait, warmup=options.warmup, device=options.device,
                             script_args=options.script_args, timeout_s=trial_time_limit(options, knobs),
                             memory_limit=options.memory_limit, windows=options.windows, window_s=options.window_s,
                             step=options.step, loader=state.get("training_loader"), on_start=started(name),
                             nproc_per_node=options.nproc_per_node, torchrun_args=options.torchrun_args,
                             on_progress=progress, ray_address=options.ray_address, nnodes=options.nnodes,
                             against=against)
        finally:
            state["running_trial"] = None

    run.adaptive = options.windows > 0  # type: ignore[attr-defined]  # its windows can follow a comparison
    return run


COMPILE_ALLOWANCE_S = 600.0  # torch.compile of a large model takes minutes on its first steps


def trial_time_limit(options: SessionOptions, knobs: Knobs) -> float:
    """Seconds a trial may take: --timeout, and as long again (at least COMPILE_ALLOWANCE_S more) for one
    that compiles, whose first steps hold the compile."""
    return options.timeout_s + (max(options.timeout_s, COMPILE_ALLOWANCE_S) if knobs.compile else 0.0)


def end_left_behind(state: dict[str, Any], log: Callable[[str], None]) -> None:
    """End the processes of the trial a killed session left running (only those that carry its token)."""
    running = state.get("running_trial")
    if isinstance(running, dict) and isinstance(running.get("pid"), int) and isinstance(running.get("token"), str):
        if trial_processes(running["pid"], running["token"]):
            log(f"ending the processes of trial {running.get('name')}, left running when the session stopped")
            end_trial_processes(running["pid"], running["token"])
    state["running_trial"] = None


def _run(run: TrialRunner, state: dict[str, Any], index: int, proposal: Proposal | None, slug: str,
         log: Callable[[str], None], target: Any = None) -> tuple[TrialResult, dict[str, Any], Measurement]:
    """Run one trial (its windows measured until they settle the comparison with `target`, an
    `advisor.trials.adaptive.Against`, where the runner can); return it, its record and its own measurement."""
    knobs = Knobs() if proposal is None else proposal.knobs
    if target is not None and getattr(run, "adaptive", False):
        result = run(f"{index:02d}-{slug}", knobs, against=target.to_dict())
    else:
        result = run(f"{index:02d}-{slug}", knobs)
    record = trial_record(result.path)
    return result, record, measure_record([record])


def _baseline(run: TrialRunner, state: dict[str, Any], log: Callable[[str], None]) -> None:
    log("trial 00: baseline")
    baseline, record, measurement = _run(run, state, 0, None, "baseline", log)
    state["device"] = record.get("device_facts")
    state["memory_cap"] = record.get("memory_cap")
    state["user_values"] = record.get("user_values") or {}
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
                    _own_bound(baseline, measurement) if baseline.ok else None)  # the report's verdict shows it
    row["decision"] = "baseline" if baseline.ok else "failed"
    row["reason"] = "the user's own settings" if baseline.ok else f"{baseline.status}: {baseline.message}"
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
    log(f"  {_figures(row, state['unit'])}")
    save(state)


def _figures(row: dict[str, Any], unit: str) -> str:
    """A trial's samples/s (or steps/s: the session's `unit`) with its interval, for the log."""
    if not row.get("samples_per_s"):
        return f"{row['status']}: {row.get('message') or ''}".strip()
    interval = row.get("interval")
    spread = f" (95%: {interval[0]:.1f}–{interval[1]:.1f})" if interval else ""
    return f"{row['samples_per_s']:.1f} {unit}{spread}"


def _recover_from_oom(run: TrialRunner, state: dict[str, Any], log: Callable[[str], None], space: SearchSpace) -> None:
    """Try the recovery plan in order until a configuration fits (resumable: tried ones are skipped); only the
    knobs the user lets the search turn (--only, --skip)."""
    tried = {json.dumps(t["knobs"], sort_keys=True) for t in state["trials"]}
    for proposal in recovery_plan(state):
        if (json.dumps(proposal.knobs.to_dict(), sort_keys=True) in tried
                or not space.permits(turned({}, proposal.knobs))):
            continue
        index = len(state["trials"])
        log(f"trial {index:02d}: {proposal.change} (the baseline ran out of memory)")
        result, record, measurement = _run(run, state, index, proposal, proposal.slug, log)
        row = trial_row(index, result, record, proposal, state, measurement, _own_bound(result, measurement))
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
    best = load_trial(out / best_row(state)["folder"])
    remeasure = getattr(run, "remeasure", True)
    while True:
        diagnosis, best_measure, bound = _bound_of(out, state, best)
        asked = pending_try(options, state, best.knobs, diagnosis)  # the user's --try settings come first
        proposals = [asked] if asked else propose(diagnosis, bound, best, state, options, space)
        if not proposals:  # before the round ends: the fastest reverted change not yet paired, with its next move
            late = _late_pair(out, state, options, space)
            proposals = [late] if late is not None else []
        if not proposals:
            state["notes"].append("stopped: a full round over the knobs kept nothing more"
                                  if len(state["trials"]) > 1 else "stopped: nothing to try")
            break
        if len(state["trials"]) >= options.max_trials - _reserve(options, remeasure):
            if options.max_trials > 1:  # one trial is a diagnosis-only run, not a budget that ran out
                state["notes"].append(f"stopped after {options.max_trials} trials (--max-trials) with "
                                      f"{len(proposals)} change(s) left to try")
            break
        if options.time_budget_s is not None and time.monotonic() - started > options.time_budget_s:
            state["notes"].append(f"stopped: time budget of {options.time_budget_s:.0f} s spent (--time-budget)")
            break
        proposal = proposals[0]
        why = proposal.why or (f"addresses the bound: {bound.label}" if proposal.helps_now and bound.name
                               else f"a round over the knobs; the bound is {bound.label}")
        result, decision = _try(run, out, state, options, proposal, why, best_measure, reference_losses, log,
                                remeasure)
        if (decision is not None and not decision.keep and "+" not in proposal.recommendation
                and _pairs_on(decision, next(t for t in state["trials"] if t["name"] == result.name), bound)):
            # Noise hides a small first step, and some changes pay only with a second (pinned copies with
            # more workers): a change that moved the bound, or addressed it, without paying is a base for
            # the move its own trace calls for next, measured together against the best.
            pair = pair_proposal(result, proposal, state, options, space)
            state.setdefault("paired", []).append(result.name)
            if pair is not None and len(state["trials"]) < options.max_trials - _reserve(options, remeasure):
                now = measured(out, state, load_trial(out / best_row(state)["folder"]))  # the best as measured last
                result, decision = _try(run, out, state, options, pair, f"together with {proposal.change}",
                                        now, reference_losses, log, remeasure)
        if decision is not None and decision.keep:
            best = applied_only(result)
            state["best"] = result.name
            state["final_knobs"] = best.knobs.to_dict()
        elif state["best"] != best.name:  # the best, measured again beside a candidate, stays the best
            best = applied_only(load_trial(out / best_row(state)["folder"]))
        save(state)
    best = _confirm_best(run, out, state, options, best, reference_losses, log, remeasure)
    _bound_of(out, state, best)
    best_sps, base_sps = best_row(state)["samples_per_s"], reference["samples_per_s"]
    state["speedup"] = best_sps / base_sps if base_sps and best_sps else None
    state["notes"].extend(batch_notes(state, options))
    state["time"] = session_time(out, state)
    state["status"] = "done"
    save(state)
    finish_outputs(out, state)


# A change this much slower or less (or within 1.5 × its noise) can still pay with a second move: a small
# cost on its own is what a change that pays only in a pair reads, give or take the noise.
PAIR_FLOOR = 0.10
CONFIRM_TRIALS = 2  # the best and the runner-up, each measured once more before the session ends


def _reserve(options: SessionOptions, remeasure: bool) -> int:
    """Trials kept back for confirming the best against the runner-up (with a budget that allows it)."""
    return CONFIRM_TRIALS if remeasure and options.max_trials >= 4 * CONFIRM_TRIALS else 0


def _try(run: TrialRunner, out: Path, state: dict[str, Any], options: SessionOptions, proposal: Proposal, why: str,
         best_measure: Measurement, reference_losses: list[float], log: Callable[[str], None],
         remeasure: bool) -> tuple[TrialResult, Any]:
    """Run a proposal, decide it against the best and record its row; an inconclusive gain is measured once
    more and decided on both runs together. Returns the (last) result and its decision."""
    index = len(state["trials"])
    predicted = samples_gain(proposal.predicted_gain)  # the unit the measured change will have
    log(f"trial {index:02d}: {proposal.change} ({why}; predicted "
        + (f"{100 * predicted:+.0f}% {state['unit']})" if predicted is not None else "no gain figure)"))
    target = against(best_measure.samples_per_s, best_measure.relative_se, options.min_gain, options.windows)
    result, record, measurement = _run(run, state, index, proposal, proposal.slug, log, target)
    losses = recorded_losses(result.path)
    beside = _beside_best(run, out, state, options, record, index, log, remeasure) if result.ok else None
    if beside is not None and beside[1] is not None:  # the machine changed: decide on the best measured beside
        best_measure, measurement = beside[1], beside[2]
    decision = (decide(best_measure, measurement, losses, reference_losses, options.min_gain,
                       addresses_bound=proposal.helps_now) if result.ok else None)
    row = trial_row(index, result, record, proposal, state, measurement, _own_bound(result, measurement))
    row["load"] = load_text(record)
    if (row.get("compile") or {}).get("compile_s") is not None:
        row["compile"]["pays_back_after_steps"] = compile_payback(row["compile"]["compile_s"], best_row(state), row)
    refused = _not_applicable(row, proposal, state)
    partly = bool(refused_knobs(row.get("outcomes"), row["knobs"]))
    # A trial whose windows followed the comparison measured to its cap already: no new process for it.
    again = (decision is not None and decision.inconclusive and remeasure and not partly  # not what was proposed
             and not getattr(run, "adaptive", False) and beside is None
             and len(state["trials"]) + 2 <= options.max_trials)
    _decide_row(row, result, decision, again)
    row["base"] = state.get("best")  # what the change was measured against: the model's calibration reads it
    if refused is not None:  # nothing was changed: whatever it measured, it is not kept
        row.update(decision="not applicable", reason=refused)
        decision = dataclasses.replace(decision, keep=False, inconclusive=False) if decision is not None else None
    if beside is not None:
        row["drift"] = beside[3]
        row["reason"] = f"{beside[3]}: measured the best again beside it; {row['reason']}"
    state["trials"].append(row)
    if beside is not None:
        state["trials"].append(beside[0])
        if beside[1] is not None and (decision is None or not decision.keep):
            beside[0].update(decision="kept", reason=beside[0]["reason"] + "; the best, as measured now")
            state["best"] = beside[0]["name"]  # what comes next is compared with the figure measured now
        elif beside[1] is not None:  # the candidate beat it, measured side by side: the old best gives way
            beside[0].update(decision="reverted", reason=beside[0]["reason"] + f"; {result.name} is faster")
    state["prediction_error"] = prediction_error(state)
    log(f"  {_figures(row, state['unit'])}: {row['decision']}, {row['reason']}{_predicted_text(row)}")
    if compile_text(row.get("compile")):
        log(f"  {compile_text(row['compile'])}")
    if again:
        # A gain the noise could hide: run the same settings once more and decide on both runs'
        # windows together (twice the windows, about 1/√2 of the noise).
        save(state)
        first = result
        index = len(state["trials"])
        log(f"trial {index:02d}: {proposal.change}, again")
        result, record, _ = _run(run, state, index, proposal, f"{proposal.slug}-again", log)
        measurement = measured(out, state, result, [first.path])
        losses = recorded_losses(result.path) + recorded_losses(first.path)
        decision = (decide(best_measure, measurement, losses, reference_losses, options.min_gain,
                           addresses_bound=proposal.helps_now) if result.ok else None)
        row = trial_row(index, result, record, proposal, state, measurement, _own_bound(result, measurement))
        _decide_row(row, result, decision, False)
        row.update(change=f"{proposal.change} (again)", reason=row["reason"] + " (both runs)", base=state.get("best"))
        state["trials"].append(row)
        state["prediction_error"] = prediction_error(state)
        log(f"  {_figures(row, state['unit'])}: {row['decision']}, {row['reason']}{_predicted_text(row)}")
        if decision is not None and decision.keep:
            state["pooled"][result.name] = [os.path.relpath(first.path, out)]
    return result, decision


def _beside_best(run: TrialRunner, out: Path, state: dict[str, Any], options: SessionOptions,
                 record: dict[str, Any], index: int, log: Callable[[str], None], remeasure: bool):
    """When the measurements say the machine changed (`advisor.search.drift`), run the best once more,
    right after the candidate: (its row, its measurement, the candidate's measurement at the load it was
    measured at, why); the measurements None when that run failed; None when nothing changed or the
    budget has no room."""
    if not remeasure or len(state["trials"]) + 2 > options.max_trials:
        return None
    top = best_row(state)
    runs = [trial_record(out / top["folder"]), *(trial_record(out / f) for f in state["pooled"].get(top["name"], []))]
    changed = machine_changed(runs, record)
    if changed is None:
        return None
    log(f"  {changed}: measuring the best ({top['name']}) again beside it")
    knobs = Knobs.from_dict(in_effect(top))
    proposal = Proposal("confirm", f"{first_change(top['change'])} (the best, measured again)", "best-again",
                        knobs, 0.0)
    fresh, fresh_record, fresh_measure = _run(run, state, index + 1, proposal, "best-again", log)
    row = trial_row(index + 1, fresh, fresh_record, proposal, state, fresh_measure if fresh.ok else None,
                    _own_bound(fresh, fresh_measure) if fresh.ok else None)
    row.update(decision="measured" if fresh.ok else "failed", load=load_text(fresh_record),
               reason=f"{top['name']} again, beside trial {index:02d}: {changed}" if fresh.ok else
               f"trial {fresh.status}: {fresh.message}")
    log(f"  {_figures(row, state['unit'])}: the best as measured now")
    if not fresh.ok:
        return row, None, None, changed
    # The load may have moved again by the time the best ran: the best's runs at the candidate's load
    # decide where there are some (this one, or earlier ones); else the candidate's windows at this one's.
    matched = same_load([fresh_record, *_runs_of(out, state, top["knobs"])], [record])
    if matched is not None:
        return row, measure_record(matched[0]), measure_record(matched[1]), changed
    candidate = measure_record([dict(record, steps=at_load(record, mean_load(fresh_record)))])
    return row, fresh_measure, candidate, changed


def _runs_of(out: Path, state: dict[str, Any], knobs: dict[str, Any]) -> list[dict[str, Any]]:
    """The records of every run of a setting that measured, latest first."""
    key = knobs_key(knobs)
    return [trial_record(out / t["folder"]) for t in reversed(state["trials"])
            if t["status"] == "ok" and t.get("samples_per_s") and knobs_key(t["knobs"]) == key]


def first_change(change: str) -> str:
    """A row's change as first tried, without what a re-measure added to it."""
    for suffix in (" (confirming the best)", " (the best, measured again)", " (again)"):
        change = change.removesuffix(suffix)
    return change


def _predicted_text(row: dict[str, Any]) -> str:
    """What was predicted beside what was measured, for the log line of a trial."""
    if row.get("predicted_samples_gain") is None or row.get("gain") is None:
        return ""
    return f" (predicted {100 * row['predicted_samples_gain']:+.0f}%, measured {100 * row['gain']:+.0f}%)"


def _pairs_on(decision: Any, row: dict[str, Any], bound: Any) -> bool:
    """Whether a reverted change is a base for a second move: its loss was fine, it was not clearly slower,
    and it moved the bound or addressed it."""
    if decision.keep or decision.reason.startswith("loss") or row["decision"] != "reverted":
        return False
    moved = row.get("bound") is not None and row.get("bound") != bound.name
    return decision.gain > -max(1.5 * decision.noise, PAIR_FLOOR) and (moved or bool(row.get("helps_now")))


def pair_proposal(candidate: TrialResult, first: Proposal, state: dict[str, Any], options: SessionOptions,
                  space: SearchSpace) -> Proposal | None:
    """The move the candidate's own trace calls for next, made on top of it, as one change: the first
    proposal from the candidate (reverted changes included) that turns other knobs than `first` did."""
    best = best_row(state)
    # Both what was proposed and what the candidate ran with: a pair never holds two values of one knob.
    first_turned = turned(best["knobs"], first.knobs) | turned(best["knobs"], candidate.knobs)
    diagnosis = diagnose_trial(candidate)
    remember_graph(state, candidate.name, diagnosis)
    measurement = measure_record([trial_record(candidate.path)])
    bound = trial_bound(candidate.status, diagnosis, measurement)
    base = candidate.knobs.to_dict()
    advised = {r.id for r in diagnosis.recommendations} if diagnosis is not None else set()
    # What the candidate's trace advises comes before a blind experiment, whatever their predicted gains.
    ranked = sorted(propose(diagnosis, bound, candidate, state, options, space, retry_reverted=True),
                    key=lambda p: (not p.helps_now, p.recommendation not in advised, -p.predicted_gain))
    for p in ranked:
        second = turned(base, p.knobs)
        if second and not second & first_turned:
            pair = Proposal(f"{first.recommendation}+{p.recommendation}", f"{first.change} + {p.change}",
                            f"{first.slug}-and-{p.slug}", p.knobs, first.predicted_gain + p.predicted_gain,
                            first.bound, first.helps_now)
            return reprice([pair], state, best["name"], best["knobs"])[0]  # both moves simulated together
    return None


def _late_pair(out: Path, state: dict[str, Any], options: SessionOptions, space: SearchSpace) -> Proposal | None:
    """The pair of the fastest-measured reverted change (its loss fine) that has not been a pair's base yet:
    a change noise made read slower than it is gets its second move before the session ends."""
    paired = state.setdefault("paired", [])
    rows = [t for t in state["trials"][1:] if t["decision"] == "reverted" and t["status"] == "ok"
            and t.get("samples_per_s") and "+" not in (t.get("recommendation") or "+")
            and t.get("recommendation") != "confirm" and not t["reason"].startswith("loss")
            and t["name"] not in paired]
    for row in sorted(rows, key=lambda t: -t["samples_per_s"]):
        paired.append(row["name"])
        first = Proposal(row["recommendation"], row["change"].removesuffix(" (again)"),
                         row["name"][3:].removesuffix("-again"), Knobs.from_dict(row["knobs"]),
                         row.get("predicted_gain") or 0.0, None, bool(row.get("helps_now")))
        pair = pair_proposal(load_trial(out / row["folder"]), first, state, options, space)
        if pair is not None:
            return pair
    return None


def _confirm_best(run: TrialRunner, out: Path, state: dict[str, Any], options: SessionOptions, best: TrialResult,
                  reference_losses: list[float], log: Callable[[str], None], remeasure: bool) -> TrialResult:
    """Before the session ends, measure the best and the runner-up (the other setting that measured fastest)
    once more, when the runner-up is within the noise of the best or ahead of it, and keep whichever the
    pooled runs say is faster. Returns the best."""
    if not remeasure or options.max_trials - len(state["trials"]) < CONFIRM_TRIALS:
        return best
    top, runner_up = best_row(state), runner_up_row(state)
    if runner_up is None:
        return best
    best_measure = measured(out, state, best)
    earlier = [out / runner_up["folder"], *(out / f for f in state["pooled"].get(runner_up["name"], []))]
    runner_measure = measure_record([trial_record(f) for f in earlier])
    if runner_measure.samples_per_s < best_measure.samples_per_s * (1 - noise(best_measure, runner_measure)):
        return best  # clearly behind: nothing to confirm
    confirmed, runs = {}, {}
    for row, folders in ((top, [out / top["folder"], *(out / f for f in state["pooled"].get(top["name"], []))]),
                         (runner_up, earlier)):
        knobs = Knobs.from_dict(in_effect(row))
        proposal = Proposal("confirm", f"{first_change(row['change'])} (confirming the best)", "confirm", knobs, 0.0)
        index = len(state["trials"])
        log(f"trial {index:02d}: {row['name']} once more, to confirm the best against the runner-up")
        result, record, _ = _run(run, state, index, proposal, f"confirm-{row['name'][:2]}", log)
        pooled = measured(out, state, result, folders) if result.ok else None
        new = trial_row(index, result, record, proposal, state, pooled, _own_bound(result, pooled))
        new.update(decision="measured" if result.ok else "failed",
                   reason=f"{row['name']} again, pooled with its earlier runs" if result.ok else
                   f"trial {result.status}: {result.message}")
        state["trials"].append(new)
        if result.ok:
            state["pooled"][result.name] = [os.path.relpath(f, out) for f in folders]
            runs[row["name"]] = _runs_of(out, state, row["knobs"])  # every run of the setting, latest first
        confirmed[row["name"]] = (result, pooled, new)
        save(state)
    (kept, kept_m, kept_row), (other, other_m, other_row) = confirmed[top["name"]], confirmed[runner_up["name"]]
    if kept_m is None or other_m is None:  # a confirming run failed: the best stands as it was decided
        for row in (kept_row, other_row):
            if row["decision"] == "measured":
                row.update(decision="reverted", reason=row["reason"] + "; the other run failed, nothing changes")
        save(state)
        return best
    changed = pair_changed(runs[top["name"]], runs[runner_up["name"]])
    if changed is not None:  # pooled runs span loads: decide on the runs of both measured at one load
        matched = same_load(runs[top["name"]], runs[runner_up["name"]])
        if matched is None:  # no load holds both: the two measured last, the runner-up's windows at the best's load
            latest = runs[runner_up["name"]][0]
            matched = (runs[top["name"]][:1], [dict(latest, steps=at_load(latest, mean_load(runs[top["name"]][0])))])
        kept_m, other_m = measure_record(matched[0]), measure_record(matched[1])
        other_row["drift"] = changed
    losses = recorded_losses(other.path)
    decision = decide(kept_m, other_m, losses, reference_losses, options.min_gain)
    winner, winner_row = (other, other_row) if decision.keep else (kept, kept_row)
    winner_row.update(decision="kept")
    (kept_row if decision.keep else other_row).update(decision="reverted")
    other_row.update(gain=decision.gain, noise=decision.noise, reason=other_row["reason"] + f": {decision.reason}"
                     + (f" ({changed}: decided on the runs of both measured at one load)" if changed else ""))
    log(f"  confirmed: {first_change(winner_row['change'])} is the best "
        f"({_figures(winner_row, state.get('unit') or 'samples/s')})")
    state["best"] = winner.name
    state["final_knobs"] = applied_only(winner).knobs.to_dict()
    save(state)
    return winner


def runner_up_row(state: dict[str, Any]) -> dict[str, Any] | None:
    """The other setting that measured fastest; never a change that was not applicable (it measured a
    setting already run, not another one)."""
    top = best_row(state)
    others = [t for t in state["trials"] if t["status"] == "ok" and t.get("samples_per_s")
              and t["decision"] != "not applicable" and knobs_key(in_effect(t)) != knobs_key(in_effect(top))]
    return max(others, key=lambda t: t["samples_per_s"], default=None)


def refused_knobs(outcomes: dict[str, str] | None, knobs: dict[str, Any]) -> dict[str, None]:
    """The knobs a trial set and found not applicable, as settings that leave the user's value."""
    return {k: None for k, v in (outcomes or {}).items()
            if str(v).startswith("not applicable") and knobs.get(k) is not None}


def in_effect(row: dict[str, Any]) -> dict[str, Any]:
    """The knobs a trial's row ran with: those it found not applicable left at the user's value."""
    return {**row["knobs"], **refused_knobs(row.get("outcomes"), row["knobs"])}


def applied_only(result: TrialResult) -> TrialResult:
    """The trial as the base of what follows: a knob it found not applicable (a compile that failed beside
    a change that paid) is dropped, so the next trials do not carry it and the patch does not write it."""
    refused = refused_knobs(result.knob_outcomes, result.knobs.to_dict())
    return dataclasses.replace(result, knobs=dataclasses.replace(result.knobs, **refused)) if refused else result


def _not_applicable(row: dict[str, Any], proposal: Proposal, state: dict[str, Any]) -> str | None:
    """Why the change could not be made at all (every knob it turns was not applicable), else None."""
    knobs = turned(best_row(state)["knobs"], proposal.knobs)
    outcomes = row.get("outcomes") or {}
    refused = [f"{k}: {outcomes[k].removeprefix('not applicable: ')}" for k in sorted(knobs)
               if str(outcomes.get(k, "")).startswith("not applicable")]
    if row["status"] != "ok" or not knobs or len(refused) < len(knobs):
        return None
    return "; ".join(refused)


def _own_bound(result: TrialResult, measurement: Measurement):
    """A trial's own bound (what bound it, once measured), for its row."""
    return trial_bound(result.status, diagnose_trial(result) if result.ok else None, measurement)


def _decide_row(row: dict[str, Any], result: TrialResult, decision, inconclusive: bool) -> None:
    """Fill in a row's decision from the trial's status and the keep/revert decision."""
    if decision is None:
        row.update(decision="failed", reason=f"trial {result.status}: {result.message}")
        return
    row.update(decision="kept" if decision.keep else "reverted", gain=decision.gain, noise=decision.noise,
               reason=f"inconclusive, measured again: {decision.reason}" if inconclusive else decision.reason)

"""The trials of a session: how one runs (in a subprocess, or by another runner), what it measured, and
its row's figures and decision as the log shows them. Torch-free: trials run elsewhere."""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from advisor.files import file_stamps
from advisor.knobs import KNOBS
from advisor.trials.knobs import Knobs
from advisor.trials.record.storage import number
from advisor.search.bounds import trial_bound
from advisor.search.cost import answer_seconds
from advisor.trials.record.measurement import Measurement, job, measure
from advisor.search.record import RunningTrial, SessionRecord, TrialRow
from advisor.search.state import SessionOptions, save
from advisor.search.proposal import Proposal
from advisor.trials.record import TRIAL_FILE, TrialResult
from advisor.trials.launch.processes import end_trial_processes, trial_processes
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec


class TrialRunner(Protocol):
    """What runs the session's trials: (trial name, knobs, ...) → the finished trial, and what it can do."""

    remeasure: bool  # it can measure a setting twice (a replay without noise and one recording a setting cannot)
    adaptive: bool  # a trial's windows can follow a comparison with the best (`against`)
    paired: bool  # it runs two trials at once, their windows in turns (`turns`)
    # How far a setting's level moves between its processes, where the runner knows (a replay serves its own draws,
    # or none); None: live processes, whose draws are the device's (`advisor.search.draws.measured_spread`).
    process_draws: float | None

    def __call__(self, name: str, knobs: Knobs, **options: Any) -> TrialResult: ...


@dataclass(frozen=True)
class Runner:
    """A function that runs a trial, as a `TrialRunner`: what it can do said beside it."""

    run: Callable[..., TrialResult]
    remeasure: bool = True
    adaptive: bool = False
    paired: bool = False
    process_draws: float | None = None

    def __call__(self, name: str, knobs: Knobs, **options: Any) -> TrialResult:
        return self.run(name, knobs, **options)


def as_runner(run: Any) -> TrialRunner:
    """A runner as the session asks it: one that says what it can do as it is, a plain function as a `Runner`
    (it measures again, in windows it chooses, one trial at a time)."""
    return run if all(hasattr(run, name) for name in ("remeasure", "adaptive", "paired")) else Runner(run)


def trial_record(folder: Path) -> dict[str, Any]:
    """The trial.json of a trial folder."""
    return json.loads((Path(folder) / TRIAL_FILE).read_text())


def recorded_losses(folder: Path | str) -> list[float]:
    """Losses returned by the profiled steps of a trial."""
    record = trial_record(Path(folder))
    losses = (number(s, "loss") for s in record.get("steps", []) if isinstance(s, dict) and s.get("recorded"))
    return [x for x in losses if x is not None]


def measured(out: Path, state: SessionRecord, result: TrialResult, extra: list[Path] = ()) -> Measurement:
    """A trial's steady-state measurement, pooled with earlier runs of the same settings; of the whole
    job for a data-parallel trial (each rank's runs pooled, the ranks summed)."""
    folders = [result.path, *extra, *(out / f for f in state.pooled.get(result.name, []))]
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
    traces = sorted(result.path.glob("*.pt.trace.json*"))
    if not traces:
        return None
    return _diagnose_folder(result.path.resolve(), file_stamps([*traces, result.path / TRIAL_FILE]))


# A trial is diagnosed for its own row and again each time it is the best the search goes on from: once per
# state of its files (a trial folder written again is diagnosed again). Diagnoses are never modified.
@functools.lru_cache(maxsize=16)
def _diagnose_folder(folder: Path, _stamps: tuple):
    from advisor.analysis.analyze import analyze_path
    from advisor.analysis.job import job_diagnosis, jobs_of
    from advisor.code.lint import script_findings

    diagnoses = analyze_path(folder, linter=script_findings)
    jobs = jobs_of(diagnoses) if len(diagnoses) > 1 else []
    return job_diagnosis(jobs[0]) if jobs else diagnoses[0]


def lint_script(script: Path) -> list[dict] | None:
    """`advisor lint` findings on the script, for the report; None when it cannot be checked."""
    from advisor.code.lint import LintError, lint_file

    try:
        return [f.to_dict() for f in lint_file(script)]
    except LintError:
        return None


def subprocess_runner(target: str, out: Path, options: SessionOptions, state: SessionRecord,
                      progress: Callable[[Any], None] | None = None) -> TrialRunner:
    """Trials of the script in fresh subprocesses (the CLI's way), in `out/trials/<name>`; the DataLoader
    knobs go to the training loader the baseline found. The trial in flight is in the record (its
    process and token), so that `--resume` after a kill can end what it left behind."""
    recording = threading.Lock()  # two trials in turns start, and end, at once

    def started(name: str) -> Callable[[int, str], None]:
        def record(pid: int, token: str) -> None:
            with recording:
                state.running_trial = RunningTrial(name=name, pid=pid, token=token)
                save(state)
        return record

    def run(name: str, knobs: Knobs, against: dict[str, Any] | None = None,
            turns: dict[str, Any] | None = None, windows: int | None = None) -> TrialResult:
        # Windows in turns with another trial: it waits while the other measures, so it may take twice as long,
        # and as long again for each window beyond the session's (the speedup's runs take more).
        windows = windows or options.windows
        limit = (trial_time_limit(options, knobs) * (2 if turns else 1)
                 + 2 * max(0, windows - options.windows) * options.window_s)
        told = progress
        if progress is not None:  # the time left to the answer beside the trial's own, for the progress line
            answer = answer_seconds(out, state, options.max_trials, 2 if turns else 1, options.time_budget_s)
            told = lambda p: progress(dataclasses.replace(p, answer_s=answer))  # noqa: E731
        try:
            spec = TrialSpec(target, knobs, out / "trials" / name, name=name, steps=options.steps, wait=options.wait,
                             warmup=options.warmup, device=options.device, script_args=options.script_args,
                             timeout_s=limit, memory_limit=options.memory_limit, windows=windows,
                             window_s=options.window_s, step=options.step, loader=state.get("training_loader"),
                             nproc_per_node=options.nproc_per_node, torchrun_args=options.torchrun_args,
                             ray_address=options.ray_address, nnodes=options.nnodes, against=against, turns=turns)
            return run_trial(spec, on_start=started(name), on_progress=told)
        finally:
            with recording:
                state.running_trial = None

    # Its windows can follow a comparison; two trials at once, their windows in turns
    # (advisor.trials.record.turns): one process each, on one node.
    return Runner(run, adaptive=options.windows > 0,
                  paired=options.windows > 0 and options.nproc_per_node <= 1 and options.ray_address is None)


def trial_time_limit(options: SessionOptions, knobs: Knobs) -> float:
    """Seconds a trial may take: --timeout, and as long again (at least a knob's `first_steps_s` more) for one
    whose knobs hold up its first steps (a compile)."""
    allowance = max((k.first_steps_s for k in KNOBS if k.first_steps_s and getattr(knobs, k.name)), default=None)
    return options.timeout_s + (max(options.timeout_s, allowance) if allowance is not None else 0.0)


def end_left_behind(state: SessionRecord, log: Callable[[str], None]) -> None:
    """End the processes of the trial a killed session left running (only those that carry its token)."""
    running = state.get("running_trial")
    if running is not None:  # its types checked on resume: a pid and a token
        if trial_processes(running.pid, running.token):
            log(f"ending the processes of trial {running.name}, left running when the session stopped")
            end_trial_processes(running.pid, running.token)
    state.running_trial = None


def run_one(run: TrialRunner, state: SessionRecord, index: int, proposal: Proposal | None, slug: str,
         log: Callable[[str], None], target: Any = None) -> tuple[TrialResult, dict[str, Any], Measurement]:
    """Run one trial (its windows measured until they settle the comparison with `target`, an
    `advisor.trials.record.adaptive.Against`, where the runner can); return it, its record and its own measurement."""
    knobs = Knobs() if proposal is None else proposal.knobs
    if target is not None and run.adaptive:
        result = run(f"{index:02d}-{slug}", knobs, against=target.to_dict())
    else:
        result = run(f"{index:02d}-{slug}", knobs)
    record = trial_record(result.path)
    trace_note(state, record, index)
    return result, record, measure_record([record])


def trace_note(state: SessionRecord, record: dict[str, Any], index: int) -> None:
    """The session's notes where the profiler recorded fewer steps than asked (the trace's memory budget), and
    where a trial measured fewer windows than asked (its time limit), once each."""
    plan = record.get("trace_plan")
    if isinstance(plan, dict) and plan.get("reason") and not any("the profiler recorded" in n for n in state.notes):
        state.notes.append(f"the profiler recorded {plan.get('steps')} of {plan.get('steps_asked')} step(s) "
                           f"from trial {index:02d} on: {plan['reason']} (ADVISOR_TRACE_BUDGET sets the budget)")
    cut = record.get("windows_cut")
    if isinstance(cut, str) and not any("would outlast" in n for n in state.notes):
        state.notes.append(f"trial {index:02d}: {cut} (--timeout gives a trial more time)")


def figures_text(row: TrialRow, unit: str) -> str:
    """A trial's samples/s (or steps/s: the session's `unit`) with its interval, for the log."""
    if not row.samples_per_s:
        return f"{row.status}: {row.message or ''}".strip()
    interval = row.get("interval")
    spread = f" (95%: {interval[0]:.1f}–{interval[1]:.1f})" if interval else ""
    return f"{row.samples_per_s:.1f} {unit}{spread}"


def predicted_text(row: TrialRow) -> str:
    """What was predicted beside what was measured, for the log line of a trial."""
    if row.get("predicted_samples_gain") is None or row.gain is None:
        return ""
    return f" (predicted {100 * row.predicted_samples_gain:+.0f}%, measured {100 * row.gain:+.0f}%)"


def own_bound(result: TrialResult, measurement: Measurement):
    """A trial's own bound (what bound it, once measured), for its row."""
    return trial_bound(result.status, diagnose_trial(result) if result.ok else None, measurement)


def decide_row(row: TrialRow, result: TrialResult, decision, inconclusive: bool) -> None:
    """Fill in a row's decision from the trial's status and the keep/revert decision."""
    if decision is None:
        row.update(decision="failed", reason=f"trial {result.status}: {result.message}")
        return
    row.update(decision="kept" if decision.keep else "reverted", gain=decision.gain, noise=decision.noise,
               reason=f"inconclusive, measured again: {decision.reason}" if inconclusive else decision.reason)

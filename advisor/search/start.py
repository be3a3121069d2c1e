"""The start of a session: its record opened (new, or resumed where it stopped), the baseline (the user's own
settings, and what it found of the script: its own settings, its training loader, its device), and where the
baseline ran out of memory, the recovery plan tried until a configuration fits. Torch-free."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable

import os
from contextlib import contextmanager
from typing import Iterator

import msgspec

from advisor.search.record import OwnSetting, SessionRecord, TrialRow
from advisor.errors import AdvisorError
from advisor.knobs import MEMORY_KNOBS, amp
from advisor.search.outputs import out_of_memory_note
from advisor.search.proposal import check_on_best
from advisor.search.space import own_text
from advisor.search.state import SESSION_FILE, SessionOptions, discard_unstarted, lock_session, new_state, \
    reference_row, resume_state, save, trial_row
from advisor.search.strategy import SearchSpace, recovery_plan, turned
from advisor.search.trial_runner import TrialRunner, as_runner, end_left_behind, figures_text, lint_script, own_bound, \
    recorded_losses, run_one, subprocess_runner
from advisor.trials.knobs import Knobs
from advisor.trials.launch.profiler_check import cuda_profiler_problem
from advisor.trials.launch.runner import TrialFailed
from advisor.trials.harness.targets import absolute_step, absolute_target, parse_target
from advisor.trials.record import load_trial


@contextmanager
def session_folder(out: Path, options: SessionOptions, resume: bool, checked: bool) -> Iterator[Path]:
    """The session's folder, checked and held: one session at a time in it, for as long as this one runs; left
    as it was where the session failed before it began. `checked`: the script's trials will run here, so a
    CUDA baseline whose trace would hold no kernels (CUPTI refused) is not measured at all."""
    out = Path(out).resolve()
    if checked and not resume:
        problem = cuda_profiler_problem(options.device)
        if problem:
            raise AdvisorError(problem)
    if resume and not out.is_dir():
        raise AdvisorError(f"{out}: no such folder: there is no session to resume")
    if resume and not (out / SESSION_FILE).is_file():
        raise AdvisorError(f"{out}: no {SESSION_FILE} here: not a session folder, nothing to resume")
    created = not out.exists()
    lock = lock_session(out)
    try:
        yield out
    finally:
        os.close(lock)
        if not (out / SESSION_FILE).exists():  # it failed before it began: leave nothing behind
            discard_unstarted(out, created)


def runner_for(runner: Any, target: str, out: Path, options: SessionOptions, state: SessionRecord,
               progress: Callable[[Any], None] | None) -> TrialRunner:
    """What runs the session's trials: the runner given (a notebook's, a replay's), else the script's trials in
    fresh subprocesses (`progress` told where each is)."""
    return as_runner(runner) if runner is not None else subprocess_runner(target, out, options, state, progress)


def failure_note(exc: Exception) -> str:
    """The record's note for a session that failed: our one-line error as it is, anything else with its type."""
    return f"failed: {exc}" if isinstance(exc, AdvisorError) else f"failed: {type(exc).__name__}: {exc}"


def open_record(out: Path, target: str, options: SessionOptions, command: str, resume: bool, script: bool,
                extra: dict[str, Any] | None, log: Callable[[str], None]) -> tuple[SessionRecord, str, SessionOptions]:
    """The session's record, its target and options: a new one (`extra` fields added), or the one in `out` to
    resume (its own target and options; processes a killed session left behind are ended). A session that is
    done already comes back with status "done", and nothing to resume."""
    if resume:
        state = resume_state(out)
        if state.status == "done":  # nothing to resume: say so, and leave the record as it is
            stopped = next((n for n in reversed(state.notes) if str(n).startswith("stopped")),
                           f"{len(state.trials)} trial(s), best {state.best}")
            log(f"{out}: this session is done ({stopped}); nothing to resume. Its report: {out / 'report.html'}")
            return state, target, options
        end_left_behind(state, log)
        target, options = state.target, SessionOptions.from_dict(state.options)
        state.status = "running"
    else:
        if (out / SESSION_FILE).exists():
            raise AdvisorError(f"{out}: already holds a session; use --resume {out} or another --out")
        if script:  # absolute paths: a session resumed from another working folder finds its files
            target = absolute_target(target)
            options = dataclasses.replace(options, step=absolute_step(options.step))
        path = str(parse_target(target)[0]) if script else None
        state = new_state(target, path, out, options, command, lint_script(Path(path)) if path else None)
        state.update(**(extra or {}))
    return state, target, options


def reference(run: TrialRunner, out: Path, state: SessionRecord, log: Callable[[str], None],
              space: SearchSpace) -> tuple[TrialRow, list[float]]:
    """The row every change is measured from, and its losses: the baseline (run where the record has none yet),
    or the recovery that fits where it ran out of memory; a baseline that failed ends the session with why."""
    if not state.trials:
        run_baseline(run, state, log)
    if reference_row(state) is None and state.trials[0].status == "oom":
        recover_from_oom(run, state, log, space)
    row = reference_row(state)
    if row is None:
        first = load_trial(out / state.trials[0].folder)
        if first.traceback and first.status != "oom":
            log(first.traceback.rstrip())
        what = "no configuration fits in memory" if first.status == "oom" else f"baseline trial {first.status}"
        raise TrialFailed(f"{what}: {first.message} (trial folder {first.path})")
    return row, recorded_losses(out / row.folder)


def run_baseline(run: TrialRunner, state: SessionRecord, log: Callable[[str], None]) -> None:
    """Run the baseline, the user's own settings, and keep what it found of the script in the record."""
    log("trial 00: baseline")
    baseline, record, measurement = run_one(run, state, 0, None, "baseline", log)
    state.device = record.get("device_facts")
    state.memory_cap = record.get("memory_cap")
    state.user_values = record.get("user_values") or {}
    state.own_settings = msgspec.convert(record.get("own_settings") or {}, dict[str, OwnSetting])
    state.training_loader = record.get("training_loader")
    state.sites = record.get("sites") or {}
    state.unit = measurement.unit
    if record.get("single_rank_job"):
        state.notes.append("the script called init_process_group: each trial runs it as a one-rank job "
                           "(--nproc-per-node N runs N ranks)")
        log(f"  note: {state.notes[-1]}")
    if baseline.ok and (note := amp.not_tried_here(state.device, state.own_settings)):
        state.notes.append(note)
        log(f"  note: {note}")
    if baseline.ok and measurement.unit == "steps/s":
        state.notes.append("no step took a batch from a DataLoader or as an argument: speed is measured in "
                           "steps/s, and the batch-size and DataLoader knobs do not apply")
    row = trial_row(0, baseline, record, None, state, measurement,
                    own_bound(baseline, measurement) if baseline.ok else None)  # the report's verdict shows it
    row.decision = "baseline" if baseline.ok else "failed"
    row.reason = "the user's own settings" if baseline.ok else f"{baseline.status}: {baseline.message}"
    if state.own_settings:
        row.reason += f"; the script's own: {own_text(state.own_settings, state)}"
        log(f"  the script's own: {own_text(state.own_settings, state)}")
    row.speedup = 1.0 if baseline.ok else None
    state.trials.append(row)
    state.baseline = state.best = baseline.name
    state.final_knobs = Knobs().to_dict()
    if baseline.status == "oom":
        state.notes.append(out_of_memory_note(record))
    losses = recorded_losses(baseline.path)
    if baseline.ok and losses and not all(math.isfinite(x) for x in losses):
        state.notes.append("the baseline's loss is not finite: changes are checked for a finite loss only, "
                           "not for one close to the baseline's")
    if baseline.ok and not losses:
        state.notes.append("the step returned no loss and ran no backward() of a scalar: each change's loss "
                           "check (finite, within 25% of the baseline's) is skipped")
    log(f"  {figures_text(row, state.unit)}")
    save(state)


def recover_from_oom(run: TrialRunner, state: SessionRecord, log: Callable[[str], None], space: SearchSpace) -> None:
    """Try the recovery plan in order until a configuration fits (resumable: tried ones are skipped); only the
    knobs the user lets the search turn (--only, --skip)."""
    tried = {json.dumps(t.knobs, sort_keys=True) for t in state.trials}
    for proposal in recovery_plan(state):
        if (json.dumps(proposal.knobs.to_dict(), sort_keys=True) in tried
                or not space.permits(turned({}, proposal.knobs))
                or any(getattr(proposal.knobs, k) and not space.allows(k) for k in MEMORY_KNOBS)):
            continue
        check_on_best(proposal, Knobs())
        index = len(state.trials)
        log(f"trial {index:02d}: {proposal.change} (the baseline ran out of memory)")
        result, record, measurement = run_one(run, state, index, proposal, proposal.slug, log)
        row = trial_row(index, result, record, proposal, state, measurement, own_bound(result, measurement))
        if result.ok:
            row.update(decision="kept", reason="fits in memory", speedup=1.0)
            state.best = result.name
            state.final_knobs = result.knobs.to_dict()
            if proposal.recommendation == "oom-smaller-batch":
                state.notes.append(
                    f"Only a smaller batch fits: {proposal.change}. This changes training: scale the learning "
                    "rate down with the batch, or find memory elsewhere (activation checkpointing, a smaller "
                    "model).")
        else:
            row.update(decision="failed", reason=f"{result.status}: {result.message}")
        state.trials.append(row)
        log(f"  {row.decision}: {row.reason}")
        save(state)
        if result.ok:
            return

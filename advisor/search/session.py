"""The optimization session: baseline → diagnose → apply what addresses the bound → measure → keep or revert → …

Each trial is a real, profiled run of the user's unchanged script (advisor.trials.launch.runner), or of
a notebook's step in its own process (advisor.api), or a recorded trial served from a response surface
(advisor.trials.replay.surface): a runner turns (name, knobs) into a finished trial; everything else is
the same. What to try next, what follows a decision, when to stop and how a candidate is judged are the
policy's (`advisor.search.policy`: the one seam between the loop and the search's choices); one trial and
its decision, `advisor.search.attempt`; the start (the record, the baseline, out-of-memory recovery),
`advisor.search.start`; the end (the confirmation and the speedup), `advisor.search.ending`. This module runs
the loop, persists it after every trial
(session.json, atomically, so a session killed at any moment resumes with `--resume DIR`, losing at most
the trial in flight) and writes the outputs. Torch-free: trials run elsewhere.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from advisor.search.record import SessionRecord
from advisor.search import best as the_best, outputs as the_outputs, start
from advisor.search.attempt import attempt
from advisor.search.ending import finish
from advisor.search.policy import Policy
from advisor.search.state import SessionOptions, save
from advisor.search.strategy import SearchSpace
from advisor.search.trial_runner import TrialRunner


# --- the session ------------------------------------------------------------------------------------

def run_session(target: str, out: Path, options: SessionOptions, *, command: str = "", resume: bool = False,
                log: Callable[[str], None] = print, runner: TrialRunner | None = None,
                script: bool = True, space: SearchSpace | None = None,
                extra: dict[str, Any] | None = None,
                progress: Callable[[Any], None] | None = None, outputs: bool = True) -> SessionRecord:
    """Run (or resume) the session until no change left is worth a trial or the budget is spent; return the
    record.

    Trials run in subprocesses unless `runner` runs them some other way (the notebook API runs them in
    its own process; a replay serves recorded ones; a runner whose `remeasure` is False cannot measure
    a setting twice). `script=False`: the target only names a step (e.g. "<notebook>:train_step"), so
    there is no script to check or patch. `space`: the values the search may give each knob (those a
    recorded surface holds); `extra`: fields added to a new session record; `progress`: told where each
    trial of the subprocess runner is while it runs (`run_trial`'s `on_progress`); `outputs=False`: session.json
    only, without the report, the TensorBoard runs and suggested.patch (for a caller that reads the decisions alone:
    a replayed search, the replay benchmark; about a second a session). Before the baseline of a
    new session whose trials may run on CUDA, the profiler is checked in a fresh process: where its trace
    would hold no GPU kernels, or --device cuda finds no device, the session stops with why and the fix.
    """
    with start.session_folder(out, options, resume, checked=runner is None and script) as folder:
        return _run_locked(target, folder, options, command, resume, log, runner, script, space, extra, progress,
                           outputs)


def _run_locked(target: str, out: Path, options: SessionOptions, command: str, resume: bool,
                log: Callable[[str], None], runner: TrialRunner | None, script: bool, space: SearchSpace | None,
                extra: dict[str, Any] | None, progress: Callable[[Any], None] | None = None,
                outputs: bool = True) -> SessionRecord:
    state, target, options = start.open_record(out, target, options, command, resume, script, extra, log)
    if state.status == "done":
        return state
    (out / "trials").mkdir(parents=True, exist_ok=True)
    save(state)
    log(options.budget_text())
    started = time.monotonic()
    run = start.runner_for(runner, target, out, options, state, progress)
    policy = Policy.of(out, options, space or SearchSpace(), run, started)
    finish_outputs = the_outputs.finish_outputs if outputs else _record_only
    try:
        _sequence(policy, state, log, finish_outputs)
    except KeyboardInterrupt:
        state.status = "interrupted"
        state.notes.append("interrupted: the report shows the trials finished so far")
        try:  # the report of what was measured, as for any session; a second Ctrl-C leaves the record alone
            finish_outputs(out, state)
        except (Exception, KeyboardInterrupt) as problem:
            log(f"no report: {type(problem).__name__}: {problem}")
        state.notes.pop()  # a resumed session goes on; the note was for this report
        save(state)
        log(f"interrupted: resume with  advisor profile --resume {out}")
        raise
    except Exception as exc:  # the session ends with its record and a report that say what went wrong
        state.status = "failed"
        state.notes.append(start.failure_note(exc))
        try:
            finish_outputs(out, state)
        except Exception as problem:  # the record is saved; a report that cannot be made must not hide why
            log(f"no report: {type(problem).__name__}: {problem}")
            save(state)
        raise
    return state


def _record_only(out: Path, state: SessionRecord) -> None:
    """The outputs of a session run with `outputs=False`: its record, saved."""
    save(state)


def _sequence(policy: Policy, state: SessionRecord, log: Callable[[str], None],
              finish_outputs: Callable[[Path, SessionRecord], None]) -> None:
    """The loop: the baseline (and its recovery from out of memory), then trial after trial on the best until the
    policy stops, then the end: the best confirmed, the speedup read, the outputs written."""
    run, out = policy.run, policy.out
    reference, reference_losses = start.reference(run, out, state, log, policy.space)
    best = the_best.best_trial(out, state)
    while True:
        diagnosis, best_measure, bound = the_best.bound_of(out, state, best)
        proposals = policy.next_trials(state, best, diagnosis, bound)
        stopped = policy.stop(state, proposals)
        if stopped is not None:
            if stopped:
                state.notes.append(stopped)
            break
        proposal = proposals[0]
        why = proposal.why or (f"addresses the bound: {bound.label}" if proposal.helps_now and bound.name
                               else f"a round over the knobs; the bound is {bound.label}")
        result, decision = attempt(policy, state, proposal, why, best.knobs, best_measure, reference_losses, log,
                                   proposals[1:])
        # A next move on a change that did not pay (a swap, or a pair), measured against the best; a pair that
        # could not run gives way once to the next of its direction.
        second, second_why = policy.follow_up(state, best, proposal, result, decision, bound)
        first_result = result
        for _ in range(policy.pair_tries):
            if second is None or not policy.room(state):
                break
            result, decision = attempt(policy, state, second, second_why, best.knobs,
                                       the_best.measured_best(out, state), reference_losses, log)
            if result.ok or "+" not in second.recommendation:
                break
            second, second_why = policy.give_way(state, best, first_result, proposal, second)
        if decision is not None and decision.keep:
            best = the_best.keep(state, result)
        elif state.best != best.name:  # the best, measured again beside a candidate, stays the best
            best = the_best.best_trial(out, state)
        save(state)
    best = finish(run, out, state, policy.options, best, reference, reference_losses, log, policy.started)
    the_best.bound_of(out, state, best)
    the_outputs.wrap_up(out, state, policy.options, finish_outputs)

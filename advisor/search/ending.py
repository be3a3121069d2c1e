"""The end of a session: the best confirmed against the runner-up (the other setting that measured fastest),
both measured again and pooled with their runs while the budget allows; then the speedup read at one load.
Where the runner can run two trials at once (`run.paired`: the CLI's subprocesses), the baseline and the best
run side by side, their windows in turns (`speedup_in_turns`, `advisor.trials.record.turns`); elsewhere the
baseline runs once more right before the best (`baseline_again`, `run_best_after_baseline`). Torch-free."""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from pathlib import Path
from typing import Any, Callable

from advisor.search.record import SessionRecord, TrialRow
from advisor.knobs import NEUTRAL
from advisor.search.decision import decide
from advisor.search.drift import at_one_load, load_text, pair_changed, quiet_as_ever
from advisor.search.applicable import applied_only, in_effect
from advisor.search.budget import CONFIRM_TRIALS, SPEEDUP_BUDGET, SPEEDUP_DRAWS, end_cut_short, trials_left
from advisor.search.draws import NARROWING, between, measured_spread, pair_narrowing, run_counts, run_to_run_note, \
    session_runs, session_spread
from advisor.search.runner_up import contender, worth_confirming
from advisor.search.simplify import fewer_changes
from advisor.search.remeasures import first_change, measured_at_one_load, once_more, run_folders, runs_of
from advisor.search.speedup import session_speedup, speedup_note
from advisor.search.proposal import Proposal
from advisor.search.state import SessionOptions, best_row, save, trial_row
from advisor.search.strategy import knobs_key
from advisor.search.trial_runner import TrialRunner, figures_text, measure_record, measured, own_bound, \
    recorded_losses, run_one, trial_record, trial_time_limit
from advisor.trials.record import TrialResult, load_trial
from advisor.trials.record.measurement import Measurement, noise
from advisor.trials.record.turns import finished, start_turns, windows_log

CONFIRM_ROUNDS = 3  # at most: a budget left over is spent telling the two fastest settings apart


def finish(run: TrialRunner, out: Path, state: SessionRecord, options: SessionOptions, best: TrialResult,
           reference: TrialRow, reference_losses: list[float], log: Callable[[str], None],
           started: float | None = None) -> TrialResult:
    """The end of the search: the best confirmed, then the speedup read (in turns with the baseline where the
    runner runs two trials at once, else from the baseline once more right before the best), with the note
    that says how, each as the budget left allows (its trials, and its time: --time-budget counts from `started`);
    returns the best, which the confirmation may have changed."""
    in_turns, side_by_side = None, False
    cut, searched = end_cut_short(out, state, options, started), len(state.trials)
    if run.paired:  # the baseline and the best side by side, windows in turns, after the best is confirmed
        # The first round before any pair for the speedup; a later one (the two still within the noise) only
        # before the speedup's second pair, its second draw of the two settings' levels.
        kept_back = options.max_trials >= SPEEDUP_BUDGET
        best = confirm_best(run, out, state, options, best, reference_losses, log,
                            leave=PAIR_TRIALS if kept_back else 0,
                            leave_later=PAIR_TRIALS * SPEEDUP_DRAWS if kept_back else 0, started=started)
        in_turns = speedup_in_turns(run, out, state, options, reference, log, started) if run.remeasure else None
        if state.best != best.name:  # slower than the baseline in turns: the session went back to it
            best = applied_only(load_trial(out / best_row(state).folder))
    else:
        baseline = baseline_again(run, out, state, options, reference, log, started)
        best = confirm_best(run, out, state, options, best, reference_losses, log, started=started)
        side_by_side = baseline is not None and run_best_after_baseline(run, out, state, options, baseline, log,
                                                                        started)
    if in_turns is not None:
        state.speedup, state.speedup_basis = in_turns, "in turns"
        if state.best != reference.name:  # else the note of the way back says it
            state.notes.append(speedup_note(state, reference))
    else:
        state.speedup, state.speedup_basis = session_speedup(out, state, reference)
        if state.speedup_basis != "direct" or side_by_side:
            state.notes.append(speedup_note(state, reference, side_by_side))
    if cut and len(state.trials) == searched and state.best != reference.name:
        state.notes.append(cut)
    if state.best != reference.name and state.speedup:
        state.notes.append(run_to_run_note(out, state, reference, best_row(state)))
    return best


def baseline_again(run: TrialRunner, out: Path, state: SessionRecord, options: SessionOptions,
                   reference: TrialRow, log: Callable[[str], None], started: float | None = None) -> str | None:
    """Before the best is confirmed, where the budget allows the best a run right after it, measure the
    baseline once more, so that the claimed speedup rests on runs of both at one load (`session_speedup` reads
    every run of the two cut to their windows at one load), not on what the machine did between the
    baseline's first run and the best's. The name of its row, or None."""
    top = best_row(state)
    # Never in the place of the confirmation's two trials: it is the best that the user banks on.
    if (not run.remeasure or trials_left(out, state, options, started) < CONFIRM_TRIALS + 1
            or knobs_key(in_effect(top)) == knobs_key(in_effect(reference))):
        return None
    row = _speedup_run(run, state, reference, "the baseline", "right before the best", log)
    return row.name if row.decision == "measured" else None


def run_best_after_baseline(run: TrialRunner, out: Path, state: SessionRecord, options: SessionOptions, baseline: str,
                            log: Callable[[str], None], started: float | None = None) -> bool:
    """The best once more right after the baseline's run for the speedup, unless confirming it ran it since;
    whether the best has a run after the baseline's."""
    rows = state.trials
    after = rows[next(i for i, t in enumerate(rows) if t.name == baseline) + 1:]
    key = knobs_key(in_effect(best_row(state)))
    if any(t.status == "ok" and knobs_key(t.knobs) == key for t in after):
        return True
    if trials_left(out, state, options, started) < 1:
        return False
    return _speedup_run(run, state, best_row(state), "the best", "right after the baseline", log).decision == "measured"


def measured_row(state: SessionRecord, index: int, result: TrialResult, record: dict[str, Any], proposal: Proposal,
                 measurement: Measurement, reason: str) -> TrialRow:
    """The row of a setting run once more for the speedup ("measured", with its load), appended; `reason` where
    it ran, its failure where it did not."""
    new = trial_row(index, result, record, proposal, state, measurement if result.ok else None,
                    own_bound(result, measurement) if result.ok else None)
    new.update(decision="measured" if result.ok else "failed", load=load_text(record),
               reason=reason if result.ok else f"trial {result.status}: {result.message}")
    state.trials.append(new)
    return new


def _speedup_run(run: TrialRunner, state: SessionRecord, row: TrialRow, what: str, where: str,
                 log: Callable[[str], None]) -> TrialRow:
    """Run a setting of the session once more, for the speedup at one load; its row."""
    proposal = once_more(row, "for the speedup at one load", "speedup")
    index = len(state.trials)
    log(f"trial {index:02d}: {what} ({row.name}) once more, for the speedup at one load")
    result, record, measurement = run_one(run, state, index, proposal, f"speedup-{row.name[:2]}", log)
    new = measured_row(state, index, result, record, proposal, measurement,
                       f"{row.name} again, {where}, for the speedup at one load")
    save(state)
    return new


def confirm_best(run: TrialRunner, out: Path, state: SessionRecord, options: SessionOptions, best: TrialResult,
                  reference_losses: list[float], log: Callable[[str], None],
                  leave: int = 0, leave_later: int | None = None, started: float | None = None) -> TrialResult:
    """Before the session ends, measure the best and the runner-up (`contender`: the fastest other setting that
    may still be the faster) once more, and keep whichever the pooled runs say is faster; again while the one left
    behind may still be (`worth_confirming`), up to CONFIRM_ROUNDS rounds, as the budget allows, `leave` trials
    aside (`leave_later` after the first round, else as many; each round's runs pooled with the earlier ones).
    Returns the best."""
    for number in range(CONFIRM_ROUNDS):
        aside = leave if number == 0 or leave_later is None else leave_later
        best, unsettled = _confirm_round(run, out, state, options, best, reference_losses, log, aside, started)
        if not unsettled:
            break
    return best


def _confirm_round(run: TrialRunner, out: Path, state: SessionRecord, options: SessionOptions, best: TrialResult,
                   reference_losses: list[float], log: Callable[[str], None],
                   leave: int = 0, started: float | None = None) -> tuple[TrialResult, bool]:
    """One round of `confirm_best`: (the best, whether the two are still within the noise of each other)."""
    if not run.remeasure or trials_left(out, state, options, started) < CONFIRM_TRIALS + leave:
        return best, False
    top, found = best_row(state), contender(out, state, best, options.min_gain)
    if found is None:
        return best, False
    runner_up, earlier = found
    confirmed, runs = {}, {}
    both = ((top, run_folders(out, state, top)), (runner_up, earlier))
    proposals = [(once_more(row, "confirming the best", "confirm"), f"confirm-{row.name[:2]}") for row, _ in both]
    in_turns = run.paired and fit_together([top, runner_up], state)
    if in_turns:  # side by side, their windows in turns: a load that comes and goes falls on both alike
        index = len(state.trials)
        log(f"trials {index:02d}-{index + 1:02d}: {top.name} and {runner_up.name} side by side, their windows "
            "in turns, to confirm the best against the runner-up")
        paired = run_pair(run, out, state, options, proposals, settle=pair_settle(out, state))
    for i, ((row, folders), (proposal, slug)) in enumerate(zip(both, proposals)):
        index = len(state.trials)
        if in_turns:
            result, record, _ = paired[i]
        else:
            log(f"trial {index:02d}: {row.name} once more, to confirm the best against the runner-up")
            result, record, _ = run_one(run, state, index, proposal, slug, log)
        # Windows in turns are at one load by construction: the two are decided on those runs alone.
        folders = [] if in_turns else folders
        pooled = (measured(out, state, result, folders) if folders else paired[i][2]) if result.ok else None
        new = trial_row(index, result, record, proposal, state, pooled, own_bound(result, pooled))
        new.update(decision="measured" if result.ok else "failed",
                   reason=(f"{row.name} again, its windows in turns with the other's" if in_turns else
                           f"{row.name} again, pooled with its earlier runs") if result.ok else
                   f"trial {result.status}: {result.message}")
        state.trials.append(new)
        if result.ok and folders:
            state.pooled[result.name] = [os.path.relpath(f, out) for f in folders]
            runs[row.name] = runs_of(out, state, row.knobs)  # every run of the setting, latest first
        confirmed[row.name] = (result, pooled, new)
        save(state)
    (kept, kept_m, kept_row), (other, other_m, other_row) = confirmed[top.name], confirmed[runner_up.name]
    if kept_m is None or other_m is None:  # a confirming run failed: the best stands as it was decided
        for row in (kept_row, other_row):
            if row.decision == "measured":
                row.update(decision="reverted", reason=row.reason + "; the other run failed, nothing changes")
        save(state)
        return best, False
    changed = None if in_turns else pair_changed(runs[top.name], runs[runner_up.name])
    at_one_load = True  # the two figures were measured at one load: in turns, on a steady machine, or matched
    if changed is not None:  # pooled runs span loads: decide on the runs of both measured at one load
        matched = measured_at_one_load(runs[top.name], runs[runner_up.name])
        at_one_load = matched is not None  # else the two latest runs, at loads of their own
        kept_m, other_m = matched or (measure_record(runs[top.name][:1]), measure_record(runs[runner_up.name][:1]))
        other_row.drift = changed
    losses = recorded_losses(other.path)
    decision = decide(kept_m, other_m, losses, reference_losses, options.min_gain)
    if (not decision.keep and decision.gain > 0 and at_one_load
            and not decision.reason.startswith(("loss", "no throughput"))
            and changed_knobs(other_row, state) - changed_knobs(kept_row, state) <= NEUTRAL
            and not kept_beyond_noise_over(state, top, runner_up)):
        # Both measured again at one load, and the runner-up changes nothing the best leaves alone but how
        # batches reach the step: the faster pooled figure is the better bet (the best's lead was itself within
        # the noise). A runner-up that changes what is computed (AMP, the batch, the model) must beat the best
        # beyond the noise, and where no windows of the two ran at one load the best stays unless beaten beyond it.
        decision = dataclasses.replace(decision, keep=True, reason=f"{decision.reason}; the faster as measured, "
                                       "and it changes no more of what the step computes")
    larger = max((top, runner_up), key=lambda row: len(script_changes(row, state)))
    if not kept_beyond_noise(state, larger):
        # Of two settings the runs cannot tell apart, the one that changes less (in turns: one run each, else pooled).
        draws = between(measured_spread(state, run), *((1, 1) if in_turns else (len(both[0][1]) + 1, len(earlier) + 1)))
        decision = fewer_changes(decision, script_changes(kept_row, state), script_changes(other_row, state), draws)
    winner, winner_row = (other, other_row) if decision.keep else (kept, kept_row)
    winner_row.update(decision="kept")
    (kept_row if decision.keep else other_row).update(decision="reverted")
    other_row.update(gain=decision.gain, noise=decision.noise, reason=other_row.reason + f": {decision.reason}"
                     + (f" ({changed}: decided on the runs of both measured at one load)" if changed else ""))
    log(f"  confirmed: {first_change(winner_row.change)} is the best "
        f"({figures_text(winner_row, state.get('unit') or 'samples/s')})")
    state.best = winner.name
    state.final_knobs = applied_only(winner).knobs.to_dict()
    save(state)
    behind = -decision.gain if decision.keep else decision.gain  # the lead of the one left behind
    return applied_only(winner), worth_confirming(behind, decision.noise, options.min_gain)


def kept_beyond_noise_over(state: SessionRecord, top: TrialRow, other: TrialRow) -> bool:
    """Whether the best's setting was kept over the other's, measured against it beyond the noise: a confirmation
    within the noise then does not undo it on its faster figure alone (a batch kept at +21 %, noise 5 %, over
    the workers' setting, was given back on a confirmation that read the workers' +11 %, noise 19 %)."""
    rows = {t.name: t for t in state.trials}
    mine, theirs = knobs_key(in_effect(top)), knobs_key(in_effect(other))
    return any(t.decision == "kept" and knobs_key(in_effect(t)) == mine and t.get("base") in rows
               and knobs_key(in_effect(rows[t.base])) == theirs and (t.gain or 0) > (t.noise or 0)
               for t in state.trials)


def kept_beyond_noise(state: SessionRecord, row: TrialRow) -> bool:
    """Whether the search kept this row's setting by a gain beyond its noise: a measurement that showed what it
    changes pays (a replay kept bf16 with batch 256 at +14.9 %, noise 13.5 %, over batch 128; the end's confirmation,
    under a moving load, then read it 11.5 % ahead of batch 256 alone, within that run's noise)."""
    mine = knobs_key(in_effect(row))
    return any(t.decision == "kept" and knobs_key(in_effect(t)) == mine
               and (t.gain or 0) > (t.noise or 0) for t in state.trials)


def changed_knobs(row: TrialRow, state: SessionRecord) -> set[str]:
    """The script's own settings a trial's knobs change."""
    return set(script_changes(row, state))


def script_changes(row: TrialRow, state: SessionRecord) -> dict[str, Any]:
    """The script's own settings a trial's knobs change, each to its value."""
    user = state.user_values or {}
    return {k: v for k, v in in_effect(row).items() if v is not None and v != user.get(k)}


PAIR_TRIALS = 2  # the baseline and the best, side by side
SPEEDUP_WINDOWS = 2  # times a trial's windows, for the speedup in turns: what the user banks on, and quiet spells
SPEEDUP_PAIRS = 3  # at most, as the budget allows: each pair one more draw of both settings' level
MEMORY_HEADROOM = 0.9  # two trials at once only where both peaks fit in this share of what is free


def fit_together(rows: list[TrialRow], state: SessionRecord) -> bool:
    """Whether two settings' trials fit in memory at once: on a GPU both peaks in its capacity, on the CPU in
    the memory free now (measured peaks; a setting with none is taken to fit)."""
    peaks = [row.peak_memory_bytes or 0 for row in rows]
    if (state.device or {}).get("type") == "cuda":
        capacity = max((row.capacity_bytes or 0 for row in rows), default=0)
        return not capacity or sum(peaks) <= MEMORY_HEADROOM * capacity
    import psutil

    return sum(peaks) <= MEMORY_HEADROOM * psutil.virtual_memory().available


def run_pair(run: TrialRunner, out: Path, state: SessionRecord, options: SessionOptions,
             proposals: list[tuple[Proposal, str]], windows: int | None = None,
             settle: float = 0.0) -> list[tuple[TrialResult, dict[str, Any], Measurement]]:
    """Two settings run at once, each a trial of its own, their measurement windows in turns (`windows` each,
    else the session's; fewer once their ratio's noise is within `settle`): the first's first, then one of the
    other's, and so on, the one whose turn it is not waiting before its next step."""
    index = len(state.trials)
    names = [f"{index + i:02d}-{slug}" for i, (_, slug) in enumerate(proposals)]
    wait_s = max(trial_time_limit(options, p.knobs) for p, _ in proposals)
    ends = start_turns(out / "turns" / names[0], names[0], names[1], wait_s, settle)
    results: list[Any] = [None, None]

    def go(i: int) -> None:
        try:
            results[i] = run(names[i], proposals[i][0].knobs, turns=ends[i].to_dict(), windows=windows)
        except BaseException as exc:  # re-raised in the session's thread
            results[i] = exc
        finally:
            finished(ends[i])  # however it ended, the other trial no longer waits for its turns

    threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(PAIR_TRIALS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    if failed is not None:
        raise failed
    done = []
    for result in results:
        record = trial_record(result.path)
        done.append((result, record, measure_record([record])))
    return done


def speedup_in_turns(run: TrialRunner, out: Path, state: SessionRecord, options: SessionOptions,
                     reference: TrialRow, log: Callable[[str], None],
                     started: float | None = None) -> float | None:
    """The baseline and the best run side by side at the end, their windows in turns, so that a load that
    comes and goes falls on both alike, in as many pairs as the budget leaves (up to SPEEDUP_PAIRS) and the claim
    needs (none after the one that settles it: `claim_settled`, nor once another would narrow what one run of each
    script reads by less than `NARROWING`: `pair_narrowing`; a pair's windows stop once they settle it): where
    those windows ran at the quietest load the two ever ran at, the best's samples/s over the baseline's in them and
    every other run of the two at that load (a pair that fails or does not take turns ends them: the pairs
    before it count); else None (no budget left, the two would not fit in memory at once, the best is the
    baseline, the first pair failed)."""
    top = best_row(state)
    count = min(SPEEDUP_PAIRS, trials_left(out, state, options, started) // PAIR_TRIALS)
    if (not count or knobs_key(in_effect(top)) == knobs_key(in_effect(reference))
            or not fit_together([top, reference], state)):
        return None
    # Each pair is one more draw of both settings' level: the speed a setting runs at moves with where its
    # buffers land in memory. The conv example's best, built five times over in one quiet process, ran at
    # 785-961 samples/s from one build to the next, each build steadier than that; one pair's claim moved by a
    # fifth with the draw (×2.03-2.49 in five quiet pairs). The windows of one pair at twice a trial's are spread
    # over the pairs.
    windows = math.ceil(SPEEDUP_WINDOWS * options.windows / count)
    proposals = [(once_more(row, "for the speedup, windows in turns", "speedup"), f"speedup-{row.name[:2]}")
                 for row in (reference, top)]
    records: list[list[dict[str, Any]]] = [[], []]
    for number in range(count):
        index = len(state.trials)
        log(f"trials {index:02d}-{index + 1:02d}: the baseline ({reference.name}) and the best ({top.name}) "
            f"side by side, their windows in turns, for the speedup at one load"
            + (f" (pair {number + 1} of {count})" if count > 1 else ""))
        done = run_pair(run, out, state, options, proposals, windows, settle=pair_settle(out, state))
        for i, ((result, record, measurement), (proposal, _)) in enumerate(zip(done, proposals)):
            row, other = (reference, top)[i], (top, reference)[i]
            measured_row(state, index + i, result, record, proposal, measurement,
                         f"{row.name} again, its windows in turns with {other.name}'s, for the speedup at "
                         "one load")
        save(state)
        turns = windows_log(out / "turns" / done[0][0].name)
        failed = not all(r.ok for r, _, _ in done)
        if failed or len({name for name, *_ in turns}) < PAIR_TRIALS:
            why = "a run in turns failed" if failed else "the two did not take turns"
            if records[0]:  # the pairs before it ran in turns: the speedup is read from those
                log(f"  {why} (pair {number + 1}): the speedup is read from the pairs before it")
                break
            log(f"  {why}: the speedup is read from all their runs at one load")
            return None
        for i, (_, record, _) in enumerate(done):
            records[i].append(record)
        if number + 1 == count:
            break  # the last pair the budget leaves: nothing more to decide
        settled = claim_settled(records)
        if settled is not None:
            log(f"  the speedup is settled after {number + 1} pair(s): {settled}")
            break
        narrows = pair_narrowing(*run_counts(session_runs(out, state), (reference, top)))
        if narrows < NARROWING:  # each pair is a draw of both: the first is the claim at one load
            log(f"  another pair would narrow what one run of each script reads by {100 * narrows:.1f} % (less than "
                f"{100 * NARROWING:.0f} %): the speedup is read from {number + 1} pair(s)")
            break
    # Turns put a load that comes and goes on both alike, but not its effect: on a loaded 2-core machine the conv
    # example's steps ran at a fifth to a tenth of their quiet speed, by how much varying from one setting and one
    # second to the next. So the speedup is read off the windows at the quietest load both ran at, and only where
    # that is the quietest the two ever ran at; else (None) from all their runs at one load (`session_speedup`).
    matched = at_one_load(*records)
    reference_runs, top_runs = runs_of(out, state, in_effect(reference)), runs_of(out, state, in_effect(top))
    if not quiet_as_ever(matched, reference_runs + top_runs):
        log("  their windows in turns all ran under a load the two ran without before: the speedup is read from "
            "all their runs at one load")
        return None
    # Pooled with every earlier run of the two at that load: each is one more draw of its setting's level.
    pooled = measured_at_one_load(reference_runs, top_runs)
    base, best = pooled or (measure_record(side) for side in (matched or records))
    if not base.samples_per_s or not best.samples_per_s:
        log("  no figure from the windows in turns: the speedup is read from all their runs at one load")
        return None
    speedup = best.samples_per_s / base.samples_per_s
    if speedup - 1 < -noise(base, best):
        return back_to_baseline(state, reference, top, speedup, log)
    state.speedup_pairs = len(records[0])
    return speedup


CLAIM_NOISE = 0.05  # the claim's 95 % interval within ± this: one more pair would not change what is said


def pair_settle(out: Path, state: SessionRecord) -> float:
    """The noise of their ratio at which a pair's windows in turns stop: CLAIM_NOISE, or what the draws between the
    two processes add to it (`draws`), where that is more. No window narrows the draws' part, another pair does: once
    the windows' part is no larger, windows without end would narrow the claim's interval by less than a third (the
    demo's pair: ±20 % after 5 windows each, ±18.5 % after 10, 13 s later)."""
    return max(CLAIM_NOISE, between(session_spread(out, state), 1, 1))


def claim_settled(records: list[list[dict[str, Any]]]) -> str | None:
    """Why the pairs in turns so far settle the speedup (None while they do not): the baseline's and the best's
    windows in them, at one load, give a claim whose noise is within CLAIM_NOISE, and where there are two pairs or
    more, each pair's own claim is within that of the others' (each pair is a draw of both settings' level: the
    spread between draws is what one pair's windows cannot show)."""
    matched = at_one_load(*records)
    if matched is None:
        return None
    base, best = (measure_record(side) for side in matched)
    if not base.samples_per_s or not best.samples_per_s or base.relative_se is None or best.relative_se is None:
        return None
    spread = noise(base, best)
    if spread > CLAIM_NOISE:
        return None
    claims = [b.samples_per_s / a.samples_per_s for a, b in
              (tuple(measure_record([r]) for r in pair) for pair in zip(*records))
              if a.samples_per_s and b.samples_per_s]
    if len(claims) > 1 and max(claims) / min(claims) - 1 > CLAIM_NOISE:
        return None
    return (f"×{best.samples_per_s / base.samples_per_s:.2f}, noise {100 * spread:.1f}% "
            f"(within {100 * CLAIM_NOISE:.0f}%)" + (f", the pairs' claims within {100 * CLAIM_NOISE:.0f}% of each other"
                                                     if len(claims) > 1 else ""))


def back_to_baseline(state: SessionRecord, reference: TrialRow, top: TrialRow, speedup: float,
                     log: Callable[[str], None]) -> float:
    """The best measured slower than the baseline in turns, beyond their noise: some kept change was kept on a
    measurement the load bent, and the two at one load are what the user banks on. The session ends on the
    script's own settings (the baseline), and says so; the speedup is then 1."""
    said = (f"read ×{speedup:.2f} of the baseline, their windows in turns: the session ends on the script's own "
            "settings")
    state.trials[-1].update(decision="reverted", reason=state.trials[-1].reason + f"; {said}")
    state.notes.append(f"The best the search kept ({top.name}: {top.change}), measured side by side with the "
                       f"baseline, {said} (a change it kept was measured while the load moved; a longer session, "
                       "or a quieter machine, can tell which).")
    log(f"  {top.name} {said}")
    state.best = reference.name
    state.final_knobs = in_effect(reference)
    save(state)
    return 1.0

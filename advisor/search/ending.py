"""The end of a session: the baseline measured once more right before the best, so that the speedup is read
at one load, and the best confirmed against the runner-up (the other setting that measured fastest), both
measured again and pooled with their runs while the budget allows. Torch-free."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

from advisor.search.decision import decide
from advisor.search.drift import load_text, pair_changed
from advisor.search.policies import CONFIRM_TRIALS, applied_only, first_change, in_effect, measured_at_one_load, \
    runs_of
from advisor.search.proposal import Proposal
from advisor.search.state import SessionOptions, best_row, save, trial_row
from advisor.search.strategy import knobs_key
from advisor.search.trials import TrialRunner, figures_text, measure_record, measured, own_bound, recorded_losses, \
    run_one, trial_record
from advisor.trials.knobs import Knobs
from advisor.trials.record import TrialResult
from advisor.trials.record.measurement import noise


def baseline_again(run: TrialRunner, out: Path, state: dict[str, Any], options: SessionOptions,
                   reference: dict[str, Any], log: Callable[[str], None], remeasure: bool) -> str | None:
    """Before the best is confirmed, where the budget allows the best a run right after it, measure the
    baseline once more, so that the claimed speedup rests on runs of both at one load (`session_speedup` reads
    every run of the two cut to their windows at one load), not on what the machine did between the
    baseline's first run and the best's. The name of its row, or None."""
    top = best_row(state)
    # Never in the place of the confirmation's two trials: it is the best that the user banks on.
    if (not remeasure or options.max_trials - len(state["trials"]) < CONFIRM_TRIALS + 1
            or knobs_key(in_effect(top)) == knobs_key(in_effect(reference))):
        return None
    row = _speedup_run(run, state, reference, "the baseline", "right before the best", log)
    return row["name"] if row["decision"] == "measured" else None


def best_after(run: TrialRunner, out: Path, state: dict[str, Any], options: SessionOptions, baseline: str,
               log: Callable[[str], None]) -> bool:
    """The best once more right after the baseline's run for the speedup, unless confirming it ran it since;
    whether the best has a run after the baseline's."""
    rows = state["trials"]
    after = rows[next(i for i, t in enumerate(rows) if t["name"] == baseline) + 1:]
    key = knobs_key(in_effect(best_row(state)))
    if any(t["status"] == "ok" and knobs_key(t["knobs"]) == key for t in after):
        return True
    if options.max_trials - len(rows) < 1:
        return False
    return _speedup_run(run, state, best_row(state), "the best", "right after the baseline", log)["decision"] == \
        "measured"


def _speedup_run(run: TrialRunner, state: dict[str, Any], row: dict[str, Any], what: str, where: str,
                 log: Callable[[str], None]) -> dict[str, Any]:
    """Run a setting of the session once more, for the speedup at one load; its row."""
    knobs = Knobs.from_dict(in_effect(row))
    proposal = Proposal("confirm", f"{first_change(row['change'])} (for the speedup at one load)", "speedup",
                        knobs, 0.0)
    index = len(state["trials"])
    log(f"trial {index:02d}: {what} ({row['name']}) once more, for the speedup at one load")
    result, record, measurement = run_one(run, state, index, proposal, f"speedup-{row['name'][:2]}", log)
    new = trial_row(index, result, record, proposal, state, measurement if result.ok else None,
                    own_bound(result, measurement) if result.ok else None)
    new.update(decision="measured" if result.ok else "failed", load=load_text(record),
               reason=f"{row['name']} again, {where}, for the speedup at one load" if result.ok
               else f"trial {result.status}: {result.message}")
    state["trials"].append(new)
    save(state)
    return new


def confirm_best(run: TrialRunner, out: Path, state: dict[str, Any], options: SessionOptions, best: TrialResult,
                  reference_losses: list[float], log: Callable[[str], None], remeasure: bool) -> TrialResult:
    """Before the session ends, measure the best and the runner-up (the other setting that measured fastest)
    once more, when the runner-up is within the noise of the best or ahead of it, and keep whichever the
    pooled runs say is faster; again while the two stay within the noise of each other, up to CONFIRM_ROUNDS
    rounds, as the budget allows (each round's runs pooled with the earlier ones). Returns the best."""
    for _ in range(CONFIRM_ROUNDS):
        best, unsettled = _confirm_round(run, out, state, options, best, reference_losses, log, remeasure)
        if not unsettled:
            break
    return best


CONFIRM_ROUNDS = 3  # at most: a budget left over is spent telling the two fastest settings apart


def _confirm_round(run: TrialRunner, out: Path, state: dict[str, Any], options: SessionOptions, best: TrialResult,
                   reference_losses: list[float], log: Callable[[str], None],
                   remeasure: bool) -> tuple[TrialResult, bool]:
    """One round of `confirm_best`: (the best, whether the two are still within the noise of each other)."""
    if not remeasure or options.max_trials - len(state["trials"]) < CONFIRM_TRIALS:
        return best, False
    top, runner_up = best_row(state), runner_up_row(state)
    if runner_up is None:
        return best, False
    best_measure = measured(out, state, best)
    earlier = [out / runner_up["folder"], *(out / f for f in state["pooled"].get(runner_up["name"], []))]
    runner_measure = measure_record([trial_record(f) for f in earlier])
    spans = pair_changed(runs_of(out, state, top["knobs"]), runs_of(out, state, runner_up["knobs"]))
    if spans is None and runner_measure.samples_per_s < best_measure.samples_per_s * (
            1 - noise(best_measure, runner_measure)):
        return best, False  # clearly behind, measured at one load: nothing to confirm
    confirmed, runs = {}, {}
    for row, folders in ((top, [out / top["folder"], *(out / f for f in state["pooled"].get(top["name"], []))]),
                         (runner_up, earlier)):
        knobs = Knobs.from_dict(in_effect(row))
        proposal = Proposal("confirm", f"{first_change(row['change'])} (confirming the best)", "confirm", knobs, 0.0)
        index = len(state["trials"])
        log(f"trial {index:02d}: {row['name']} once more, to confirm the best against the runner-up")
        result, record, _ = run_one(run, state, index, proposal, f"confirm-{row['name'][:2]}", log)
        pooled = measured(out, state, result, folders) if result.ok else None
        new = trial_row(index, result, record, proposal, state, pooled, own_bound(result, pooled))
        new.update(decision="measured" if result.ok else "failed",
                   reason=f"{row['name']} again, pooled with its earlier runs" if result.ok else
                   f"trial {result.status}: {result.message}")
        state["trials"].append(new)
        if result.ok:
            state["pooled"][result.name] = [os.path.relpath(f, out) for f in folders]
            runs[row["name"]] = runs_of(out, state, row["knobs"])  # every run of the setting, latest first
        confirmed[row["name"]] = (result, pooled, new)
        save(state)
    (kept, kept_m, kept_row), (other, other_m, other_row) = confirmed[top["name"]], confirmed[runner_up["name"]]
    if kept_m is None or other_m is None:  # a confirming run failed: the best stands as it was decided
        for row in (kept_row, other_row):
            if row["decision"] == "measured":
                row.update(decision="reverted", reason=row["reason"] + "; the other run failed, nothing changes")
        save(state)
        return best, False
    changed = pair_changed(runs[top["name"]], runs[runner_up["name"]])
    if changed is not None:  # pooled runs span loads: decide on the runs of both measured at one load
        kept_m, other_m = (measured_at_one_load(runs[top["name"]], runs[runner_up["name"]])  # else the two
                           or (measure_record(runs[top["name"]][:1]), measure_record(runs[runner_up["name"]][:1])))
        other_row["drift"] = changed
    losses = recorded_losses(other.path)
    decision = decide(kept_m, other_m, losses, reference_losses, options.min_gain)
    if (not decision.keep and decision.gain > 0 and changed is None
            and not decision.reason.startswith(("loss", "no throughput"))
            and changed_knobs(other_row, state) - changed_knobs(kept_row, state) <= NEUTRAL):
        # Both measured again at one load, and the runner-up changes nothing the best leaves alone but how
        # batches reach the step: the faster pooled figure is the better bet (the best's lead was itself within
        # the noise). A runner-up that changes what is computed (AMP, the batch, the model) must beat the best
        # beyond the noise, and under a load that moved the best stays unless beaten beyond it.
        decision = dataclasses.replace(decision, keep=True, reason=f"{decision.reason}; the faster as measured, "
                                       "and it changes no more of what the step computes")
    winner, winner_row = (other, other_row) if decision.keep else (kept, kept_row)
    winner_row.update(decision="kept")
    (kept_row if decision.keep else other_row).update(decision="reverted")
    other_row.update(gain=decision.gain, noise=decision.noise, reason=other_row["reason"] + f": {decision.reason}"
                     + (f" ({changed}: decided on the runs of both measured at one load)" if changed else ""))
    log(f"  confirmed: {first_change(winner_row['change'])} is the best "
        f"({figures_text(winner_row, state.get('unit') or 'samples/s')})")
    state["best"] = winner.name
    state["final_knobs"] = applied_only(winner).knobs.to_dict()
    save(state)
    return applied_only(winner), abs(decision.gain) <= decision.noise


# Knobs that change how batches reach the step, not what it computes.
NEUTRAL = frozenset({"num_workers", "persistent_workers", "prefetch_factor", "pin_memory", "non_blocking", "threads"})


def changed_knobs(row: dict[str, Any], state: dict[str, Any]) -> set[str]:
    """The script's own settings a trial's knobs change."""
    user = state.get("user_values") or {}
    return {k for k, v in in_effect(row).items() if v is not None and v != user.get(k)}


def runner_up_row(state: dict[str, Any]) -> dict[str, Any] | None:
    """The other setting that measured fastest; never a change that was not applicable (it measured a
    setting already run, not another one)."""
    top = best_row(state)
    others = [t for t in state["trials"] if t["status"] == "ok" and t.get("samples_per_s")
              and t["decision"] != "not applicable" and knobs_key(in_effect(t)) != knobs_key(in_effect(top))]
    return max(others, key=lambda t: t["samples_per_s"], default=None)

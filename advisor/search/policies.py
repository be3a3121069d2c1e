"""The session's policies beside its loop: pairs (a reverted change as the base of a second move),
re-measures (the best beside a candidate when the machine changed; the end's are `advisor.search.ending`'s),
the speedup at one load, and knobs that were not applicable (never kept, never a base). Torch-free."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from advisor.trials.knobs import Knobs
from advisor.search.bounds import trial_bound
from advisor.search.drift import apart, at_one_load, chained, holds_across_loads, load_text, machine_changed, \
    mean_load, steady
from advisor.trials.record.measurement import Measurement
from advisor.search.state import SessionOptions, best_row, trial_row
from advisor.search.predictions import remember_graph, reprice
from advisor.search.decision import Decision
from advisor.search.expected import rank
from advisor.search.simplify import takes_off
from advisor.search.history import moved_on
from advisor.search.proposal import Proposal, merged_moves, moves_of, on_best
from advisor.search.strategy import SearchSpace, knobs_key, propose, turned
from advisor.trials.record import TrialResult, load_trial
from advisor.search.trials import TrialRunner, diagnose_trial, figures_text, measure_record, own_bound, run_one, \
    trial_record


# A change this much slower or less (or within 1.5 × its noise) can still pay with a second move: a small
# cost on its own is what a change that pays only in a pair reads, give or take the noise.
PAIR_FLOOR = 0.10
CONFIRM_TRIALS = 2  # the best and the runner-up, each measured once more before the session ends
SAME_SPEEDUP = 0.05  # the speedup at one load this close to the direct one: the direct one is said


SPEEDUP_BUDGET = 16  # from this budget on (the default), a trial is kept back for the baseline beside the best
SPEEDUP_DRAWS = 2  # from that budget on, pairs of the baseline and the best in turns kept back: each one draw


def pairs(run: TrialRunner) -> bool:
    """Whether the runner runs two trials at once, their windows in turns."""
    return bool(getattr(run, "paired", False))


def reserve(options: SessionOptions, remeasure: bool, paired: bool) -> int:
    """Trials kept back for the end (with a budget that allows it): the best and the runner-up, to confirm the
    best; with SPEEDUP_BUDGET trials or more, the baseline once more before them, so that the speedup is read
    beside the best, or (`paired`: a runner of two trials at once) SPEEDUP_DRAWS pairs of the baseline and the best
    side by side, their windows in turns. A smaller budget spends those on the search, and measures the speedup
    at one load only where trials are left."""
    if not remeasure or options.max_trials < 4 * CONFIRM_TRIALS:
        return 0
    return CONFIRM_TRIALS + ((2 * SPEEDUP_DRAWS if paired else 1) if options.max_trials >= SPEEDUP_BUDGET else 0)


def beside_best(run: TrialRunner, out: Path, state: dict[str, Any], options: SessionOptions,
                 record: dict[str, Any], index: int, log: Callable[[str], None], remeasure: bool):
    """When the measurements say the machine changed (`advisor.search.drift`), run the best once more,
    right after the candidate: (its row, the best's and the candidate's measurements at one load, why); both
    measurements None when that run failed, the candidate's alone (with the best's as just measured) when
    none of its windows ran at a load the best ran at; None when nothing changed or the budget has no room."""
    # Within the budget less the trials kept back for confirming the best at the end.
    if not remeasure or len(state["trials"]) + 2 > options.max_trials - reserve(options, remeasure, pairs(run)):
        return None
    top, runs = best_row(state), best_runs(out, state)
    changed = machine_changed(runs, record)
    if changed is None:
        return None
    log(f"  {changed}: measuring the best ({top['name']}) again beside it")
    proposal = once_more(top, "the best, measured again", "best-again")
    fresh, fresh_record, fresh_measure = run_one(run, state, index + 1, proposal, "best-again", log)
    row = trial_row(index + 1, fresh, fresh_record, proposal, state, fresh_measure if fresh.ok else None,
                    own_bound(fresh, fresh_measure) if fresh.ok else None)
    row.update(decision="measured" if fresh.ok else "failed", load=load_text(fresh_record),
               reason=f"{top['name']} again, beside trial {index:02d}: {changed}" if fresh.ok else
               f"trial {fresh.status}: {fresh.message}")
    log(f"  {figures_text(row, state['unit'])}: the best as measured now")
    if not fresh.ok:
        return row, None, None, changed
    # The load may have moved again by the time the best ran: the two decide on their windows at one load
    # (this run of the best or earlier ones); where none ran at one load the candidate's measurement is None.
    matched = measured_at_one_load([fresh_record, *runs_of(out, state, top["knobs"])], [record])
    return (row, *(matched or (fresh_measure, None)), changed)


def run_folders(out: Path, state: dict[str, Any], row: dict[str, Any]) -> list[Path]:
    """The folders of a row's runs: its own, then those pooled with it."""
    return [out / row["folder"], *(out / f for f in state["pooled"].get(row["name"], []))]


def best_runs(out: Path, state: dict[str, Any]) -> list[dict[str, Any]]:
    """The best's records: its own run, then those pooled with it."""
    return [trial_record(folder) for folder in run_folders(out, state, best_row(state))]


def without_best_again(out: Path, state: dict[str, Any], record: dict[str, Any], decision: Decision,
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
    matched = measured_at_one_load(runs_of(out, state, top["knobs"]), [record])
    if matched is not None:
        return decide_on(*matched), changed
    return across_loads(decision, record, trial_record(out / top["folder"]), False), changed


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


def beside_fresh_best(out: Path, state: dict[str, Any], best: dict[str, Any], fresh_best: Measurement,
                      candidate_runs: list[dict[str, Any]]) -> tuple[Measurement, Measurement]:
    """A candidate run again after the best was measured at another load: the best's and the candidate's
    windows at one load where there are some, else the best as measured last and the candidate's latest run."""
    return (measured_at_one_load(runs_of(out, state, best["knobs"]), candidate_runs)
            or (fresh_best, measure_record(candidate_runs[:1])))


def session_speedup(out: Path, state: dict[str, Any], reference: dict[str, Any]) -> tuple[float | None, str]:
    """The best's samples/s over the baseline's, and how it was had: "one load" (every run of the two, cut to
    their windows at the quietest load both ran AT_ONE_LOAD windows at), "direct" (their own figures: where no load
    is known, where they give the same within SAME_SPEEDUP, or where the two ran at one load in too few windows
    to cut), or "chained" (the product of the kept changes' gains, each measured beside the best of its
    time)."""
    best = best_row(state)
    if not best.get("samples_per_s") or not reference.get("samples_per_s"):
        return None, "direct"
    direct = best["samples_per_s"] / reference["samples_per_s"]
    pair = [trial_record(out / row["folder"]) for row in (best, reference)]
    levels = [mean_load(record) for record in pair]
    if None in levels:
        return direct, "direct"
    matched = measured_at_one_load(runs_of(out, state, best["knobs"]), runs_of(out, state, reference["knobs"]))
    fast, slow = (m.samples_per_s for m in matched) if matched else (None, None)
    if fast and slow:
        return (direct, "direct") if abs(fast / slow / direct - 1) <= SAME_SPEEDUP else (fast / slow, "one load")
    if all(steady(record) for record in pair) and not apart(*levels):
        return direct, "direct"
    return chained(state["trials"]), "chained"


def speedup_note(state: dict[str, Any], reference: dict[str, Any], side_by_side: bool = False) -> str:
    """The note that says how the speedup was read: off runs of the baseline and the best made one right after
    the other at the end (`side_by_side`), or not off their own figures, and why."""
    how = {"one load": "from their windows at one load",
           "chained": "the product of the kept changes' gains, each measured beside the best of its time"}
    direct = best_row(state)["samples_per_s"] / reference["samples_per_s"]
    if state.get("speedup_basis") == "in turns":
        pairs = state.get("speedup_pairs") or 1
        how_many = f" (in {pairs} pairs of processes)" if pairs > 1 else ""
        return (f"The baseline and the best were measured again side by side before the session ended{how_many}, "
                f"their windows in turns (one measuring while the other waited), at the quietest load both had run "
                f"at: the speedup ×{state['speedup']:.2f} is read from those windows and every other run of the two "
                f"at that load (their first figures give ×{direct:.2f}).")
    if side_by_side:
        return (f"The baseline and the best were measured again one right after the other before the session "
                f"ended: the speedup ×{state['speedup']:.2f} is read from every run of the two at one load, so it "
                f"does not depend on what the machine did in between (their first figures give ×{direct:.2f}).")
    return (f"The baseline and the best were measured while the machine's load differed: the speedup "
            f"×{state['speedup']:.2f} is {how[state['speedup_basis']]}; their own figures give ×{direct:.2f}.")


def runs_of(out: Path, state: dict[str, Any], knobs: dict[str, Any]) -> list[dict[str, Any]]:
    """The records of every run of a setting that measured, latest first."""
    key = knobs_key(knobs)
    return [trial_record(out / t["folder"]) for t in reversed(state["trials"])
            if t["status"] == "ok" and t.get("samples_per_s") and knobs_key(t["knobs"]) == key]


def once_more(row: dict[str, Any], why: str, bound: str) -> Proposal:
    """A setting of the session run again as it ran (its knobs in effect), `why` added to its first change."""
    return Proposal("confirm", f"{first_change(row['change'])} ({why})", bound, Knobs.from_dict(in_effect(row)), 0.0,
                    predicted=False)


def first_change(change: str) -> str:
    """A row's change as first tried, without what a re-measure added to it."""
    for suffix in (" (confirming the best)", " (the best, measured again)", " (again)"):
        change = change.removesuffix(suffix)
    return change


def pairs_on(decision: Any, row: dict[str, Any], bound: Any) -> bool:
    """Whether a reverted change is a base for a second move: its loss was fine, it was not clearly slower,
    and it moved the bound or addressed it."""
    if decision.keep or decision.reason.startswith("loss") or row["decision"] != "reverted":
        return False
    moved = row.get("bound") is not None and row.get("bound") != bound.name
    # A gain the noise hid (positive, within it) is a base too: two changes each within the noise alone can
    # pay together beyond it (pinned copies and bf16 beside a fed loader).
    hidden = 0 < decision.gain <= decision.noise
    return decision.gain > -max(1.5 * decision.noise, PAIR_FLOOR) and (moved or hidden or bool(row.get("helps_now")))


def pair_proposal(candidate: TrialResult, first: Proposal, state: dict[str, Any], options: SessionOptions,
                  space: SearchSpace, best: Knobs, why: str | None = None) -> Proposal | None:
    """The second move worth most with the candidate's first, made with `first`'s moves on the best as it is now
    (`best`), as one change: of the proposals from the candidate's own trace (reverted changes included) that
    move other knobs than `first` does and are not moves measured clearly slower on the best while the bound
    held, the pair of the largest expected improvement, both moves simulated together."""
    user = state.get("user_values") or {}
    first_moves = first.move_dict
    if not first_moves:
        return None
    diagnosis = diagnose_trial(candidate)
    remember_graph(state, candidate.name, diagnosis)
    measurement = measure_record([trial_record(candidate.path)])
    bound = trial_bound(candidate.status, diagnosis, measurement)
    # What the second move is proposed from: the best with the first move made (the candidate, when the best
    # has not moved since it ran), with the candidate's diagnosis: the bound the first move left.
    base = dataclasses.replace(best, **first_moves)
    batch = first_moves.get("batch_size") or best.batch_size or user.get("batch_size") or candidate.batch_size
    source = dataclasses.replace(candidate, knobs=base, batch_size=batch)
    first_knobs = set(first_moves) | ({"persistent_workers"} if "num_workers" in first_moves else set())
    top = best_row(state)
    # Every second move from there, each with the first made on the best as one change, simulated together by
    # the what-if model (its interactions: a larger batch lowers the per-sample cost of workers and copies) and
    # ranked by expected improvement (`advisor.search.expected`), not by a fixed order of kinds.
    found = []
    for p in propose(diagnosis, bound, source, state, options, space, retry_reverted=True):
        second = p.move_dict
        if not second or set(second) & first_knobs or clearly_slower(state, second, bound.name,
                                                                      top.get("samples_per_s")):
            continue
        moves = merged_moves(first_moves, second)
        if moves is None:
            continue
        found.append(on_best(best, moves, f"{first.recommendation}+{p.recommendation}", f"{first.change} + {p.change}",
                             f"{first.slug}-and-{p.slug}", first.predicted_gain + p.predicted_gain, first.bound,
                             first.helps_now, why=why, predicted=first.predicted and p.predicted))
    ranked = rank(reprice(found, state, top["name"], best), state)
    return ranked[0] if ranked else None


# A move measured this many times its noise slower on the best is not a pair's second move while the bound holds.
SLOWER_NOISES = 3.0


def clearly_slower(state: dict[str, Any], moves: dict[str, Any], bound: str | None, best_sps: float | None) -> bool:
    """Whether these moves (or part of them) were measured alone clearly slower (beyond SLOWER_NOISES × its
    noise) on a best the current one has not outgrown, while this bound held."""
    rows = {t["name"]: t for t in state["trials"] if t.get("name")}
    for t in state["trials"]:
        if (t.get("decision") != "reverted" or t.get("gain") is None or t.get("noise") is None
                or "+" in str(t.get("recommendation")) or t.get("tried_under") != bound
                or t["gain"] >= -SLOWER_NOISES * t["noise"] or moved_on(state, t, best_sps)):
            continue
        base = rows.get(t["base"]) if t.get("base") else None
        slower = {k: v for k, v in moves_of(t, base["knobs"] if base else None).items() if k != "persistent_workers"}
        if slower and slower.items() <= moves.items():
            return True
    return False


ORDERED = ("num_workers", "batch_size", "threads", "accumulation_steps", "prefetch_factor", "ddp_bucket_cap_mb")


def still_moves(moves: dict[str, Any], before: dict[str, Any], best: Knobs, user: dict[str, Any]) -> dict[str, Any]:
    """A recorded change's moves (made from the settings `before`) that are still moves on the best now: not
    what the best holds already and, for a knob with an order (workers, batch), in the same direction."""
    now = best.to_dict()
    kept = {}
    for knob, value in moves.items():
        current = now.get(knob) if now.get(knob) is not None else user.get(knob)
        was = before.get(knob) if before.get(knob) is not None else user.get(knob)
        if value == current:
            continue
        if knob in ORDERED and None not in (value, current, was) and (value > was) != (value > current):
            continue  # the best went past it already
        kept[knob] = value
    if "persistent_workers" in kept and "num_workers" not in kept:
        del kept["persistent_workers"]
    return kept


def late_pair(out: Path, state: dict[str, Any], options: SessionOptions, space: SearchSpace,
              best: Knobs) -> Proposal | None:
    """The pair of the fastest-measured reverted change (its loss fine) that has not been a pair's base yet,
    its moves made on the best as it is now: a change noise made read slower than it is gets its second move
    before the session ends."""
    paired = state.setdefault("paired", [])
    rows = {t["name"]: t for t in state["trials"] if t.get("name")}
    user = state.get("user_values") or {}
    reverted = [t for t in state["trials"][1:] if t["decision"] == "reverted" and t["status"] == "ok"
                and t.get("samples_per_s") and "+" not in (t.get("recommendation") or "+")
                and t.get("recommendation") != "confirm" and not t["reason"].startswith("loss")
                and not takes_off(str(t.get("recommendation")))  # a knob taken off: no base
                and t["name"] not in paired]
    for row in sorted(reverted, key=lambda t: -t["samples_per_s"]):
        paired.append(row["name"])
        before = rows[row["base"]]["knobs"] if row.get("base") in rows else {}
        moves = still_moves(moves_of(row, before), before, best, user)
        if not {k for k in moves if k != "persistent_workers"}:
            continue  # the best holds it already, or went past it
        same = all(best.to_dict().get(k) == before.get(k) for k in moves)
        change = row["change"].removesuffix(" (again)") if same else moves_text(moves)
        first = on_best(best, moves, row["recommendation"], change, row["name"][3:].removesuffix("-again"),
                        row.get("predicted_gain") or 0.0, None, bool(row.get("helps_now")),
                        predicted=row.get("predicted_gain") is not None)
        pair = pair_proposal(load_trial(out / row["folder"]), first, state, options, space, best)
        if pair is not None:
            return pair
    return None


def moves_text(moves: dict[str, Any]) -> str:
    """Moves in words, where a recorded change's own words no longer fit the best they are made on."""
    words = {"amp": lambda v: f"AMP {v}" if v else "AMP off", "num_workers": lambda v: f"workers →{v}",
             "batch_size": lambda v: f"batch →{v}", "threads": lambda v: f"threads →{v}"}
    pinned = bool(moves.get("pin_memory") and moves.get("non_blocking"))
    parts = ["pin_memory + non_blocking copies"] if pinned else []
    for knob, value in moves.items():
        if knob == "persistent_workers" or (pinned and knob in ("pin_memory", "non_blocking")):
            continue
        parts.append(words[knob](value) if knob in words else f"{knob}={value}")
    return " + ".join(parts)


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


def not_applicable(row: dict[str, Any], proposal: Proposal, state: dict[str, Any]) -> str | None:
    """Why the change could not be made at all (every knob it turns was not applicable), else None."""
    knobs = turned(best_row(state)["knobs"], proposal.knobs)
    outcomes = row.get("outcomes") or {}
    refused = [f"{k}: {outcomes[k].removeprefix('not applicable: ')}" for k in sorted(knobs)
               if str(outcomes.get(k, "")).startswith("not applicable")]
    if row["status"] != "ok" or not knobs or len(refused) < len(knobs):
        return None
    return "; ".join(refused)

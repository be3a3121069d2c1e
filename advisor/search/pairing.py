"""Changes that pay only together: a reverted change as the base of a second move (pinned copies pay only with
more workers, bf16 only with a larger batch), the pair worth most chosen by the what-if model's price of both
moves together; and, before the session would stop, the fastest reverted change not yet paired, its moves made
on the best of now. Torch-free."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from advisor.search.record import SessionRecord, TrialRow
from advisor.knobs import COMPANIONS, ORDERED, companions_of, moves_text, without_lone_companions
from advisor.knobs.batch_size import after_moves as batch_after_moves
from advisor.search.bounds import trial_bound
from advisor.search.expected import rank, value as expected_value
from advisor.search.history import moved_on
from advisor.search.predictions import remember_graph, reprice
from advisor.search.proposal import Proposal, merged_moves, moves_of, on_best
from advisor.search.simplify import takes_off
from advisor.search.state import SessionOptions, best_row
from advisor.search.strategy import SearchSpace, propose
from advisor.search.trial_runner import diagnose_trial, measure_record, trial_record
from advisor.trials.knobs import Knobs
from advisor.trials.record import TrialResult, load_trial

# A change this much slower or less (or within 1.5 × its noise) can still pay with a second move: a small
# cost on its own is what a change that pays only in a pair reads, give or take the noise.
PAIR_FLOOR = 0.10


def too_slow_for_a_base(gain: float | None, noise: float | None) -> bool:
    """Whether a change measured this `gain` (its `noise`: two standard errors of the difference) against the
    best is slower beyond what a change that pays only in a pair reads alone: no base for a second move."""
    return gain is not None and gain <= -max(1.5 * (noise or 0.0), PAIR_FLOOR)


def pairs_on(decision: Any, row: TrialRow, bound: Any) -> bool:
    """Whether a reverted change is a base for a second move: its loss was fine, it was not clearly slower,
    and it moved the bound or addressed it."""
    if decision.keep or decision.reason.startswith("loss") or row.decision != "reverted":
        return False
    moved = row.get("bound") is not None and row.get("bound") != bound.name
    # A gain the noise hid (positive, within it) is a base too: two changes each within the noise alone can
    # pay together beyond it (pinned copies and bf16 beside a fed loader).
    hidden = 0 < decision.gain <= decision.noise
    return not too_slow_for_a_base(decision.gain, decision.noise) and (moved or hidden or bool(row.get("helps_now")))


def pair_proposal(candidate: TrialResult, first: Proposal, state: SessionRecord, options: SessionOptions,
                  space: SearchSpace, best: Knobs, why: str | None = None) -> Proposal | None:
    """The second move worth most with the candidate's first, made with `first`'s moves on the best as it is now
    (`best`), as one change: of the proposals from the candidate's own trace (reverted changes included) that
    move other knobs than `first` does and are not moves measured clearly slower on the best while the bound
    held, the pair of the largest expected improvement, both moves simulated together."""
    user = state.user_values or {}
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
    batch = batch_after_moves(first_moves, best, user, candidate.batch_size)
    source = dataclasses.replace(candidate, knobs=base, batch_size=batch)  # the trial's measured batch, moved
    first_knobs = set(first_moves) | companions_of(first_moves)
    top = best_row(state)
    # Every second move from there, each with the first made on the best as one change, simulated together by
    # the what-if model (its interactions: a larger batch lowers the per-sample cost of workers and copies) and
    # ranked by expected improvement (`advisor.search.expected`), not by a fixed order of kinds.
    found = []
    for p in propose(diagnosis, bound, source, state, options, space, retry_reverted=True):
        second = p.move_dict
        if not second or set(second) & first_knobs or clearly_slower(state, second, bound.name,
                                                                      top.samples_per_s):
            continue
        moves = merged_moves(first_moves, second)
        if moves is None:
            continue
        found.append(on_best(best, moves, f"{first.recommendation}+{p.recommendation}", f"{first.change} + {p.change}",
                             f"{first.slug}-and-{p.slug}", first.predicted_gain + p.predicted_gain, first.bound,
                             first.helps_now, why=why, predicted=first.predicted and p.predicted))
    ranked = rank(reprice(found, state, top.name, best), state)
    return ranked[0] if ranked else None

# A move measured this many times its noise slower on the best is not a pair's second move while the bound holds.
SLOWER_NOISES = 3.0


def clearly_slower(state: SessionRecord, moves: dict[str, Any], bound: str | None, best_sps: float | None) -> bool:
    """Whether these moves (or part of them) were measured alone clearly slower (beyond SLOWER_NOISES × its
    noise) on a best the current one has not outgrown, while this bound held."""
    rows = {t.name: t for t in state.trials if t.name}
    for t in state.trials:
        if (t.decision != "reverted" or t.gain is None or t.noise is None
                or "+" in str(t.recommendation) or t.get("tried_under") != bound
                or t.gain >= -SLOWER_NOISES * t.noise or moved_on(state, t, best_sps)):
            continue
        base = rows.get(t.base) if t.get("base") else None
        slower = {k: v for k, v in moves_of(t, base.knobs if base else None).items() if k not in COMPANIONS}
        if slower and slower.items() <= moves.items():
            return True
    return False



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
    return without_lone_companions(kept)

def late_pair(out: Path, state: SessionRecord, options: SessionOptions, space: SearchSpace,
              best: Knobs, least: float = 0.0) -> Proposal | None:
    """The pair of the fastest-measured reverted change (its loss fine; not clearly slower, `too_slow_for_a_base`,
    on a best the current one has not outgrown) that has not been a pair's base yet, its moves made on the best as
    it is now: a change noise made read slower than it is gets its second move before the session ends, where the
    pair's expected improvement over the best (`expected.value`, never below 0) is at least `least`."""
    paired = state.setdefault("paired", [])
    rows = {t.name: t for t in state.trials if t.name}
    user = state.user_values or {}
    top = best_row(state).samples_per_s
    reverted = [t for t in state.trials[1:] if t.decision == "reverted" and t.status == "ok"
                and t.samples_per_s and "+" not in (t.recommendation or "+")
                and t.recommendation != "confirm" and not t.reason.startswith("loss")
                and not takes_off(str(t.recommendation))  # a knob taken off: no base
                # Measured clearly slower, it is no base here either: on the conv example the pair of torch.compile
                # (38 % slower, noise 10 %) and batch 64→128 (15 % slower, noise 6 %) ran, 10 s of a 76 s session
                # for a pair the model priced 43 % slower, on nothing but the pair's wide prior.
                and not (too_slow_for_a_base(t.gain, t.noise) and not moved_on(state, t, top))
                and t.name not in paired]
    for row in sorted(reverted, key=lambda t: -t.samples_per_s):
        paired.append(row.name)
        before = rows[row.base].knobs if row.get("base") in rows else {}
        moves = still_moves(moves_of(row, before), before, best, user)
        if not set(moves) - COMPANIONS:
            continue  # the best holds it already, or went past it
        same = all(best.to_dict().get(k) == before.get(k) for k in moves)
        change = row.change.removesuffix(" (again)") if same else moves_text(moves)
        first = on_best(best, moves, row.recommendation, change, row.name[3:].removesuffix("-again"),
                        row.predicted_gain or 0.0, None, bool(row.get("helps_now")),
                        predicted=row.predicted_gain is not None)
        pair = pair_proposal(load_trial(out / row.folder), first, state, options, space, best)
        if pair is not None and expected_value(pair, state) >= least:
            return pair
    return None

"""The best without a model knob whose own gain was never shown: knobs interact, and one kept early can cost
once another is kept on top of it (on a CPU, torch.compile paid +4% in fp32 and cost 20% once bf16 was kept
on top; the session never learned it, as nothing took the knob off again).

A model knob (`MODEL_KNOBS`: compile, channels_last, ...) in the best is *unproven* when it came in
- in a kept pair whose first move, tried alone from the same best, was reverted (the pair's gain may be
  all its second move's), or
- in a change kept by less than twice its noise, with another change kept on top of it since.
The session then measures the best without it once, and keeps the simpler setting unless it is measured
slower (`keep_simpler`): a knob that costs compile time or a layout change earns its place by a
measurement.

A model knob reverted on top of a best that holds another one is tried once more in that one's place
(`swap_proposal`): on this CPU channels_last cost 6% beside torch.compile and paid 24% without it, so a
search that never took compile off again kept the slower of the two.

Each setting runs in processes of its own, at a level of its own (`advisor.search.draws`), which no trial's windows
show. Of two settings where one changes a part of what the other changes, the one that changes less of the script
is the answer unless the other leads by more than one standard error of the windows' noise with those draws, or was
kept beyond its noise in the search (`fewer_changes`): a change is kept for what it was measured to give. A replay of
the CPU image surface kept 8-bit images with batch 64 over 8-bit images alone on one run within the noise, and its
confirmation read the two 0.7 % apart: batch 64 stood, and the patch changed the batch (and the learning rate
that goes with it) for nothing; the conv example ended with or without the fused optimizer by one run's draw.
Pure and torch-free.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from advisor.search.record import SessionRecord
from advisor.search.decision import Decision
from advisor.search.state import best_row
from advisor.search.proposal import Proposal, on_best
from advisor.search.strategy import turned
from advisor.knobs import BY_NAME, MODEL_KNOBS, NEUTRAL
from advisor.trials.knobs import Knobs

RECOMMENDATION = "without"  # the recommendation of a trial that takes a knob off: "without-compile"


def unproven_knobs(state: SessionRecord) -> list[str]:
    """The model knobs the best holds whose own gain was never shown (see the module), each once."""
    tried = {str(t.recommendation).split(f"{RECOMMENDATION}-", 1)[1] for t in state.trials
             if takes_off(str(t.recommendation))}
    found: list[str] = []
    for depth, (base, row) in enumerate(_kept_chain(state)):  # the latest change first
        changed = turned(base.knobs, row.knobs)
        came_in = {k for k in changed if k in MODEL_KNOBS and row.knobs.get(k)}
        for knob in sorted(came_in - tried - set(found)):
            alone_reverted = "+" in str(row.recommendation or "") and any(
                t.get("base") == base.name and t.decision == "reverted" and t.status == "ok"
                and knob in turned(base.knobs, t.knobs) and turned(base.knobs, t.knobs) < changed
                for t in state.trials)
            narrow = (depth > 0 and row.gain is not None and row.noise is not None
                      and row.gain < 2 * row.noise)
            if alone_reverted or narrow:
                found.append(knob)
    return found


def _kept_chain(state: SessionRecord) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(the best it was kept on, the row that first kept a setting), from the best back to the baseline."""
    rows = {t.name: t for t in state.trials}
    chain = []
    row = _first_with(state, best_row(state).knobs)
    while row is not None and row.get("base") in rows:
        base = _first_with(state, rows[row.base].knobs)  # a re-measure stands for where it was first kept
        if base is None or base.name == row.name:
            break
        chain.append((base, row))
        row = base
    return chain


def _first_with(state: SessionRecord, knobs: dict[str, Any]) -> dict[str, Any] | None:
    """The first row that measured these settings as the baseline or kept them."""
    return next((t for t in state.trials if t.knobs == knobs and t.decision in ("baseline", "kept")), None)


def without_proposal(knobs: Knobs, knob: str) -> Proposal:
    """The best's settings without `knob` (the script's own value back), as a change to measure."""
    change = BY_NAME[knob].title
    return on_best(knobs, {knob: None}, f"{RECOMMENDATION}-{knob}", f"without {change}",
                   f"without-{knob.replace('_', '-')}", 0.0, None, helps_now=False,
                   why=f"{change} came in without a gain of its own; the simpler setting, unless slower",
                   predicted=False)


def swap_proposal(state: SessionRecord, knobs: Knobs, reverted: Proposal) -> Proposal | None:
    """The model knob `reverted` turned on, with a model knob of the best (`knobs`) off instead; None where it
    turned something else, the best holds no other model knob, or each swap was tried."""
    added = turned(knobs, reverted.knobs)
    knob = next(iter(added)) if len(added) == 1 else None
    if knob not in MODEL_KNOBS or not getattr(reverted.knobs, knob) or takes_off(reverted.recommendation):
        return None
    tried = {t.recommendation for t in state.trials}
    for held in MODEL_KNOBS:
        recommendation = f"{reverted.recommendation}-{RECOMMENDATION}-{held}"
        if held != knob and getattr(knobs, held) and recommendation not in tried:
            change = BY_NAME[held].title
            return on_best(knobs, {knob: getattr(reverted.knobs, knob), held: None}, recommendation,
                           f"{reverted.change} {RECOMMENDATION} {change}",
                           f"{reverted.slug}-{RECOMMENDATION}-{held.replace('_', '-')}", reverted.predicted_gain,
                           reverted.bound, reverted.helps_now, predicted=reverted.predicted,
                           why=f"it did not pay beside {change}, which the best holds")
    return None


def simplifies(proposal: Proposal) -> bool:
    """Whether the proposal only takes a knob off the best (`without_proposal`)."""
    return proposal.recommendation.startswith(f"{RECOMMENDATION}-")


def takes_off(recommendation: str) -> bool:
    """Whether a change takes a model knob off the best (alone, or in another knob's place): never a pair's
    base, and that knob is not taken off again."""
    return recommendation.startswith(f"{RECOMMENDATION}-") or f"-{RECOMMENDATION}-" in recommendation


def keep_simpler(decision: Decision, min_gain: float, draws: float = 0.0) -> Decision:
    """A setting with a knob fewer is kept unless it measured slower (beyond its noise with the `draws` between
    the two settings' processes, and the least gain kept), or its loss rose; otherwise the decision stands. Never
    measured again for a small gain."""
    decision = dataclasses.replace(decision, inconclusive=False)
    if decision.keep or decision.reason.startswith(("loss", "no throughput")) \
            or decision.gain < -max(min_gain, math.hypot(decision.noise, draws)):
        return decision
    return Decision(True, f"{100 * decision.gain:+.1f}%, not slower ({_noise_text(decision.noise, draws)}): "
                    "the simpler setting", decision.gain, decision.noise)


def fewer_changes(decision: Decision, best: dict[str, Any], other: dict[str, Any], draws: float) -> Decision:
    """The decision between the best and another setting (`decision.keep`: the other is faster beyond the noise),
    where one of the two changes a strict part of what the other changes (knob → value, as the script's own
    settings stand), and their difference is within one standard error of the windows' noise with the `draws`
    between their processes: the setting that changes less, where what it leaves out changes what the step
    computes (AMP, the batch, the model: numerics, a learning rate to scale, a compile to wait for). Otherwise
    the decision stands."""
    # One standard error of the two (`noise` is two): a lead the runs make likely (84 %) is not given up.
    if decision.reason.startswith(("loss", "no throughput")) \
            or abs(decision.gain) > math.hypot(decision.noise, draws) / 2:
        return decision
    differ = best.items() ^ other.items()
    if differ and {knob for knob, _ in differ} <= NEUTRAL:
        return decision  # how batches reach the step alone: nothing computed differs, the faster is the better bet
    said = f"{100 * decision.gain:+.1f}% is within one standard error ({_noise_text(decision.noise, draws)})"
    if other.items() < best.items() and not decision.keep:
        return dataclasses.replace(decision, keep=True, reason=f"{said}: it changes less of the script")
    if best.items() < other.items() and decision.keep:
        return dataclasses.replace(decision, keep=False, reason=f"{said}: the best changes less of the script")
    return decision


def _noise_text(noise: float, draws: float) -> str:
    """The windows' noise, and with the draws between processes where they count, as a reason says them."""
    return f"noise {100 * noise:.1f}%" + (f", {100 * math.hypot(noise, draws):.1f}% with the draws between "
                                         "processes" if draws else "")

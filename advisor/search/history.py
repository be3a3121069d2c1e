"""What the session has learned of each move, for the strategy: whether a move was reverted under the bound
that holds, on a best the current one has not outgrown (then it waits for the bound to move). Which values of a
ladder knob read within their noise or failed on the best's other settings (then the ladder goes on past them) is
what the ladder reads itself (`advisor.knobs.offer.Learned`). Pure functions over the session record.
"""

from __future__ import annotations


from advisor.search.record import SessionRecord, TrialRow
from advisor.search.proposal import Proposal, moves_of


# The bound has moved, for a change reverted under it, once the best is this much faster than the best it was
# reverted on, though the bound's name stayed: where the loader and the training thread each hold part of the
# step, feeding the loader makes the training side's changes (AMP, pinned copies) worth measuring again.
RETRY_GROWTH = 0.25


def moved_on(state: SessionRecord, row: TrialRow, best_sps: float | None) -> bool:
    """Whether the best has outgrown the best `row` was measured against (by RETRY_GROWTH)."""
    base = next((t for t in state.trials if t.name == row.get("base")), None)
    base_sps = base.samples_per_s if base else None
    return bool(best_sps and base_sps and best_sps >= (1 + RETRY_GROWTH) * base_sps)


def reverted_under(state: SessionRecord, proposal: Proposal, bound: str | None,
                   best_sps: float | None = None) -> bool:
    """Whether the proposal's move (the same kind of change, to the same values) was tried and not kept while
    the same bound held, on a best the current one (`best_sps`) has not since outgrown. A next step of a ladder
    (batch 128→256 after 64→128 was reverted) is another move."""
    rows = {t.name: t for t in state.trials if t.name}
    moves = proposal.move_dict
    for t in state.trials:
        if (t.recommendation != proposal.recommendation or t.decision not in ("reverted", "failed")
                or t.status == "oom" or t.get("tried_under") != bound or moved_on(state, t, best_sps)):
            continue
        base = rows.get(t.base) if t.get("base") else None
        # A move that read within its noise (or could not be measured) on another best is not known to fail
        # on this one: only one measured clearly slower waits for the bound to move.
        unknown = t.gain is None or t.noise is None or t.gain > -t.noise
        if unknown and base is not None and proposal.base is not None and base.knobs != proposal.base.to_dict():
            continue
        if moves_of(t, base.knobs if base else None).items() <= moves.items():
            return True
    return False

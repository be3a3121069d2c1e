"""Where the search proposes activation checkpointing (the `checkpointing` knob): only where memory binds the
batch, and always with the batch it buys. Pure functions over the session record; torch-free.

- The user's batch ran out of memory: in the recovery plan (`advisor.search.strategy.recovery_plan`), after
  AMP and before micro-batches: the one way to keep the batch as written in one step (and, with
  `--keep-effective-batch`, the batch the user asked to keep). The first configuration that fits is kept.
- The search wants a larger batch that does not fit (the memory model puts it over the capacity: GPU memory,
  RAM or `--memory-limit`; or that size ran out of memory): checkpointing and that batch, as one change
  (`checkpoint_pair`). Its cost in time (about one more forward of the blocks) is measured like any change's,
  and the pair is kept only where it is faster than the best without it. Whether it fits is measured, not
  predicted (what the profiler adds beside the blocks' saved bytes is known only once it ran); a pair that
  runs out of memory is recorded as failed and not proposed again.

A row's `checkpoint_blocks` (`checkpoint_figures`, from its trial's activation record) says what there is to
checkpoint: the repeated class, its count, and the bytes its blocks saved for backward at the trial's batch.
"""

from __future__ import annotations

from typing import Any, Callable

from advisor.search.proposal import Proposal, on_best
from advisor.trials.knobs import Knobs


def checkpoint_figures(record: dict[str, Any]) -> dict[str, Any] | None:
    """The repeated blocks a trial's activation record names (`checkpoint_candidates`, largest first) and what
    they saved for backward; None where it names none."""
    acts = (record.get("summary") or {}).get("activations") or {}
    candidates = acts.get("checkpoint_candidates") or []
    if not candidates:
        return None
    top = next((c for c in acts.get("by_class") or [] if c.get("class") == candidates[0]), {})
    return {"block": candidates[0], "count": top.get("count"), "saved_bytes": acts.get("saved_bytes"),
            "block_bytes": top.get("bytes"), "block_output_bytes": top.get("output_bytes")}


def recovery_move(state: dict[str, Any], baseline: Knobs) -> Proposal | None:
    """Checkpointing alone, in the out-of-memory recovery plan, where the baseline's record names blocks."""
    figures = state["trials"][0].get("checkpoint_blocks") if state["trials"] else None
    if not figures:
        return None
    return on_best(baseline, {"checkpointing": True}, "oom-checkpointing",
                   f"activation checkpointing of the {figures['block']} blocks (the batch as written)",
                   "checkpointing", 0.0, "memory", predicted=False)


def checkpoint_pair(best: Any, state: dict[str, Any], space: Any, wanted: int | None, fits: Callable[[int], bool],
                    failed_above: int | None, gain: float) -> Proposal | None:
    """Checkpointing with the larger batch it makes fit, where the search wants `wanted` (the next size) and the
    memory model (`fits`, for a batch without checkpointing) or an out-of-memory trial says it does not fit."""
    current = best.batch_size
    if best.knobs.checkpointing or not current or not space.allows("checkpointing"):
        return None
    row = next((t for t in state["trials"] if t.get("name") == best.name), None) or {}
    figures = row.get("checkpoint_blocks")
    if not figures:
        return None
    target = failed_above if failed_above is not None else wanted
    if target is None or target <= current or (failed_above is None and fits(target)):
        return None  # it fits without: the plain batch step is the change to measure
    proposal = on_best(best.knobs, {"checkpointing": True, "batch_size": target}, "checkpointing+larger-batch",
                       f"activation checkpointing of the {figures['block']} blocks + batch {current}→{target}",
                       f"checkpointing-batch-{target}", gain, "host")  # ordered as the batch step it stands for
    measured = any(t.get("knobs") == proposal.knobs.to_dict() for t in state["trials"])
    return None if measured else proposal  # measured already: the plain batch step is next

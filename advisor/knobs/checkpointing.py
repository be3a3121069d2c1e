"""`checkpointing`: the model's repeated blocks under activation checkpointing (non-reentrant).

- **In the trial**: at the model's first call, each of its repeated blocks (the outermost module class it
  holds two or more of, with layers of its own: a transformer's `Block`s, the `checkpoint_candidates` of the
  memory record) runs under `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`: what it saved for
  backward is recomputed there instead (about one more forward of the blocks), with the forward's RNG state
  (dropout draws the same masks: the same loss and gradients); always with the batch it buys.
- **Proposed when**: memory binds:
    - the user's batch ran out of memory (after AMP, before micro-batches: the one way to keep the batch, and
      with `--keep-effective-batch` the batch asked for);
    - or the larger batch the search wants does not fit (the memory model puts it over GPU memory, RAM or
      `--memory-limit`, or it ran out of memory): checkpointing and that batch as one change, kept only where
      faster than the best without it.
- **Not applicable**: a model that repeats no block with layers of its own.
- **The patch writes**: in the `forward` that loops over the blocks, `x = block(x)` becomes
  `x = checkpoint(block, x, use_reentrant=False)` (an `nn.Sequential` call: `checkpoint_sequential`); where
  no such call is found, a note says what to change.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from advisor.knobs.knob import AT_FIRST_CALL, FLAG, FROM_TRIAL, MEMORY, Knob, Written
from advisor.knobs.offer import Best, Offer


def figures(record: dict[str, Any]) -> dict[str, Any] | None:
    """What there is to checkpoint, as a trial's row holds it (`checkpoint_blocks`): the repeated blocks its
    activation record names (`checkpoint_candidates`, largest first), their count, and what they saved for
    backward at the trial's batch; None where it names none."""
    acts = (record.get("summary") or {}).get("activations") or {}
    candidates = acts.get("checkpoint_candidates") or []
    if not candidates:
        return None
    top = next((c for c in acts.get("by_class") or [] if c.get("class") == candidates[0]), {})
    return {"block": candidates[0], "count": top.get("count"), "saved_bytes": acts.get("saved_bytes"),
            "block_bytes": top.get("bytes"), "block_output_bytes": top.get("output_bytes")}


def pair(best: Best, wanted: int | None, fits: Callable[[int], bool], failed_above: int | None,
         gain: float) -> Offer | None:
    """Checkpointing with the larger batch it makes fit, where the search wants `wanted` (the batch's next size)
    and the memory model (`fits`, for a batch without checkpointing) or an out-of-memory trial says it does not
    fit; ordered as the batch step it stands for. Not where the best's trial names no repeated blocks
    (`checkpoint_blocks`), nor where the pair was measured already (then the plain batch step is next)."""
    current = best.batch
    if best.knobs.checkpointing or not current or not best.space.allows("checkpointing"):
        return None
    figures = (best.learned.row(best.name) or {}).get("checkpoint_blocks")
    if not figures:
        return None
    target = failed_above if failed_above is not None else wanted
    if target is None or target <= current or (failed_above is None and fits(target)):
        return None  # it fits without: the plain batch step is the change to measure
    moves = {"checkpointing": True, "batch_size": target}
    if any(t.get("knobs") == dataclasses.replace(best.knobs, **moves).to_dict() for t in best.learned.trials):
        return None
    return Offer(moves, f"activation checkpointing of the {figures['block']} blocks + batch {current}→{target}",
                 f"checkpointing-batch-{target}", gain, "host", recommendation="checkpointing+larger-batch")


def recover(best: Best) -> Offer | None:
    """After an out-of-memory baseline whose record names repeated blocks: checkpointing alone, the one way to keep
    the batch as written in one step."""
    figures = best.learned.trials[0].get("checkpoint_blocks") if best.learned.trials else None
    if not figures:
        return None
    return Offer({"checkpointing": True}, f"activation checkpointing of the {figures['block']} blocks (the batch as "
                 "written)", "checkpointing", 0.0, "memory", predicted=False, recommendation="oom-checkpointing")


KNOB = Knob("checkpointing", FLAG, MEMORY, AT_FIRST_CALL, "activation checkpointing", in_process=True,
            on_surface=False, recover=recover, recovers_at=2, written=Written(FROM_TRIAL, record="checkpoint_plan"),
            proposed_as="activation-checkpointing",
            on_model="advisor.trials.interposition.checkpointed_blocks:CheckpointBlocks")

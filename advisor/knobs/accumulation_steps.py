"""`accumulation_steps`: micro-batches with gradient accumulation, the effective batch kept.

- **In the trial**: micro-batches with gradient accumulation that keep the effective batch: the loader
  yields micro-batches, the loss is scaled, `optimizer.step`/`zero_grad` act once per cycle
  (`advisor.trials.interposition.gradients`).
- **Proposed when**: the user's own settings run out of memory (after AMP, before a smaller batch).
- **The script's own**: as many backward passes before each optimizer step (more than one), step after step.
- **Not applicable**: without a step function (`script.py:train_step`).
- **The patch writes**: the accumulation in the step (a counter and a constant at module level).
"""

from __future__ import annotations

import statistics
from typing import Any

from advisor.knobs.knob import ACCUMULATION, APPLIED, AROUND_STEP, COUNT, IN_STEP, NEEDS_A_VALUE, STEP, Knob, Written, \
    not_applicable
from advisor.knobs.in_trial import LoaderArguments, Own, ScriptSeen
from advisor.knobs.offer import Best, Offer

# In a plain script, the step's accumulation; under transformers' Trainer, micro-batches of the batch with its own
# accumulation (where the batch divides).
WRITTEN = Written(IN_STEP, step_part=ACCUMULATION, micro_batches_of="batch_size",
                  trainer_count="gradient_accumulation_steps")


def in_loader(knob: Knob, value: Any, loader: LoaderArguments) -> str | None:
    """The loader's micro-batch: its batch (the script's, or the batch_size knob's: the effective batch) over the
    steps, where it divides."""
    if value is None or value <= 1:
        return None
    batch = loader.effective.get("batch_size")
    why = loader.unbatched()
    if why is None and batch % value:
        why = not_applicable(f"batch {batch} is not a multiple of {value}")
    if why is None:
        loader.effective["batch_size"] = batch // value
    return why or APPLIED


SEEN = 3  # optimizer steps whose backward counts must agree to call it the script's own accumulation


def own(seen: ScriptSeen) -> Own | None:
    """The script's own: as many backward passes before each optimizer step, more than one, in every step after the
    first (which can hold a warm-up's backward), where the knob did not accumulate."""
    counts = seen.backwards_per_step[1:]
    if seen.knobs.accumulation_steps is not None or len(counts) < SEEN or min(counts) != max(counts) \
            or counts[0] <= 1:
        return None
    steps = int(statistics.median(counts))
    return steps, f"gradient accumulation over {steps} batches", None


def recover(best: Best) -> tuple[Offer, ...]:
    """After an out-of-memory baseline: the user's batch in 2, 4 or 8 micro-batches (those it divides into), the
    effective batch kept."""
    batch = best.learned.user.get("batch_size")
    return tuple(Offer({"accumulation_steps": k}, f"micro-batches {batch // k}×{k}", f"accumulate-{k}", 0.0,
                       "memory", predicted=False, recommendation="oom-accumulation")
                 for k in (2, 4, 8) if batch and batch % k == 0)


KNOB = Knob("accumulation_steps", COUNT, STEP, AROUND_STEP, "gradient accumulation", alone=NEEDS_A_VALUE,
            written=WRITTEN, recover=recover, recovers_at=3,
            in_loader=in_loader, idle=(1,), own_at_end=own, unset=1,
            on_step="advisor.trials.interposition.gradients:Accumulation")

"""`num_workers`: the training DataLoader's worker processes.

- **In the trial**: the training DataLoader is built with the new arguments (DataLoader construction is
  interposed; an evaluation loader is left as it is). On the CPU the step's torch threads make room for the
  workers (`threads`: `torch.set_num_threads`), since workers and the step fighting over the cores is
  slower than either alone.
- **Proposed when**: the input pipeline binds: 2, 4, 8, … workers up to the cores, each size measured; a
  size that did not help does not stop the climb while the loader still binds. Under another bound, where
  the loader wait the trace shows could give at least `--min-gain` (its expected improvement never more than
  that wait can take back).
- **Not applicable**: a script with no DataLoader (a `get_batch()` loop, full-batch L-BFGS).
- **The patch writes**: the DataLoader's arguments where the script sets them (its constant, flag default or
  keyword).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from advisor.knobs.graph import StepGraph, TrialSettings
from advisor.knobs.knob import AT_LOADER, IN_LOADER, LOADER, NEEDS_A_VALUE, WORKERS, Knob, WhatIf, Written
from advisor.knobs.in_trial import as_given
from advisor.knobs.offer import Best, Offer


def setting(trial: TrialSettings) -> int:
    """The worker processes of the trial's loader."""
    return int(trial.value("num_workers", 0) or 0)


def transform(g: StepGraph, value: Any, p: float, params: dict[str, float]) -> StepGraph:
    """A worker's batch takes (1 + α·W) of one process alone (α = p): W workers contend for the machine."""
    a = p
    alone = g.produce_s / (1 + a * g.workers)
    return dataclasses.replace(g, workers=int(value), produce_s=alone * (1 + a * int(value)))


# What a worker trial's miss teaches beyond α, where α cannot reproduce it: the hand-off, seconds a byte the training
# thread pays to take a batch from a worker (rebuilt from shared memory, its fresh pages touched by the copy), on a
# graph that knows its batch's bytes (a GPU's). It is the machine's, so it starts at none: no prediction changes
# before a worker trial measured it. On the H200 conv surface (images in memory) it was a batch's bytes at
# 1.0-1.4 GB/s, and two workers slowed every batch size by 15-30% where the model without it said +13% to +92%.
HANDOFF = "workers_handoff"
HANDOFF_MOST = 2e-9  # s a byte: 0.5 GB/s, under the slowest the H200 surface read

WHAT_IF = WhatIf("num_workers", "workers", setting, transform, "workers", prior=0.05, bounds=(0.0, 1.0),
                 then=HANDOFF, then_prior=0.0, then_bounds=(0.0, HANDOFF_MOST), then_field="handoff_s_per_byte")


def ladder(cores: int) -> tuple[int, ...]:
    """Worker counts to try: 2, 4, 8, … below the cap, then the cap; the cap leaves two cores to the
    training process on machines with more than four, and is never below 2 (a loader that waits on
    files or sleeps gains from workers even without a core of their own: measured, like any size)."""
    cap = max(2, cores if cores <= 4 else cores - 2)
    steps, w = [], 2
    while w < cap:
        steps.append(w)
        w *= 2
    return tuple(steps + [cap])


def offer(best: Best) -> tuple[Offer | None, Offer | None] | None:
    """More DataLoader workers while the loader binds (or its wait is advised away): the next size up the ladder,
    and its largest where that is not the next (where a larger batch or pinned copies change what workers are
    worth, the step between may read nothing: the model and the expected improvement choose). Past the sizes
    tried from these settings under this bound that did not help. On the CPU the step's torch threads make room
    for them (threads + workers within the cores): workers and threads fighting over the cores is slower than
    either alone."""
    rec = best.advice.get(KNOB.proposed_as)
    if rec is None and best.bound != "input":
        return None
    from advisor.knobs import with_companions  # the registry imports this module
    # What a workers change moves with it (the threads that make room for them on a CPU; its companions, which
    # `steps_from` leaves out of every base) is not its base.
    moved = ("num_workers", "threads")
    past = [k.get("num_workers") or 0 for k in best.learned.steps_from(best.knobs, KNOB.proposed_as, best.bound, moved)]
    floor = max([best.workers, *past])
    held = best.space.values("num_workers")
    sizes = held if held is not None else ladder(best.cores)
    above = [w for w in sorted(sizes) if w > floor]
    errored = best.learned.failed(best.knobs, "num_workers")
    why = f"in place of workers {floor}, which failed ({errored[floor]}): the next count" if floor in errored else None

    def to(target: int) -> Offer:
        moves: dict[str, Any] = with_companions({"num_workers": target})
        change = f"workers {best.workers}→{target}"
        threads = best.threads
        if (not best.accelerator and threads and threads + target > best.cores
                and max(1, best.cores - target) < threads and best.space.permits({"threads"})):
            moves["threads"] = max(1, best.cores - target)
            change += f", threads {threads}→{moves['threads']}"
        return Offer(moves, change, f"workers-{target}", rec.predicted_gain if rec is not None else 0.5, "input",
                     predicted=rec is not None, why=why, recoverable=rec.recoverable if rec is not None else None)

    if not above:
        return None
    return to(above[0]), (to(above[-1]) if len(above) > 1 else None)


KNOB = Knob("num_workers", WORKERS, LOADER, AT_LOADER, "DataLoader workers", alone=NEEDS_A_VALUE,
            training_argument="dataloader_num_workers", numerics=False, proposed_as="more-workers",
            spread=(0.30, 0.30), whatif=WHAT_IF, written=Written(IN_LOADER, position=5),
            moved=lambda v: f"workers →{v}", lint="dataloader-num-workers", offer=offer, order=0,
            in_loader=as_given, unset=0)

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


KNOB = Knob("num_workers", WORKERS, LOADER, AT_LOADER, "DataLoader workers", alone=NEEDS_A_VALUE,
            training_argument="dataloader_num_workers", numerics=False, proposed_as="more-workers",
            spread=(0.30, 0.30), whatif=WHAT_IF, written=Written(IN_LOADER, position=5),
            moved=lambda v: f"workers →{v}", lint="dataloader-num-workers")

"""`pin_memory`: the training DataLoader's batches in pinned (page-locked) memory.

- **In the trial**: the DataLoader with `pin_memory=True`, and `non_blocking=True` on the step's
  host-to-device `.to()` / `.cuda()` copies; tried as one change.
- **Proposed when**: host-to-device copies bind (on an accelerator).
- **Not applicable**: the CPU.
- **The patch writes**: `pin_memory=True` in the DataLoader, `non_blocking=True` in the step's copies.
"""

from __future__ import annotations

from typing import Any

from advisor.knobs.graph import StepGraph, TrialSettings, faster_copies
from advisor.knobs.knob import AT_LOADER, FLAG, IN_LOADER, LOADER, Knob, WhatIf, Written

def setting(trial: TrialSettings) -> bool:
    """Whether the trial's copies were pinned: its loader pinned its batches, and the step copied them
    asynchronously."""
    return bool(trial.value("pin_memory", False)) and bool(trial.knobs.get("non_blocking"))


def transform(g: StepGraph, value: Any, p: float, params: dict[str, float]) -> StepGraph:
    """The exposed copy time divided by p (faster DMA from pinned memory), or multiplied by it (turned off)."""
    if bool(value) == g.pinned:
        return g
    return faster_copies(g, p, bool(value), pinned=bool(value))


# One change of the model's, "pinned", for this knob and non_blocking: a copy is pinned and asynchronous only with
# both. The parameter: pinned copies run this much faster than pageable ones.
PINNED = WhatIf("pinned", "pinned", setting, transform, "copies", prior=2.0, bounds=(0.5, 8.0))


KNOB = Knob("pin_memory", FLAG, LOADER, AT_LOADER, "pinned memory", training_argument="dataloader_pin_memory",
            numerics=False, proposed_as="pin-memory", spread=(0.30, None), whatif=PINNED,
            written=Written(IN_LOADER, position=7))

"""`pin_memory`: the training DataLoader's batches in pinned (page-locked) memory.

- **In the trial**: the DataLoader with `pin_memory=True`, and `non_blocking=True` on the step's
  host-to-device `.to()` / `.cuda()` copies; tried as one change.
- **Proposed when**: host-to-device copies bind (on an accelerator).
- **Not applicable**: the CPU.
- **The patch writes**: `pin_memory=True` in the DataLoader, `non_blocking=True` in the step's copies.
"""

from advisor.knobs.knob import AT_LOADER, FLAG, LOADER, Knob

KNOB = Knob("pin_memory", FLAG, LOADER, AT_LOADER, "pinned memory", training_argument="dataloader_pin_memory",
            numerics=False)

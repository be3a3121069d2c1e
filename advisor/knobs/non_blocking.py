"""`non_blocking`: asynchronous host-to-device copies of the batch.

- **In the trial**: `non_blocking=True` on the step's host-to-device `.to()` / `.cuda()` copies. It is tried
  with [`pin_memory`](#advisor.knobs.pin_memory) as one change: an asynchronous copy needs a pinned source.
- **Proposed when**: host-to-device copies bind (on an accelerator), with pinned memory.
- **Not applicable**: the CPU.
- **The patch writes**: `non_blocking=True` in the step's copies.
"""

from advisor.knobs.knob import AROUND_STEP, FLAG, IN_STEP, STEP, Knob, Written
from advisor.knobs.pin_memory import PINNED

# The what-if model's change is pin_memory's: pinned copies, which take both.
KNOB = Knob("non_blocking", FLAG, STEP, AROUND_STEP, "non_blocking copies", numerics=False, whatif=PINNED,
            written=Written(IN_STEP), lint="non-blocking-copy", copies=True)

"""`amp`: mixed precision: bf16, or fp16 with a GradScaler, autocast around the step.

- **In the trial**: `torch.autocast` around the step for each device its model is on: bf16, or fp16 with a
  GradScaler that covers `backward` and `optimizer.step`. With no step function, bf16 autocast of each
  outermost module call (the forward).
- **Proposed when**: the device computes (compute binds), and when memory binds.
- **Not applicable**: bf16 on a CPU without bf16 instructions (there autocast is emulated and slower than
  fp32: `advisor doctor` shows the CPU's); fp16 with a GradScaler without a step function.
- **The patch writes**: autocast around the step's forward and, for fp16, the GradScaler
  (`advisor/code/patch/step.py`); in a framework, its own setting (`bf16=True`, `precision="bf16-mixed"`,
  `mixed_precision="bf16"`).
"""

from advisor.knobs.knob import AROUND_STEP, CHOICE, STEP, Knob

KNOB = Knob("amp", CHOICE, STEP, AROUND_STEP, "AMP", choices=(None, "bf16", "fp16"), alone="bf16")

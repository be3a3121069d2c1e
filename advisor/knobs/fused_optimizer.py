"""`fused_optimizer`: torch.optim optimizers built with `fused=True` (else `foreach=True`).

- **In the trial**: torch.optim optimizers built with `fused=True` (Adam, AdamW, SGD, Adagrad), else
  `foreach=True`.
- **Proposed when**: the optimizer's step is ≥ 5% of the step.
- **Not applicable**: no torch.optim optimizer built in the trial (a notebook's, built before it).
- **The patch writes**: `fused=True` in the optimizer's constructor.
"""

from advisor.knobs.knob import AT_OPTIMIZER, FLAG, MODEL, Knob

KNOB = Knob("fused_optimizer", FLAG, MODEL, AT_OPTIMIZER, "the fused optimizer",
            advice="fused-optimizer", spread=(0.05, 0.05), trainer_keywords=(("optim", "adamw_torch_fused"),))

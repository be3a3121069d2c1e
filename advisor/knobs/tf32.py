"""`tf32`: fp32 matmuls and convolutions as TF32 on Tensor Cores (CUDA, Ampere and later).

- **In the trial**: `torch.set_float32_matmul_precision("high")` and TF32 convolutions.
- **Proposed when**: fp32 matmuls run off the Tensor Cores of an Ampere or later GPU, once AMP was tried and
  not kept.
- **Not applicable**: the CPU; a GPU before Ampere.
- **The patch writes**: the two settings after the imports.
"""

from advisor.knobs.knob import AT_FIRST_CALL, FLAG, MODEL, Knob

KNOB = Knob("tf32", FLAG, MODEL, AT_FIRST_CALL, "TF32 matmuls", in_process=True)

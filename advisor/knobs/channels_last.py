"""`channels_last`: the model and its 4-D inputs in `torch.channels_last` (models with 2-D convolutions).

- **In the trial**: at the model's first call, its parameters and every 4-D input in `torch.channels_last`.
- **Proposed when**: convolutions take the step (≥ 20% of a CPU step; layout conversions on a GPU) and
  compute binds. AMP with `channels_last` is the pair that pays most together on convolutions (bf16 kernels
  want NHWC).
- **Not applicable**: a model without 2-D convolutions.
- **The patch writes**: the model in channels_last just before the optimizer is built from it, the batch
  in channels_last where the step moves it to the device.
"""

from advisor.knobs.knob import AT_FIRST_CALL, FLAG, MODEL, Knob

KNOB = Knob("channels_last", FLAG, MODEL, AT_FIRST_CALL, "channels_last", in_process=True, advice="channels-last",
            spread=(0.15, 0.30))

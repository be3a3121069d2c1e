"""`cudnn_benchmark`: cuDNN picks the fastest convolution algorithm per shape (CUDA).

- **In the trial**: `torch.backends.cudnn.benchmark = True`.
- **Proposed when**: convolutions of the same shapes every step (from the trace's shapes).
- **Not applicable**: the CPU.
- **The patch writes**: the setting after the imports.
"""

from advisor.knobs.knob import AT_FIRST_CALL, FLAG, MODEL, Knob

KNOB = Knob("cudnn_benchmark", FLAG, MODEL, AT_FIRST_CALL, "cudnn.benchmark", in_process=True)

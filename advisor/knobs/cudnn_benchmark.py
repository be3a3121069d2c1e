"""`cudnn_benchmark`: cuDNN picks the fastest convolution algorithm per shape (CUDA).

- **In the trial**: `torch.backends.cudnn.benchmark = True`.
- **Proposed when**: convolutions of the same shapes every step (from the trace's shapes).
- **Not applicable**: the CPU.
- **The patch writes**: the setting after the imports.
"""

from typing import Any

from advisor.knobs.knob import AFTER_IMPORTS, AT_FIRST_CALL, FLAG, MODEL, Knob, TorchSetting, Written


def own(torch: Any) -> str | None:
    """The script's own: cudnn.benchmark turned on."""
    return "cudnn.benchmark" if torch.backends.cudnn.benchmark else None


def apply(torch: Any, undo: Any) -> str | None:
    """cudnn.benchmark on for the trial, put back by `undo`."""
    undo.callback(setattr, torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)
    torch.backends.cudnn.benchmark = True
    return None


KNOB = Knob(
    "cudnn_benchmark", FLAG, MODEL, AT_FIRST_CALL, "cudnn.benchmark", in_process=True, advice="cudnn-benchmark",
    spread=(0.05, None),
    setting=TorchSetting(off_cuda="cuDNN autotuning needs a CUDA device", own=own, apply=apply),
    written=Written(AFTER_IMPORTS, lines=(
        "torch.backends.cudnn.benchmark = True  # cuDNN picks the fastest algorithm per input shape",)))

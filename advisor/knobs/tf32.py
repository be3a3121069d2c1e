"""`tf32`: fp32 matmuls and convolutions as TF32 on Tensor Cores (CUDA, Ampere and later).

- **In the trial**: `torch.set_float32_matmul_precision("high")` and TF32 convolutions.
- **Proposed when**: fp32 matmuls run off the Tensor Cores of an Ampere or later GPU, once AMP was tried and
  not kept.
- **Not applicable**: the CPU; a GPU before Ampere.
- **The patch writes**: the two settings after the imports.
"""

from typing import Any

from advisor.knobs.knob import AFTER_IMPORTS, AT_FIRST_CALL, FLAG, MODEL, Knob, TorchSetting, Written

CAPABILITY = 8  # Ampere and later run fp32 matmuls on Tensor Cores as TF32


def own(torch: Any) -> str | None:
    """The script's own: a float32 matmul precision other than torch's default, "highest"."""
    precision = torch.get_float32_matmul_precision()
    return None if precision == "highest" else f"float32 matmul precision {precision!r}"


def apply(torch: Any, undo: Any) -> str | None:
    """TF32 matmuls and convolutions for the trial, put back by `undo`; why not, on a GPU before Ampere."""
    major = torch.cuda.get_device_capability()[0]
    if major < CAPABILITY:
        return f"this GPU (compute capability {major}.x) has no TF32; Ampere (8.0) and later do"
    precision, allow = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    undo.callback(torch.set_float32_matmul_precision, precision)
    undo.callback(setattr, torch.backends.cudnn, "allow_tf32", allow)
    return None


KNOB = Knob(
    "tf32", FLAG, MODEL, AT_FIRST_CALL, "TF32 matmuls", in_process=True, advice="tf32", spread=(0.10, None),
    after="amp",
    setting=TorchSetting(
        off_cuda="TF32 is a mode of NVIDIA Tensor Cores (Ampere and later); the CPU has none", own=own, apply=apply),
    written=Written(AFTER_IMPORTS, trainer_keywords=(("tf32", True),), lines=(
        'torch.set_float32_matmul_precision("high")  # fp32 matmuls as TF32 on Tensor Cores (Ampere+)',
        "torch.backends.cudnn.allow_tf32 = True  # and convolutions")))

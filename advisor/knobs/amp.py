"""`amp`: mixed precision: bf16, or fp16 with a GradScaler, autocast around the step.

- **In the trial**: `torch.autocast` around the step for each device its model is on: bf16, or fp16 with a
  GradScaler that covers `backward` and `optimizer.step`. With no step function, bf16 autocast of each
  outermost module call (the forward). (`advisor.trials.interposition.autocast`.)
- **Proposed when**: the device computes (compute binds), and when memory binds.
- **The script's own**: a bf16 or fp16 autocast the script (or its framework) enters around a training forward.
- **Not applicable**: bf16 on a CPU without bf16 instructions (there autocast is emulated and slower than
  fp32: `advisor doctor` shows the CPU's; the session's notes say so after the baseline); fp16 with a GradScaler
  without a step function.
- **The patch writes**: autocast around the step's forward (the batch's copies to the device and `zero_grad`
  before or after it stay outside, as in torch's AMP recipe) and, for fp16, the GradScaler
  (`advisor/code/patch/step_rewrite.py`); in a framework, its own setting (`bf16=True`, `precision="bf16-mixed"`,
  `mixed_precision="bf16"`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from advisor.knobs.graph import StepGraph, TrialSettings
from advisor.knobs.knob import AROUND_STEP, AUTOCAST, CHOICE, IN_STEP, STEP, Code, Knob, WhatIf, Written
from advisor.knobs.in_trial import Own, ScriptSeen
from advisor.knobs.offer import ROUND_GAIN, Best, Offer


def not_here(value: str, device_type: str, computes_bf16: Callable[[], bool]) -> str | None:
    """Why autocast to `value` cannot run on this device type (`computes_bf16`: whether the CUDA device computes
    bf16 natively, asked only there); None where it can."""
    if value == "fp16" and device_type == "cpu":
        return "fp16 autocast needs a CUDA device; on the CPU use bf16"
    if value == "bf16" and device_type == "cuda" and not computes_bf16():
        return "this GPU does not compute bf16 natively (Ampere, compute capability 8.0, and later do)"
    return None


WITHOUT_STEP = "fp16 needs a GradScaler around a step function: name the step (script.py:train_step), or use bf16"


def setting(trial: TrialSettings) -> bool:
    """Whether the trial ran in 16 bits: the knob, else the script's own autocast."""
    return trial.flag("amp")


def transform(g: StepGraph, value: Any, p: float, params: dict[str, float]) -> StepGraph:
    """The matrix kernels off the Tensor Cores run r× faster (r = p, else the device's `amp_ratio`); those on
    them already move half the bytes; turned off, they leave the Tensor Cores."""
    if bool(value) == g.amp:
        return g
    r = p if p > 0 else g.amp_ratio
    if value:  # off the Tensor Cores onto them; those on them already move half the bytes
        saved = g.matmul_s * (1 - 1 / r) + g.matmul_tc_s * (1 - 1 / min(2.0, r))
        moved = dict(matmul_s=0.0, matmul_tc_s=g.matmul_s / r + g.matmul_tc_s / min(2.0, r))
    else:  # back to fp32: the matrix kernels leave the Tensor Cores
        saved = -(g.matmul_tc_s * (r - 1))
        moved = dict(matmul_s=g.matmul_tc_s * r + g.matmul_s, matmul_tc_s=0.0)
    before = g.matmul_s + g.matmul_tc_s  # the convolutions among them move alike
    conv = g.conv_s * (moved["matmul_s"] + moved["matmul_tc_s"]) / before if before > 0 else g.conv_s
    return dataclasses.replace(g, amp=bool(value), device_s=max(0.0, g.device_s - saved), conv_s=conv, **moved)


# r: matmul/convolution kernels off the Tensor Cores run r× faster in 16 bits (0: the device's ratio of 16-bit
# matrix to fp32 throughput, `amp_ratio`).
WHAT_IF = WhatIf("amp", "amp", setting, transform, "amp", prior=0.0, bounds=(0.3, 20.0))

# In the step (autocast, and for fp16 the GradScaler: `advisor.code.patch.step_rewrite`); in a framework, its own
# setting.
# The Trainer refuses bf16 without a GPU unless told it trains on the CPU: neutral where one is there.
WRITTEN = Written(IN_STEP, step_part=AUTOCAST,
                  trainer_for={"bf16": (("bf16", True), ("use_cpu", Code("not torch.cuda.is_available()"))),
                               "fp16": (("fp16", True),)},
                  accelerator_argument="mixed_precision",
                  lightning_for={"bf16": (("precision", "bf16-mixed"),), "fp16": (("precision", "16-mixed"),)})


def offer(best: Best) -> Offer | None:
    """Autocast to the dtype the rules chose for this device (they check it computes it natively); on a GPU with
    Tensor Cores also without their advice, as part of a round over the knobs."""
    if best.knobs.amp is not None:
        return None
    advice = best.advice.get("amp")
    if advice is not None:
        dtype, gain = advice.knobs.get("amp", "bf16"), advice.predicted_gain
    else:
        gpu = (best.device.get("gpu") or {}) if best.accelerator else {}
        major = int(str(gpu.get("compute_capability") or "0").split(".")[0] or 0)
        if major < 7:
            return None
        dtype, gain = ("bf16" if gpu.get("bf16_supported") else "fp16"), ROUND_GAIN
    if best.space.values("amp") is not None and dtype not in best.space.values("amp"):
        return None
    return Offer({"amp": dtype}, f"AMP {dtype}", f"amp-{dtype}", gain, "compute", predicted=advice is not None)


def recover(best: Best) -> Offer | None:
    """After an out-of-memory baseline: autocast, which keeps every setting of the user's and halves the
    activations; on a GPU bf16 where it computes it, else fp16; on the CPU bf16 only where it has bf16 instructions
    (emulated, autocast is slower and buys nothing)."""
    if best.accelerator:
        dtype = "bf16" if (best.device.get("gpu") or {}).get("bf16_supported") else "fp16"
    else:
        dtype = "bf16" if (best.device.get("cpu") or {}).get("bf16_instructions") else None
    if dtype is None:
        return None
    return Offer({"amp": dtype}, f"AMP {dtype}", f"amp-{dtype}", 0.0, "memory", predicted=False,
                 recommendation="oom-amp")


DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}


def own(seen: ScriptSeen) -> Own | None:
    """The script's own: the first 16-bit autocast open at a training forward that its code entered, or a framework
    (accelerate's `mixed_precision`, Lightning's `precision`, the Trainer's `bf16`) where this knob did not set the
    framework's precision for the trial."""
    for autocast in seen.autocasts:
        dtype, owner = DTYPES.get(autocast["dtype"]), autocast["owner"]
        if dtype is not None and (owner is None or seen.knobs.amp is None):
            return dtype, f"{dtype} autocast" + (f" ({owner})" if owner else ""), autocast["site"]
    return None


def not_tried_here(device_facts: dict[str, Any] | None, own_settings: dict[str, Any]) -> str | None:
    """The session's note where bf16 autocast is never tried: on a CPU known to have no bf16 instructions, for a
    script that does not autocast itself. None elsewhere."""
    facts = device_facts or {}
    cpu = facts.get("cpu") if isinstance(facts.get("cpu"), dict) else {}
    if facts.get("type") != "cpu" or cpu.get("bf16_instructions") != [] or own_settings.get(KNOB.name):
        return None
    model = f" ({cpu['model']})" if isinstance(cpu.get("model"), str) else ""
    return (f"bf16 autocast (AMP) is not tried on this CPU{model}: it has no bf16 instructions, so autocast would "
            "emulate bf16 and run slower than float32. On a CPU with them (avx512_bf16, AMX) or a GPU it is worth a "
            "trial. `advisor doctor` shows which bf16 instructions a machine has.")


KNOB = Knob("amp", CHOICE, STEP, AROUND_STEP, "AMP", choices=(None, "bf16", "fp16"), alone="bf16",
            proposed_as="amp", spread=(0.25, 0.20), whatif=WHAT_IF, written=WRITTEN, offer=offer,
            recover=recover, recovers_at=1, moved=lambda v: f"AMP {v}" if v else "AMP off", own_at_end=own,
            on_step="advisor.trials.interposition.autocast:Autocast")

"""Compute: mixed precision on Tensor Cores (matrix cores, or the CPU's bf16 units), and channels_last
for the layout conversions AMP leaves around convolutions."""

from __future__ import annotations

from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.rules.recommendation import Recommendation, ms, pct

ELIGIBLE_SHARE = 0.20  # of kernel time (GPU) or step time (CPU)
TENSOR_CORE_SHARE_LOW = 0.50
LAYOUT_SHARE = 0.05  # of kernel time: layout conversions worth removing with channels_last


def has_matrix_units(d: Diagnosis) -> tuple[bool, str]:
    """Whether the device has Tensor Cores (NVIDIA sm_70+) or matrix cores (AMD CDNA), and which.

    A device the trace does not describe is judged by its kernel names: Tensor Core kernels that ran prove
    the units; NVIDIA kernels built for sm_70 or newer imply them.
    """
    dev = d.device
    if dev is None:
        return False, "unknown device"
    cap = dev.compute_capability
    if d.tensor_core_share:
        unit = "Tensor Core" if dev.vendor == "nvidia" else "matrix core"
        if not dev.described:
            return True, f"{unit} kernels ran in this trace"
    if dev.vendor == "nvidia":
        if cap is None:
            return False, "compute capability unknown"
        if not dev.described:
            return cap >= (7, 0), f"NVIDIA, kernels built for sm_{cap[0]}{cap[1]} or newer"
        return cap >= (7, 0), f"NVIDIA compute capability {dev.capability_text}"
    if dev.vendor == "amd":
        # gfx9 (CDNA: MI100/MI200/MI300) has matrix cores; trace compute capability 9.x means gfx9xx.
        return bool(cap and cap[0] == 9), f"AMD gfx{cap[0]}{cap[1]}x" if cap else "AMD, architecture unknown"
    return False, f"{dev.vendor} device"


def cpu_bf16_instructions(d: Diagnosis) -> list[str] | None:
    """The CPU's bf16 instruction sets from the trial record, or None when no trial says."""
    cpu = ((d.trial or {}).get("device_facts") or {}).get("cpu") or {}
    found = cpu.get("bf16_instructions")
    return None if found is None else list(found)


def amp_dtype(d: Diagnosis) -> str:
    """bf16 where the device computes it natively (NVIDIA sm_80+, AMD CDNA2+, CPUs), else fp16."""
    dev = d.device
    if d.platform == "cpu":
        return "bf16"
    if dev is not None and dev.vendor == "nvidia":
        cap = dev.compute_capability
        if cap is None or cap < (8, 0):
            return "fp16"  # an undescribed NVIDIA device may be Volta or Turing: fp16 works on every one
    return "bf16"


def mostly_float64(d: Diagnosis) -> bool:
    """Whether most of the model's parameters (as the trial saw them) are float64."""
    dtypes = (d.trial or {}).get("model_dtypes")
    if not isinstance(dtypes, dict) or not dtypes:
        return False
    counts = {k: v for k, v in dtypes.items() if isinstance(v, (int, float))}
    return bool(counts) and max(counts, key=counts.get) == "float64"


def amp(d: Diagnosis) -> Recommendation | None:
    """Matmuls and convolutions run in fp32: autocast them to bf16/fp16 to use Tensor/matrix cores."""
    if ((d.trial or {}).get("knobs") or {}).get("amp"):
        return None  # the trial already ran under autocast
    if mostly_float64(d):
        return None  # autocast leaves float64 alone: the model would have to be made float32 first
    dtype = amp_dtype(d)
    scaler = " with a GradScaler" if dtype == "fp16" else ""
    if d.platform == "cpu":
        share = d.extra.get("cpu_eligible_share") or 0.0
        if share < ELIGIBLE_SHARE:
            return None
        evidence = [f"{pct(share)} of the step is in matmul/convolution operators, all in fp32"]
        bf16 = cpu_bf16_instructions(d)
        if bf16 is not None and not bf16:
            return None  # without bf16 instructions, autocast emulates bf16 and is slower than fp32
        if bf16:
            evidence.append(f"the CPU computes bf16 natively ({', '.join(bf16)})")
        factor = 0.5 if bf16 and "amx_bf16" in bf16 else 0.3
        return Recommendation(
            id="amp",
            title="Autocast matmuls and convolutions to bf16 (CPU AMP)",
            knobs={"amp": "bf16"},
            predicted_gain=factor * share,
            evidence=tuple(evidence),
            code_change=_autocast_code("cpu", "bf16"),
            caveat="" if bf16 else "bf16 is fast only on CPUs with AMX or AVX512-BF16; measure it.",
            details={"dtype": "bf16"},
            bound="compute",
        )
    if d.platform != "gpu":
        return None  # other accelerators: which kernels use matrix units is not in their names
    ok, why = has_matrix_units(d)
    if not ok or d.eligible_share is None or d.tensor_core_share is None:
        return None
    if d.eligible_share < ELIGIBLE_SHARE or d.tensor_core_share >= TENSOR_CORE_SHARE_LOW:
        return None
    unit = "Tensor Cores" if d.device.vendor == "nvidia" else "matrix cores"
    kernel_share = d.kernel_us / d.step_time_us if d.step_time_us else 0.0
    evidence = [f"{pct(d.eligible_share)} of kernel time is matmul/convolution work not on {unit}",
                f"{unit} used by {pct(d.tensor_core_share)} of kernel time",
                f"the device has {unit} ({why})"]
    if d.layout_share and d.layout_share >= 0.01:
        evidence.append(f"layout conversions ({pct(d.layout_share)} of kernel time) are not counted: AMP does "
                        "not remove them")
    return Recommendation(
        id="amp",
        title=f"Use automatic mixed precision ({dtype}{scaler}) to run matmuls on {unit}",
        knobs={"amp": dtype},
        predicted_gain=0.5 * d.eligible_share * min(kernel_share, 1.0),
        evidence=tuple(evidence),
        code_change=_autocast_code("cuda", dtype),  # ROCm builds use the "cuda" device type too
        caveat="Check that the loss curve matches fp32 over the first few hundred steps.",
        details={"dtype": dtype},
        bound="compute",
    )


def _autocast_code(device_type: str, dtype: str) -> str:
    torch_dtype = "torch.bfloat16" if dtype == "bf16" else "torch.float16"
    if dtype == "fp16":
        return (f"scaler = torch.amp.GradScaler('{device_type}')\n"
                f"with torch.autocast('{device_type}', dtype={torch_dtype}):\n"
                f"    loss = loss_fn(model(x), y)\n"
                f"scaler.scale(loss).backward()\nscaler.step(optimizer)\nscaler.update()")
    return (f"with torch.autocast('{device_type}', dtype={torch_dtype}):\n"
            f"    loss = loss_fn(model(x), y)\nloss.backward()")


def channels_last(d: Diagnosis) -> Recommendation | None:
    """cuDNN converts NCHW tensors to NHWC around convolutions: keep model and input channels_last."""
    if d.platform != "gpu" or not d.layout_share or d.layout_share < LAYOUT_SHARE or not d.step_time_us:
        return None
    layout_us = d.layout_share * d.kernel_us
    return Recommendation(
        id="channels-last",
        title="Use channels_last memory format for the model and its input",
        knobs={},
        predicted_gain=0.8 * layout_us / d.step_time_us,
        evidence=(f"{pct(d.layout_share)} of kernel time converts layouts (nchwToNhwc/nhwcToNchw) around "
                  f"convolutions, {ms(layout_us)} per step; AMP does not remove it",),
        code_change=("model = model.to(memory_format=torch.channels_last)\n"
                     "x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)"),
        caveat="Helps convolutions (most with AMP); measure it, some layers prefer NCHW.",
        bound="compute",
    )

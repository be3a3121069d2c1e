"""Compute: mixed precision on Tensor Cores (matrix cores, or the CPU's bf16 units), TF32 for fp32 matmuls
on Ampere and later, channels_last for convolutions (on a GPU the layout conversions AMP leaves around them
and the convolutions, norms and pools the trace shows on NCHW inputs; the convolutions themselves on a CPU),
cuDNN autotuning for convolutions of fixed shapes, and the fused scaled_dot_product_attention for attention
written by hand."""

from __future__ import annotations

from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.rules.recommendation import Recommendation, ms, pct, tried_advice
from advisor.knobs import advised_by, proposed_knobs
from advisor.knobs.channels_last import WHAT_IF as CHANNELS_LAST

ELIGIBLE_SHARE = 0.20  # of kernel time (GPU) or step time (CPU)
TENSOR_CORE_SHARE_LOW = 0.50
LAYOUT_SHARE = 0.05  # of kernel time: layout conversions worth removing with channels_last
NCHW_SHARE = 0.20  # of kernel time: convolutions, norms and pools on NCHW inputs, worth measuring in channels_last
CPU_CONV_SHARE = 0.20  # of step time in convolution operators on the CPU: channels_last worth measuring
CUDNN_CONV_SHARE = 0.10  # of kernel time in convolutions: cuDNN autotuning worth measuring
TF32_CAPABILITY = (8, 0)  # Ampere and later run fp32 matmuls on Tensor Cores as TF32
ATTENTION_SHARE = 0.05  # of the step in attention written by hand: the fused call worth measuring


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
    if tried_advice(d, "amp"):
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
            knobs=proposed_knobs("amp", "bf16"),
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
        knobs=proposed_knobs("amp", dtype),
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
    """Convolutions in NCHW: on a GPU cuDNN converts them to NHWC around each one (layout kernels), and the
    convolutions, norms and pools on NCHW inputs run slower kernels than their NHWC ones; on a CPU oneDNN's
    convolutions run faster on channels_last tensors. Keep the model and its input channels_last."""
    if tried_advice(d, "channels-last") or not d.step_time_us:
        return None
    code = ("model = model.to(memory_format=torch.channels_last)\n"
            "x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)")
    if d.platform == "cpu":
        share = d.extra.get("cpu_conv_share") or 0.0
        if share < CPU_CONV_SHARE:
            return None
        return Recommendation(
            id="channels-last",
            title="Use channels_last memory format for the model and its input",
            knobs=advised_by("channels-last"),
            predicted_gain=0.15 * share,
            evidence=(f"{pct(share)} of the step is in convolution operators, on NCHW tensors",),
            code_change=code,
            caveat="Most with bf16 autocast; measure it, some layers prefer NCHW.",
            bound="compute",
        )
    layout, nchw = d.layout_share or 0.0, d.extra.get("nchw_share") or 0.0
    if d.platform != "gpu" or (layout < LAYOUT_SHARE and nchw < NCHW_SHARE):
        return None
    layout_us, nchw_us = layout * d.kernel_us, nchw * d.kernel_us
    evidence = []
    if nchw >= NCHW_SHARE:
        evidence.append(f"{pct(nchw)} of kernel time is convolutions, norms and pools on NCHW inputs (the trace's "
                        f"strides), {ms(nchw_us)} per step: their NHWC kernels are faster")
    if layout >= LAYOUT_SHARE:
        evidence.append(f"{pct(layout)} of kernel time converts layouts (nchwToNhwc/nhwcToNchw) around "
                        f"convolutions, {ms(layout_us)} per step; AMP does not remove it")
    return Recommendation(
        id="channels-last",
        title="Use channels_last memory format for the model and its input",
        knobs=advised_by("channels-last"),
        predicted_gain=CHANNELS_LAST.prior * (layout_us + nchw_us) / d.step_time_us,
        evidence=tuple(evidence),
        code_change=code,
        caveat="Helps convolutions (most with AMP); measure it, some layers prefer NCHW.",
        bound="compute",
    )


def tf32(d: Diagnosis) -> Recommendation | None:
    """fp32 matmuls and convolutions off the Tensor Cores of an Ampere or later GPU: TF32 puts them on,
    keeping fp32 storage and range (one line, no autocast): where AMP is not wanted or did not pay."""
    dev = d.device
    if d.platform != "gpu" or dev is None or dev.vendor != "nvidia" or tried_advice(d, "tf32") or mostly_float64(d):
        return None
    cap = dev.compute_capability
    if cap is None or cap < TF32_CAPABILITY or d.eligible_share is None or d.tensor_core_share is None:
        return None
    if tried_advice(d, "amp"):
        return None  # under autocast the matmuls are not fp32
    if d.eligible_share < ELIGIBLE_SHARE or d.tensor_core_share >= TENSOR_CORE_SHARE_LOW or not d.step_time_us:
        return None
    kernel_share = d.kernel_us / d.step_time_us
    return Recommendation(
        id="tf32",
        title="Let fp32 matmuls run on Tensor Cores as TF32",
        knobs=advised_by("tf32"),
        predicted_gain=0.4 * d.eligible_share * min(kernel_share, 1.0),
        evidence=(f"{pct(d.eligible_share)} of kernel time is fp32 matmul/convolution work not on Tensor Cores",
                  f"the GPU runs TF32 on its Tensor Cores (compute capability {dev.capability_text})"),
        code_change='torch.set_float32_matmul_precision("high")  # TF32 matmuls\n'
                    "torch.backends.cudnn.allow_tf32 = True  # TF32 convolutions (the default)",
        caveat="TF32 keeps fp32's range with a 10-bit mantissa; AMP (bf16) is usually faster still.",
        bound="compute",
    )


def cudnn_benchmark(d: Diagnosis) -> Recommendation | None:
    """Convolutions of the same shapes every step: cuDNN's autotuner picks the fastest algorithm per shape
    once, in the first steps."""
    dev = d.device
    if d.platform != "gpu" or dev is None or dev.vendor != "nvidia" or tried_advice(d, "cudnn-benchmark"):
        return None
    share = d.extra.get("conv_share") or 0.0
    constant = d.extra.get("conv_shapes_constant")
    if share < CUDNN_CONV_SHARE or constant is False or not d.step_time_us:
        return None
    kernel_share = d.kernel_us / d.step_time_us
    evidence = [f"{pct(share)} of kernel time is in convolutions"]
    evidence.append("every step convolves the same input shapes" if constant else
                    "the trace has no input shapes (record_shapes=True): check that the shapes do not change")
    return Recommendation(
        id="cudnn-benchmark",
        title="Let cuDNN pick the fastest convolution algorithms (cudnn.benchmark)",
        knobs=advised_by("cudnn-benchmark"),
        predicted_gain=0.1 * share * min(kernel_share, 1.0),
        evidence=tuple(evidence),
        code_change="torch.backends.cudnn.benchmark = True  # before the first step",
        caveat="Each new input shape is autotuned again: keep shapes fixed (drop_last=True).",
        bound="compute",
    )


def sdpa(d: Diagnosis) -> Recommendation | None:
    """Attention written by hand (two matmuls around a softmax over a (…, t, t) matrix): the fused
    scaled_dot_product_attention computes it without materialising that matrix."""
    found = d.extra.get("attention") or {}
    share = found.get("hand_written_share") or 0.0
    if tried_advice(d, "sdpa") or share < ATTENTION_SHARE:
        return None
    # The usual gain of the fused kernels on a GPU is 2-4x on attention; on a CPU its flash kernel's, less.
    speedup = 3.0 if d.platform == "gpu" else 1.5
    return Recommendation(
        id="sdpa",
        title="Compute attention with torch.nn.functional.scaled_dot_product_attention",
        knobs=advised_by("sdpa"),
        predicted_gain=share * (1 - 1 / speedup),
        evidence=(f"{pct(share)} of the step is attention written by hand ({found.get('per_step', 0):.0f} a step: "
                  "a matmul into a (…, t, t) matrix, mask, softmax, matmul with the values)",),
        code_change="y = F.scaled_dot_product_attention(q, k, v, is_causal=True, "
                    "dropout_p=self.dropout.p if self.training else 0.0)",
        caveat="The same numbers within float tolerance; not where the weights after the softmax are read.",
        bound="compute",
    )

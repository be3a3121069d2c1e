"""Diagnosis → ranked Recommendations. Each rule is a pure function that returns a Recommendation or None.

A rule speaks only when the trace supports it: each recommendation carries the figures that triggered it
(its evidence) and a predicted gain, the share of step time it is expected to save, used for ranking.
Predicted gains are deliberately rough; the optimization session measures the real effect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from advisor.diagnosis import Diagnosis

# Thresholds, as shares of the average step unless said otherwise.
DATALOADER_SHARE = 0.05
ELIGIBLE_SHARE = 0.20  # of kernel time (GPU) or step time (CPU)
TENSOR_CORE_SHARE_LOW = 0.50
PAGEABLE_COPY_SHARE = 0.005
SYNC_WAIT_SHARE = 0.002
PINNED_COPY_SHARE = 0.05
LOW_UTILIZATION = 0.80
VERY_LOW_UTILIZATION = 0.30
HEADROOM = 0.30
MEMORY_SAFETY = 0.85  # keep the predicted peak under this share of device memory
MIN_GAIN = 0.005  # below half a percent of the step, a change is not worth the user's attention


@dataclass(frozen=True)
class Recommendation:
    """One change to make, why (evidence), what it should gain, and the code that makes it."""

    id: str
    title: str
    knobs: dict  # the Knobs fields this changes, e.g. {"amp": "bf16"}; empty for code-only advice
    predicted_gain: float  # share of step time expected to be saved
    evidence: tuple[str, ...]
    code_change: str
    caveat: str = ""
    details: dict = field(default_factory=dict)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ms(us: float) -> str:
    return f"{us / 1000:.2f} ms"


def has_matrix_units(d: Diagnosis) -> tuple[bool, str]:
    """Whether the device has Tensor Cores (NVIDIA sm_70+) or matrix cores (AMD CDNA), and which."""
    dev = d.device
    if dev is None:
        return False, "unknown device"
    cap = dev.compute_capability
    if dev.vendor == "nvidia":
        if cap is None:
            return False, "compute capability unknown"
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
    if dev is not None and dev.vendor == "nvidia" and dev.compute_capability and dev.compute_capability < (8, 0):
        return "fp16"
    return "bf16"


def more_workers(d: Diagnosis) -> Recommendation | None:
    """The step waits on the DataLoader: load batches in worker processes, overlapped with compute."""
    share = d.dataloader_share
    if share < DATALOADER_SHARE:
        return None
    return Recommendation(
        id="more-workers",
        title="Load data in parallel: raise DataLoader num_workers",
        knobs={"num_workers": "increase"},
        predicted_gain=0.9 * share,
        evidence=(f"{_pct(share)} of the step is spent in DataLoader.__next__ "
                  f"({_ms(d.breakdown_us['dataloader'])} per step) with nothing else running",),
        code_change="DataLoader(dataset, batch_size=..., num_workers=4, persistent_workers=True)",
        caveat="Each worker holds a copy of the Dataset; grow num_workers while it helps, up to the CPU count.",
    )


def amp(d: Diagnosis) -> Recommendation | None:
    """Matmuls and convolutions run in fp32: autocast them to bf16/fp16 to use Tensor/matrix cores."""
    if ((d.trial or {}).get("knobs") or {}).get("amp"):
        return None  # the trial already ran under autocast
    dtype = amp_dtype(d)
    scaler = " with a GradScaler" if dtype == "fp16" else ""
    if d.platform == "cpu":
        share = d.extra.get("cpu_eligible_share") or 0.0
        if share < ELIGIBLE_SHARE:
            return None
        evidence = [f"{_pct(share)} of the step is in matmul/convolution operators, all in fp32"]
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
        )
    ok, why = has_matrix_units(d)
    if not ok or d.eligible_share is None or d.tensor_core_share is None:
        return None
    if d.eligible_share < ELIGIBLE_SHARE or d.tensor_core_share >= TENSOR_CORE_SHARE_LOW:
        return None
    unit = "Tensor Cores" if d.device.vendor == "nvidia" else "matrix cores"
    kernel_share = d.kernel_us / d.step_time_us if d.step_time_us else 0.0
    return Recommendation(
        id="amp",
        title=f"Use automatic mixed precision ({dtype}{scaler}) to run matmuls on {unit}",
        knobs={"amp": dtype},
        predicted_gain=0.5 * d.eligible_share * min(kernel_share, 1.0),
        evidence=(
            f"{_pct(d.eligible_share)} of kernel time is matmul/convolution work not on {unit}",
            f"{unit} used by {_pct(d.tensor_core_share)} of kernel time",
            f"the device has {unit} ({why})",
        ),
        code_change=_autocast_code("cuda", dtype),  # ROCm builds use the "cuda" device type too
        caveat="Check that the loss curve matches fp32 over the first few hundred steps.",
        details={"dtype": dtype},
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


def pin_memory(d: Diagnosis) -> Recommendation | None:
    """Copies from pageable host memory are slow and synchronous: pin the loader's batches."""
    c = d.copies
    share = c.pageable_us / d.step_time_us if d.step_time_us else 0.0
    if share < PAGEABLE_COPY_SHARE:
        return None
    return Recommendation(
        id="pin-memory",
        title="Pin host memory: DataLoader(pin_memory=True)",
        knobs={"pin_memory": True},
        predicted_gain=0.5 * share + (c.sync_wait_us / d.step_time_us),
        evidence=(f"{c.count:.0f} host-to-device copies per step from pageable memory take "
                  f"{_ms(c.pageable_us)} ({_pct(share)} of the step)",)
        + ((f"{c.synchronous:.0f} of them block the host",) if c.synchronous else ()),
        code_change="DataLoader(dataset, ..., pin_memory=True)\nx = x.to(device, non_blocking=True)",
    )


def non_blocking(d: Diagnosis) -> Recommendation | None:
    """The host waits for each copy to finish: let copies run asynchronously."""
    c = d.copies
    if not c.synchronous or not d.step_time_us:
        return None
    wait = c.sync_wait_us / d.step_time_us
    if wait < SYNC_WAIT_SHARE:
        return None
    return Recommendation(
        id="non-blocking",
        title="Copy batches asynchronously: .to(device, non_blocking=True)",
        knobs={"non_blocking": True},
        predicted_gain=wait,
        evidence=(f"{c.synchronous:.0f} synchronous host-to-device copies per step; the host waits "
                  f"{_ms(c.sync_wait_us)} per step for them",),
        code_change="x = x.to(device, non_blocking=True)\ny = y.to(device, non_blocking=True)",
        caveat="Overlaps only with pinned host memory (pin_memory=True).",
    )


def larger_batch(d: Diagnosis) -> Recommendation | None:
    """The accelerator idles and memory is left over: more samples per step amortize fixed costs."""
    if d.platform != "gpu" or d.gpu_utilization is None or d.gpu_utilization >= LOW_UTILIZATION:
        return None
    if d.dataloader_share >= 0.2:
        return None  # a bigger batch only makes a loading-bound step wait longer
    util = d.gpu_utilization
    mem = next((m for m in d.memory if m.device != "cpu" and m.headroom is not None), None)
    evidence = [f"GPU busy {_pct(util)} of the step"]
    details = {}
    if mem is not None:
        if mem.headroom < HEADROOM:
            return None
        factor = max(1, int(MEMORY_SAFETY / (1 - mem.headroom)))
        evidence.append(f"peak memory {mem.peak_allocated / 1e9:.2f} GB of {mem.capacity / 1e9:.1f} GB "
                        f"({_pct(mem.headroom)} unused)")
        details = {"max_factor": factor, "headroom": mem.headroom}
        caveat = ("Scale the learning rate with the batch (linear rule, with warm-up) or keep the effective "
                  f"batch with gradient accumulation. Memory allows about ×{factor}.")
    elif util < VERY_LOW_UTILIZATION:
        evidence.append("the trace has no memory totals: grow the batch step by step and watch memory")
        caveat = "Memory use is not in the trace (profile_memory=True records it)."
    else:
        return None
    return Recommendation(
        id="larger-batch",
        title="Use a larger batch",
        knobs={"batch_size": "increase"},
        predicted_gain=0.5 * (1 - util),
        evidence=tuple(evidence),
        code_change="DataLoader(dataset, batch_size=2 * batch_size, ...)",
        caveat=caveat,
        details=details,
    )


def fewer_copy_bytes(d: Diagnosis) -> Recommendation | None:
    """Pinned copies still take a large share: send fewer bytes (uint8 images, smaller dtypes)."""
    c = d.copies
    share = c.pinned_us / d.step_time_us if d.step_time_us else 0.0
    if share < PINNED_COPY_SHARE:
        return None
    hidden = c.overlap_with_kernels or 0.0
    per_step = f", {c.bytes / 1e6:.1f} MB per step" if c.bytes else ""
    return Recommendation(
        id="fewer-copy-bytes",
        title="Copy fewer bytes to the device",
        knobs={},
        predicted_gain=0.75 * share * (1 - hidden),
        evidence=(f"pinned host-to-device copies take {_pct(share)} of the step{per_step}",
                  f"{_pct(hidden)} of copy time overlaps kernels"),
        code_change=("# send uint8 images and normalize on the device\n"
                     "x = x.to(device, non_blocking=True).float().div_(255)"),
    )


LEAK_BYTES_PER_STEP = 1 << 20  # growth below 1 MiB a step is allocator noise, not a leak
LEAK_R2 = 0.9
MEMORY_TIGHT = 0.70  # peak above this share of capacity: memory, not speed, is what binds


def memory_growth_advice(trial: dict | None, lint: list[dict] | None = None) -> Recommendation | None:
    """Memory that grows step after step: a tensor (usually the loss) kept across steps with its graph."""
    growth = ((trial or {}).get("summary") or {}).get("memory_growth") or {}
    per_step = growth.get("bytes_per_step") or 0.0
    median_diff = growth.get("median_difference_bytes") or 0.0
    # A leak grows by about the same amount every step; a one-off jump (optimizer state created on the
    # first step) has a slope but no typical step-to-step difference.
    if per_step < LEAK_BYTES_PER_STEP or median_diff < LEAK_BYTES_PER_STEP / 2 or (growth.get("r2") or 0) < LEAK_R2:
        return None
    evidence = [f"memory grows {per_step / 2**20:.1f} MiB per step over {growth.get('steps')} steps "
                f"(R² {growth.get('r2', 0):.2f}, from {growth.get('source')})"]
    suspects = [f for f in (lint or []) if f.get("rule") == "loss-accumulation"]
    for f in suspects[:3]:
        evidence.append(f"{Path(str(f.get('file'))).name}:{f.get('line')}: {f.get('what')}")
    code = suspects[0].get("fix") if suspects else "total_loss += loss.item()  # or loss.detach()"
    return Recommendation(
        id="memory-growth",
        title="Stop memory from growing every step: do not keep tensors with their graph across steps",
        knobs={},
        predicted_gain=0.0,
        evidence=tuple(evidence),
        code_change=code,
        caveat="Until fixed, a long run ends in an out-of-memory error however much memory there is.",
        details={"bytes_per_step": per_step},
    )


def activation_checkpointing_advice(trial: dict | None, capacity: float | None = None,
                                    force: bool = False) -> Recommendation | None:
    """Memory-bound: recompute the largest repeated blocks' activations in backward instead of storing them."""
    summary = (trial or {}).get("summary") or {}
    acts = summary.get("activations") or {}
    candidates = acts.get("checkpoint_candidates") or []
    peak = summary.get("peak_memory_bytes")
    tight = force or (trial or {}).get("status") == "oom" or bool(summary.get("accumulation_steps", 1) not in (None, 1))
    if not tight and capacity and peak:
        tight = peak / capacity > MEMORY_TIGHT
    if not candidates or not tight:
        return None
    by_class = {c.get("class"): c for c in acts.get("by_class") or []}
    top = by_class.get(candidates[0]) or {}
    share = top.get("share") or 0.0
    name = candidates[0]
    evidence = [f"{name} ×{top.get('count', '?')} holds {100 * share:.0f}% of the activation memory saved for "
                f"backward ({(top.get('bytes') or 0) / 2**20:.0f} MiB)"]
    if (trial or {}).get("status") == "oom":
        evidence.append("the step ran out of memory")
    return Recommendation(
        id="activation-checkpointing",
        title=f"Checkpoint the {name} blocks: recompute their activations in backward",
        knobs={},
        predicted_gain=0.0,
        evidence=tuple(evidence),
        code_change=("from torch.utils.checkpoint import checkpoint\n"
                     f"# in the forward that runs the {name} blocks:\n"
                     "for block in self.blocks:\n"
                     "    x = checkpoint(block, x, use_reentrant=False)"),
        caveat=f"Frees about {100 * share:.0f}% of activation memory for roughly one more forward pass of "
               "those blocks per step (about 30% more compute).",
        details={"module": name, "share": share},
    )


def memory_growth(d: Diagnosis) -> Recommendation | None:
    """Rule: the trial behind this trace shows memory growing step after step."""
    return memory_growth_advice(d.trial, d.extra.get("lint"))


def activation_checkpointing(d: Diagnosis) -> Recommendation | None:
    """Rule: memory is tight and a repeated block holds most of the activations."""
    capacity = next((m.capacity for m in d.memory if m.capacity), None)
    facts = (d.trial or {}).get("device_facts") or {}
    if capacity is None:
        capacity = ((facts.get("gpu") or {}).get("total_memory_bytes") if facts.get("type") == "cuda"
                    else (facts.get("cpu") or {}).get("ram_bytes"))
    if (d.trial or {}).get("memory_limit"):
        capacity = min(capacity or d.trial["memory_limit"], d.trial["memory_limit"])
    return activation_checkpointing_advice(d.trial, capacity)


RULES = (more_workers, amp, pin_memory, non_blocking, larger_batch, fewer_copy_bytes)
MEMORY_RULES = (memory_growth, activation_checkpointing)  # correctness and fit, not speed: listed first


def recommend(d: Diagnosis) -> tuple[Recommendation, ...]:
    """All recommendations the diagnosis supports, best predicted gain first."""
    memory = [r for rule in MEMORY_RULES if (r := rule(d)) is not None]
    found = [r for rule in RULES if (r := rule(d)) is not None and r.predicted_gain >= MIN_GAIN]
    return tuple(memory) + tuple(sorted(found, key=lambda r: -r.predicted_gain))

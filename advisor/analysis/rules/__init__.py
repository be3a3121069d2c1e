"""Diagnosis → ranked Recommendations. Each rule is a pure function that returns a Recommendation or None.

A rule speaks only when the trace supports it: each recommendation carries the figures that triggered it
(its evidence), the bound it addresses (a key of `advisor.analysis.bound.BOUNDS`) and a predicted gain, the
share of step time it is expected to save, used for ranking. A recommendation helps now when its bound is
the diagnosis's bound. One that addresses another bound does not claim its gain now: it helps once the
current bound is fixed, and its predicted gain is the time it should save then, as a share of today's
step (once the current bound's time is gone the step is shorter, so its share then is larger; how much
shorter no trace says). Predicted gains are deliberately rough; the optimization session measures the
real effect.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from advisor.analysis.bound import BOUNDS
from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.memory import memory_leak

# Thresholds, as shares of the average step unless said otherwise.
DATALOADER_SHARE = 0.05
ELIGIBLE_SHARE = 0.20  # of kernel time (GPU) or step time (CPU)
TENSOR_CORE_SHARE_LOW = 0.50
PAGEABLE_COPY_SHARE = 0.005
SYNC_WAIT_SHARE = 0.002
COPY_SHARE = 0.05  # copies and the host's waits on them, with no kernel running
LOW_UTILIZATION = 0.80
HEADROOM = 0.30
MEMORY_SAFETY = 0.85  # keep the predicted peak under this share of device memory
MAX_BATCH_FACTOR = 64  # what "memory allows ×N" says at most: beyond it, other limits than memory come first
HOST_SHARE = 0.30  # host time with the device idle, for CUDA graphs / torch.compile
MIN_LAUNCHES = 20  # kernel launches per step worth capturing in a graph
OPTIMIZER_SHARE = 0.05  # the optimizer step's host time
LAYOUT_SHARE = 0.05  # of kernel time: layout conversions worth removing with channels_last
MIN_GAIN = 0.005  # below half a percent of the step, a change is not worth the user's attention
FUSED_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad")  # torch.optim classes that take fused=True


@dataclass(frozen=True)
class Recommendation:
    """One change to make, why (evidence), what it should gain, the bound it addresses, and the code."""

    id: str
    title: str
    knobs: dict  # the Knobs fields this changes, e.g. {"amp": "bf16"}; empty for code-only advice
    predicted_gain: float  # step time it saves, as a share of today's step (once its bound binds, if not now)
    evidence: tuple[str, ...]
    code_change: str
    caveat: str = ""
    details: dict = field(default_factory=dict)
    bound: str = field(kw_only=True)  # the key of BOUNDS this addresses
    helps_now: bool = field(default=True, kw_only=True)  # its bound is the diagnosis's (or that is unknown)
    helps_once: str = field(default="", kw_only=True)  # when not now: the bound to fix first, as BOUNDS names it


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ms(us: float) -> str:
    return f"{us / 1000:.2f} ms"


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


def more_workers(d: Diagnosis) -> Recommendation | None:
    """The step waits on the DataLoader: load batches in worker processes, overlapped with compute."""
    share = max(d.dataloader_share, d.loader_steady_share or 0.0)
    if share < DATALOADER_SHARE:
        return None
    evidence = [f"{_pct(d.dataloader_share)} of the step is spent in DataLoader.__next__ "
                f"({_ms(d.breakdown_us['dataloader'])} per step) with nothing else running"]
    evidence += [f.message for f in d.findings if f.code == "loader-queue"]
    return Recommendation(
        id="more-workers",
        title="Load data in parallel: raise DataLoader num_workers",
        knobs={"num_workers": "increase"},
        predicted_gain=0.9 * share,
        evidence=tuple(evidence),
        code_change="DataLoader(dataset, batch_size=..., num_workers=4, persistent_workers=True)",
        caveat="Each worker holds a copy of the Dataset; grow num_workers while it helps, up to the CPU count.",
        bound="input",
    )


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
    evidence = [f"{_pct(d.eligible_share)} of kernel time is matmul/convolution work not on {unit}",
                f"{unit} used by {_pct(d.tensor_core_share)} of kernel time",
                f"the device has {unit} ({why})"]
    if d.layout_share and d.layout_share >= 0.01:
        evidence.append(f"layout conversions ({_pct(d.layout_share)} of kernel time) are not counted: AMP does "
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


def pin_memory(d: Diagnosis) -> Recommendation | None:
    """Copies from pageable host memory are slow and block the host: pin the loader's batches."""
    c = d.copies
    if d.platform != "gpu" or not d.step_time_us:
        return None
    cost = max(c.pageable_us, c.pageable_wait_us) / d.step_time_us
    if cost < PAGEABLE_COPY_SHARE:
        return None
    evidence = [f"{c.count:.0f} host-to-device copies per step, from pageable memory: {_ms(c.pageable_us)} on "
                f"the device"]
    if c.pageable_wait_us:
        evidence.append(f"the host is blocked {_ms(c.pageable_wait_us)} per step inside those copy calls, staging "
                        "the data itself")
    return Recommendation(
        id="pin-memory",
        title="Pin host memory: DataLoader(pin_memory=True)",
        knobs={"pin_memory": True},
        # Pinned copies run at the link's full speed (about twice pageable) and let the host go on.
        predicted_gain=0.5 * cost,
        evidence=tuple(evidence),
        code_change="DataLoader(dataset, ..., pin_memory=True)\nx = x.to(device, non_blocking=True)",
        bound="copy",
    )


def non_blocking(d: Diagnosis) -> Recommendation | None:
    """The host waits for each copy to finish: let copies run asynchronously."""
    c = d.copies
    if d.platform != "gpu" or not c.synchronous or not d.step_time_us:
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
                  f"{_ms(c.sync_wait_us)} per step in synchronizes and blocking copies",),
        code_change="x = x.to(device, non_blocking=True)\ny = y.to(device, non_blocking=True)",
        caveat="Overlaps only with pinned host memory (pin_memory=True).",
        bound="copy",
    )


def larger_batch(d: Diagnosis) -> Recommendation | None:
    """The accelerator idles: more samples per step amortize the fixed costs of launching the step.

    With memory figures, low utilization and headroom carry it (headroom limits how much larger). Without
    them, a launch-bound step (host time with the device idle ≥ HOST_SHARE) still carries it, with the
    caveat to grow the batch step by step and watch memory.
    """
    if d.platform == "cpu" or d.gpu_utilization is None or d.gpu_utilization >= LOW_UTILIZATION:
        return None
    if d.dataloader_share >= 0.2:
        return None  # a bigger batch only makes a loading-bound step wait longer
    util = d.gpu_utilization
    device = "GPU" if d.platform == "gpu" else d.platform.upper()
    mem = next((m for m in d.memory if m.device != "cpu" and m.headroom is not None), None)
    evidence = [f"{device} busy {_pct(util)} of the step"]
    details = {}
    if mem is not None:
        if mem.headroom < HEADROOM:
            return None
        used = 1 - mem.headroom
        factor = MAX_BATCH_FACTOR if used * MAX_BATCH_FACTOR <= MEMORY_SAFETY else max(1, int(MEMORY_SAFETY / used))
        evidence.append(f"peak memory {mem.peak_allocated / 1e9:.2f} GB of {mem.capacity / 1e9:.1f} GB "
                        f"({_pct(mem.headroom)} unused)")
        details = {"max_factor": factor, "headroom": mem.headroom}
        caveat = ("Scale the learning rate with the batch (linear rule, with warm-up) or keep the effective "
                  f"batch with gradient accumulation. Memory allows about ×{factor}.")
    elif d.bound_shares.get("host", 0.0) >= HOST_SHARE:
        evidence.append(f"{_pct(d.bound_shares['host'])} of the step on the host with the {device} idle: fixed "
                        "launch costs a larger batch spreads over more samples")
        evidence.append("the trace has no memory totals: grow the batch step by step and watch memory")
        caveat = ("Memory use is not in the trace (profile_memory=True records it). Scale the learning rate "
                  "with the batch, or keep the effective batch with gradient accumulation.")
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
        bound="host",
    )


def cuda_graphs(d: Diagnosis) -> Recommendation | None:
    """Launch-bound: the host spends the step launching many short kernels while the GPU idles; capture
    the step in a CUDA graph (one launch) and fuse kernels with torch.compile."""
    if d.platform != "gpu" or not d.step_time_us:
        return None
    host = d.bound_shares.get("host", 0.0)
    launches = d.extra.get("launches_per_step", 0.0)
    kernels = d.extra.get("kernels_per_step", 0.0)
    if host < HOST_SHARE or launches < MIN_LAUNCHES or d.extra.get("graph_launches_per_step"):
        return None
    mean_kernel = d.kernel_us / kernels if kernels else 0.0
    return Recommendation(
        id="cuda-graphs",
        title="Launch fewer, larger kernels: torch.compile (CUDA graphs and fused kernels)",
        knobs={},
        predicted_gain=0.5 * host,
        evidence=(f"{_pct(host)} of the step on the host (runtime calls, CPU operators, Python) with the GPU idle",
                  f"{launches:.0f} kernel launches per step, {mean_kernel:.0f} µs per kernel on average"),
        code_change=('model = torch.compile(model, mode="reduce-overhead")  # CUDA graphs + fused kernels\n'
                     "# or capture the step by hand: torch.cuda.graphs (static shapes and buffers)"),
        caveat="CUDA graphs need the same shapes every step (drop_last=True); the first steps compile.",
        bound="host",
    )


def fused_optimizer(d: Diagnosis) -> Recommendation | None:
    """The optimizer step launches kernels per parameter (or per op over lists): one fused kernel does it."""
    opt = d.extra.get("optimizer")
    if d.platform != "gpu" or not opt or opt["implementation"] == "fused" or not d.step_time_us:
        return None
    share = opt["us_per_step"] / d.step_time_us
    if share < OPTIMIZER_SHARE:
        return None
    name = opt["name"]
    if name in FUSED_OPTIMIZERS:
        change, option = "fused", "fused=True"
    elif opt["implementation"] == "for-loop":
        change, option = "foreach", "foreach=True"
    else:
        return None
    # A per-parameter loop launches kernels per tensor; foreach launches a few per op over tensor lists.
    factor = 0.6 if opt["implementation"] == "for-loop" else 0.3
    return Recommendation(
        id="fused-optimizer",
        title=f"Use the {change} {name} optimizer ({option})",
        knobs={},
        predicted_gain=factor * share,
        evidence=(f"{name}.step takes {_ms(opt['us_per_step'])} per step ({_pct(share)} of the step), running "
                  f"its {opt['implementation']} implementation",),
        code_change=f"optimizer = torch.optim.{name}(model.parameters(), lr=..., {option})",
        bound="host",
    )


def fewer_copy_bytes(d: Diagnosis) -> Recommendation | None:
    """Copies take a large share of the step: send fewer bytes (uint8 or half on the host) and convert and
    normalize on the device."""
    c = d.copies
    if d.platform != "gpu" or not d.step_time_us:
        return None
    share = c.exposed_us / d.step_time_us
    if share < COPY_SHARE:
        return None
    per_step = f"{c.bytes / 1e6:.1f} MB per step" if c.bytes else "bytes not recorded"
    return Recommendation(
        id="fewer-copy-bytes",
        title="Copy fewer bytes to the device: uint8 (or half) on the host, convert on the device",
        knobs={},
        # float32 → uint8 sends a quarter of the bytes.
        predicted_gain=0.75 * share,
        evidence=(f"host-to-device copies and the host's waits on them take {_pct(share)} of the step with no "
                  f"kernel running ({_ms(c.exposed_us)})",
                  f"{c.count:.0f} copies, {per_step}; the host waits {_ms(c.host_wait_us)} per step"),
        code_change=("# in the Dataset: keep the decoded image as uint8, no float conversion or normalization\n"
                     "pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8)).permute(2, 0, 1)\n"
                     "# in the step: copy 1 byte per value, then convert and normalize on the device\n"
                     "x = x.to(device, non_blocking=True).float().div_(255)\n"
                     "x = (x - mean) / std  # mean, std: tensors created once on the device\n"
                     "# values that are not 8-bit: x.half() on the host, x.float() on the device"),
        caveat="Random augmentations that need floats can run on the device after the copy.",
        bound="copy",
    )


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
        evidence=(f"{_pct(d.layout_share)} of kernel time converts layouts (nchwToNhwc/nhwcToNchw) around "
                  f"convolutions, {_ms(layout_us)} per step; AMP does not remove it",),
        code_change=("model = model.to(memory_format=torch.channels_last)\n"
                     "x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)"),
        caveat="Helps convolutions (most with AMP); measure it, some layers prefer NCHW.",
        bound="compute",
    )


MEMORY_TIGHT = 0.70  # peak above this share of capacity: memory, not speed, is what binds


def memory_growth_advice(trial: dict | None, lint: list[dict] | None = None) -> Recommendation | None:
    """Memory that grows step after step: a tensor (usually the loss) kept across steps with its graph."""
    growth = memory_leak(trial)
    if growth is None:
        return None
    per_step = growth["bytes_per_step"]
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
        bound="memory",
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
        bound="memory",
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


RULES = (more_workers, amp, pin_memory, non_blocking, larger_batch, cuda_graphs, fused_optimizer, fewer_copy_bytes,
         channels_last)
MEMORY_RULES = (memory_growth, activation_checkpointing)  # whether the run fits at all; no speed gain


def recommend(d: Diagnosis) -> tuple[Recommendation, ...]:
    """All recommendations the diagnosis supports: those that help now first, then those that help once
    the current bound is fixed, each group by predicted gain (memory advice, gain 0, keeps rule order).

    A degenerate trace (`Diagnosis.extra["degenerate"]`, bound None unless memory binds) gets no speed
    advice: its figures cannot carry any.
    """
    found = [r for rule in MEMORY_RULES if (r := rule(d)) is not None]
    if d.bound is not None and not d.extra.get("degenerate"):
        found += [r for rule in RULES if (r := rule(d)) is not None]
    out = []
    for r in found:
        if d.bound is None or r.bound == d.bound:
            out.append(r)
        else:
            out.append(dataclasses.replace(r, helps_now=False, helps_once=BOUNDS[d.bound]))
    out = [r for r in out if r.bound == "memory" or r.predicted_gain >= MIN_GAIN]
    return tuple(sorted(out, key=lambda r: (not r.helps_now, -r.predicted_gain)))

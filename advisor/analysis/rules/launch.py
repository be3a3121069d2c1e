"""The host and launch overhead: a larger batch, CUDA graphs and fused kernels, a fused optimizer."""

from __future__ import annotations

from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.rules.recommendation import Recommendation, ms, pct, tried_advice
from advisor.knobs import advised_by, proposed_knobs

LOW_UTILIZATION = 0.80
HEADROOM = 0.30
MEMORY_SAFETY = 0.85  # keep the predicted peak under this share of device memory
MAX_BATCH_FACTOR = 64  # what "memory allows ×N" says at most: beyond it, other limits than memory come first
HOST_SHARE = 0.30  # host time with the device idle, for CUDA graphs / torch.compile
MIN_LAUNCHES = 20  # kernel launches per step worth capturing in a graph
OPTIMIZER_SHARE = 0.05  # the optimizer step's host time
FUSED_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad")  # torch.optim classes that take fused=True
# ... and those that take foreach=True (LBFGS, SparseAdam and third-party optimizers do not).
FOREACH_OPTIMIZERS = ("Adadelta", "Adagrad", "Adam", "Adamax", "AdamW", "ASGD", "NAdam", "RAdam", "RMSprop", "Rprop",
                      "SGD")


def larger_batch(d: Diagnosis) -> Recommendation | None:
    """The accelerator idles: more samples per step amortize the fixed costs of launching the step.

    With memory figures, low utilization and headroom carry it (headroom limits how much larger). Without
    them, a launch-bound step (host time with the device idle ≥ HOST_SHARE) still carries it, with the
    caveat to grow the batch step by step and watch memory.
    """
    if d.platform == "cpu" or d.gpu_utilization is None or d.gpu_utilization >= LOW_UTILIZATION:
        return None
    if d.whole_trace:
        return None  # no step boundaries: the launch cost per step and the batch are unknown (`missing` says so)
    if d.dataloader_share >= 0.2:
        return None  # a bigger batch only makes a loading-bound step wait longer
    util = d.gpu_utilization
    device = "GPU" if d.platform == "gpu" else d.platform.upper()
    mem = next((m for m in d.memory if m.device != "cpu" and m.headroom is not None), None)
    evidence = [f"{device} busy {pct(util)} of the step"]
    details = {}
    if mem is not None:
        if mem.headroom < HEADROOM:
            return None
        used = 1 - mem.headroom
        factor = MAX_BATCH_FACTOR if used * MAX_BATCH_FACTOR <= MEMORY_SAFETY else max(1, int(MEMORY_SAFETY / used))
        evidence.append(f"peak memory {mem.peak_allocated / 1e9:.2f} GB of {mem.capacity / 1e9:.1f} GB "
                        f"({pct(mem.headroom)} unused)")
        details = {"max_factor": factor, "headroom": mem.headroom}
        caveat = ("Scale the learning rate with the batch (linear rule, with warm-up) or keep the effective "
                  f"batch with gradient accumulation. Memory allows about ×{factor}.")
    elif d.bound_shares.get("host", 0.0) >= HOST_SHARE:
        evidence.append(f"{pct(d.bound_shares['host'])} of the step on the host with the {device} idle: fixed "
                        "launch costs a larger batch spreads over more samples")
        evidence.append("the trace has no memory totals: grow the batch step by step and watch memory")
        caveat = ("Memory use is not in the trace (profile_memory=True records it). Scale the learning rate "
                  "with the batch, or keep the effective batch with gradient accumulation.")
    else:
        return None
    return Recommendation(
        id="larger-batch",
        title="Use a larger batch",
        knobs=proposed_knobs("larger-batch", "increase"),
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
        evidence=(f"{pct(host)} of the step on the host (runtime calls, CPU operators, Python) with the GPU idle",
                  f"{launches:.0f} kernel launches per step, {mean_kernel:.0f} µs per kernel on average"),
        code_change=('model = torch.compile(model, mode="reduce-overhead")  # CUDA graphs + fused kernels\n'
                     "# or capture the step by hand: torch.cuda.graphs (static shapes and buffers)"),
        caveat="CUDA graphs need the same shapes every step (drop_last=True); the first steps compile.",
        bound="host",
    )


def fused_optimizer(d: Diagnosis) -> Recommendation | None:
    """The optimizer step launches kernels per parameter (or per op over lists): one fused kernel does it."""
    opt = d.extra.get("optimizer")
    if d.platform not in ("gpu", "cpu") or not opt or opt["implementation"] == "fused" or not d.step_time_us:
        return None  # torch has fused optimizer kernels for CUDA and the CPU
    if tried_advice(d, "fused-optimizer"):
        return None
    share = opt["us_per_step"] / d.step_time_us
    if share < OPTIMIZER_SHARE:
        return None
    name = opt["name"]
    if name in FUSED_OPTIMIZERS:
        change, option = "fused", "fused=True"
    elif opt["implementation"] == "for-loop" and name in FOREACH_OPTIMIZERS:
        change, option = "foreach", "foreach=True"
    else:
        return None
    # A per-parameter loop launches kernels per tensor; foreach launches a few per op over tensor lists.
    factor = 0.6 if opt["implementation"] == "for-loop" else 0.3
    return Recommendation(
        id="fused-optimizer",
        title=f"Use the {change} {name} optimizer ({option})",
        knobs=advised_by("fused-optimizer"),
        predicted_gain=factor * share,
        evidence=(f"{name}.step takes {ms(opt['us_per_step'])} per step ({pct(share)} of the step), running "
                  f"its {opt['implementation']} implementation",),
        code_change=f"optimizer = torch.optim.{name}(model.parameters(), lr=..., {option})",
        bound="host",
    )

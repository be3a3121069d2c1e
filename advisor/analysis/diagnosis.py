"""Trace → Diagnosis: the figures of DESIGN.md "Figures and their definitions", as pure functions.

Where a definition follows the deprecated TensorBoard profiler plugin (so results compare with it), the
function says so; where it deliberately differs, the docstring says how and why.
"""

from __future__ import annotations

import bisect
import re
from functools import lru_cache
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import median

import numpy as np

from advisor.analysis import intervals as iv
from advisor.analysis.devices import Device
from advisor.analysis.events import Event
from advisor.analysis.trace import Trace

# Priority order of the step-time breakdown: each moment of a step is counted once, by the first role
# active at that moment (the plugin's scheme).
ROLES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_op", "other")

# What can bound a step, and how output names it. Recommendations address one of these (`Recommendation.bound`).
BOUNDS = {
    "input": "input pipeline (DataLoader)",
    "copy": "host-to-device copies",
    "host": "CPU/launch overhead",
    "compute": "compute",
    "communication": "communication",
    "memory": "memory",
}

COLLECTIVE_OPS = frozenset(
    f"{lib}:{op}" for lib in ("nccl", "gloo") for op in ("broadcast", "reduce", "all_reduce", "all_gather",
                                                         "reduce_scatter")
)

# Tensor Core (NVIDIA) and matrix core (AMD) kernel name patterns, one table, one family per row.
# A kernel counts as Tensor Core when any family's pattern matches its name.
TENSOR_CORE_PATTERNS: tuple[tuple[str, str, str], ...] = (
    # (family, vendor, regex)
    ("volta-hmma", "nvidia", r"h884|s884|i884|hmma|884gemm|884cudnn"),
    ("turing-ampere-mma", "nvidia", r"h1688|s1688|c1688|i8816|16816|1688gemm|bf16816|tf32"),
    ("xmma", "nvidia", r"xmma"),
    ("cutlass-tensorop", "nvidia", r"tensorop"),
    ("hopper-wgmma", "nvidia", r"wgmma|gmma_|_gmma"),
    ("nvjet", "nvidia", r"nvjet"),
    ("sm80-sm90-gemm", "nvidia", r"\bsm_?(?:75|80|86|87|89|90|100|120)a?_\w*(?:gemm|conv|fprop|dgrad|wgrad)"),
    ("flash-attention", "nvidia", r"flash_fwd|flash_bwd|flash::|pytorch_flash|fmha_|_fmha|flash_attn"),
    ("cudnn-tensor-core-conv", "nvidia", r"dgrad_1x1_stride_2x2|first_layer_wgrad_kernel|conv1x1|conv2d_c1_k1|"
                                         r"direct_group"),
    ("amd-mfma", "amd", r"_MI\d+x\d+x\d+|mfma|xdlops|_xdl_"),
)
_TC_REGEX = {vendor: re.compile("|".join(p for _, v, p in TENSOR_CORE_PATTERNS if v == vendor))
             for vendor in ("nvidia", "amd")}
# Names that say the math ran on the ordinary FP32 units even where a pattern above matches: cuBLAS/cuDNN
# xmma kernels built for FFMA (`sm80_xmma_gemm_f32f32_..._ffma_...`) and cutlass SIMT kernels.
NOT_TENSOR_CORE = re.compile(r"ffma|_simt_")

# cuDNN/MIOpen layout conversions around convolutions (NCHW tensors fed to NHWC kernels): memory-bound
# copies that AMP does not remove; channels_last does.
LAYOUT_KERNEL = re.compile(r"nchw_?(?:2|to)_?nhwc|nhwc_?(?:2|to)_?nchw", re.IGNORECASE)

# Matmul, convolution and attention kernels by name, for kernels no operator launched (CUDA graph replays,
# compiled regions): cuBLAS/cutlass/nvjet GEMMs, cuDNN convolutions, AMD Tensile (Cijk_), attention.
MATMUL_KERNEL = re.compile(r"gemm|gemv|conv(?!ert)|fprop|dgrad|wgrad|winograd|[sh]\d*cudnn|nvjet|^Cijk_|fmha|"
                           r"flash_|_sdpa_|splitKreduce", re.IGNORECASE)


@lru_cache(maxsize=None)
def _is_communication_kernel(name: str) -> bool:
    return COMMUNICATION_KERNEL.match(name) is not None


@lru_cache(maxsize=None)
def _is_tensor_core(vendor: str, kernel_name: str) -> bool:
    regex = _TC_REGEX.get(vendor)
    return regex is not None and regex.search(kernel_name) is not None and not NOT_TENSOR_CORE.search(kernel_name)


@lru_cache(maxsize=None)
def _is_layout_kernel(kernel_name: str) -> bool:
    return LAYOUT_KERNEL.search(kernel_name) is not None


@lru_cache(maxsize=None)
def _is_matmul_kernel(kernel_name: str) -> bool:
    return MATMUL_KERNEL.search(kernel_name) is not None and not _is_layout_kernel(kernel_name)


@lru_cache(maxsize=None)
def _is_eligible_op(op_name: str) -> bool:
    return ELIGIBLE_OP.match(op_name) is not None


def tensor_core_families(kernel_name: str) -> list[str]:
    """Every Tensor Core / matrix core family whose pattern matches a kernel name (often more than one);
    none when the name says FFMA or SIMT math."""
    if NOT_TENSOR_CORE.search(kernel_name):
        return []
    return [family for family, _vendor, pattern in TENSOR_CORE_PATTERNS if re.search(pattern, kernel_name)]


# Operators whose kernels could run on Tensor Cores under AMP (autocast's lower-precision list), and their
# backward. The innermost operator that launched a kernel is the one matched.
ELIGIBLE_OP = re.compile(
    r"^(aten::(_?convolution\w*|conv\d?d|conv_tbc|conv_transpose\dd|cudnn_convolution\w*|miopen_convolution\w*|"
    r"mkldnn_convolution|_?mm|addmm_?|addmv|addr|matmul|mv|linear|addbmm|baddbmm|bmm|chain_matmul|"
    r"linalg_multi_dot|prelu|_thnn_fused_\w+_cell|\w+_cell|_scaled_dot_product\w*|_flash_attention\w*|"
    r"_efficient_attention\w*|scaled_dot_product_attention)"
    r"|\w*(Convolution|Mm|Bmm|Addmm|Addbmm|Baddbmm|Mv|Addmv|Linear|Matmul)\w*Backward\d*)$"
)

DATALOADER_NAME = re.compile(r"^enumerate\(DataLoader\)#.*\.__next__$|^enumerate\(DataPipe\)#")
SYNC_CALL = re.compile(r"(cuda|hip)(Stream|Device|Event)Synchronize$")
# Runtime calls that set a process up (context, device queries, module loading): a step made of them is
# the first step of a process, not a training step.
START_UP_CALL = re.compile(r"^(cuInit|cuDevicePrimaryCtx\w*|cuCtxCreate\w*|cu(da)?DriverGetVersion|cudaRuntimeGetVersion|"
                           r"cudaGetDeviceCount|cudaGetDeviceProperties\w*|cudaDeviceGetAttribute|cudaSetDevice|"
                           r"cudaFree|cuModuleLoad\w*|cuLibraryLoad\w*|cudaFuncGetAttributes|cuModuleGetFunction|"
                           r"hipInit|hipGetDeviceCount|hipGetDeviceProperties\w*|hipDeviceGetAttribute|hipSetDevice)$")
LAUNCH_CALL = re.compile(r"LaunchKernel|^cuLaunch|GraphLaunch")
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#(\w+)\.step$")
COMMUNICATION_KERNEL = re.compile(r"^(nccl|rccl)", re.IGNORECASE)
HTOD = "HtoD"


@dataclass(frozen=True)
class Step:
    """One training step as analysed: the ProfilerStep span, extended to the device work it launched."""

    name: str
    start: float
    end: float

    @property
    def duration(self) -> float:
        """Step length in microseconds."""
        return self.end - self.start


@dataclass(frozen=True)
class Copies:
    """Host-to-device copies per average step."""

    pageable_us: float = 0.0
    pinned_us: float = 0.0
    unknown_us: float = 0.0  # 'Host -> Device' (ROCm) does not say whether the host memory was pinned
    count: float = 0.0
    bytes: float | None = None
    synchronous: float = 0.0  # copies the host waited for, per step
    # The host's wait, per step: blocking copy calls and synchronizes right after async ones (what
    # non_blocking=True removes, given pinned memory) ...
    sync_wait_us: float = 0.0
    # ... and the async copy calls from pageable memory, inside which the host stages the data itself
    # (what pin_memory=True removes).
    pageable_wait_us: float = 0.0
    overlap_with_kernels: float | None = None  # share of copy time that ran alongside a kernel
    exposed_us: float = 0.0  # copies and the host's waits on them with no kernel running, per step

    @property
    def host_wait_us(self) -> float:
        """All host time blocked by host-to-device copies per step."""
        return self.sync_wait_us + self.pageable_wait_us

    @property
    def total_us(self) -> float:
        """All host-to-device copy time per step."""
        return self.pageable_us + self.pinned_us + self.unknown_us


@dataclass(frozen=True)
class DeviceMemory:
    """Peak memory of one device, from the trace's `[memory]` events."""

    device: str  # "cuda:1", "cpu"
    peak_allocated: float | None
    peak_reserved: float | None
    capacity: float | None
    growth: float | None = None  # peak rise of allocations during the trace, when no totals are recorded
    # Allocated bytes over time (ms from the trace start), at most TIMELINE_POINTS points keeping each
    # bucket's maximum so that peaks survive; net allocations from their lowest point when the trace records no totals.
    timeline_ms: tuple[float, ...] = ()
    timeline_bytes: tuple[float, ...] = ()

    @property
    def headroom(self) -> float | None:
        """1 − peak allocated / capacity (allocated, not reserved: the caching allocator can release); None
        when either is unknown, or the peak exceeds the capacity (one of them is wrong)."""
        if self.peak_allocated is None or not self.capacity or self.peak_allocated > self.capacity:
            return None
        return 1.0 - self.peak_allocated / self.capacity


@dataclass(frozen=True)
class Finding:
    """A fact worth telling, with the figures behind it."""

    code: str
    message: str
    value: float | None = None


@dataclass(frozen=True)
class Diagnosis:
    """Every figure of one trace, and what it lacks. Built by `diagnose`, never recomputed downstream."""

    source: str
    platform: str  # "gpu" | "cpu"
    devices: tuple[Device, ...]
    steps: tuple[Step, ...]
    step_note: str
    step_time_us: float
    breakdown_us: dict[str, float]
    dataloader_share: float
    dataloader_wait_share: float
    copies: Copies
    kernel_us: float
    tensor_core_share: float | None
    eligible_share: float | None
    eligible_op_share: float | None
    gpu_utilization: float | None
    utilization_by_device: dict[int, float]
    memory: tuple[DeviceMemory, ...]
    missing: tuple[str, ...]
    layout_share: float | None = None  # of kernel time: cuDNN/MIOpen NCHW↔NHWC layout conversions
    bound: str | None = None  # a key of BOUNDS; None when the figures cannot say (see `find_bound`)
    bound_evidence: tuple[str, ...] = ()
    bound_shares: dict[str, float] = field(default_factory=dict)  # share of the step each bound holds
    # DataLoader share over the trial's steps once the workers' queue ran dry, when the profiled window's
    # own share understates it (`loader_queue`); None otherwise.
    loader_steady_share: float | None = None
    distributed: dict | None = None
    trial: dict | None = None  # the trial.json beside the trace, when it came from `advisor profile`
    findings: tuple[Finding, ...] = ()
    recommendations: tuple = ()  # filled by advisor.analysis.rules.recommend, kept here for the report and API
    extra: dict = field(default_factory=dict)
    # Odd but legal events the loader left out (zero-length steps, ...): (reason, count), also as findings.
    skipped_events: tuple[tuple[str, int], ...] = ()

    @property
    def breakdown_share(self) -> dict[str, float]:
        """Breakdown as fractions of the average step."""
        t = self.step_time_us or 1.0
        return {role: us / t for role, us in self.breakdown_us.items()}

    @property
    def device(self) -> Device | None:
        """The accelerator the step ran on (the one with most kernel time), if any."""
        return self.devices[0] if self.devices else None


def _device_events_by_correlation(trace: Trace) -> dict:
    by_corr = defaultdict(list)
    for group in (trace.kernels, trace.memcpys, trace.memsets):
        for e in group:
            c = e.correlation
            if c is not None:
                by_corr[c].append(e)
    return by_corr


def host_steps(trace: Trace) -> tuple[list[Step], str]:
    """ProfilerStep spans; with none, the whole host timeline as one step (and a note saying so)."""
    if trace.steps:
        return [Step(e.name, e.ts, e.end) for e in trace.steps], ""
    spans = trace.ops or trace.runtime or trace.kernels or trace.memcpys or trace.memsets
    start = min(e.ts for e in spans)
    end = max(e.end for e in spans)
    return [Step("whole trace", start, end)], "no ProfilerStep# spans: the whole trace is one step"


def find_steps(trace: Trace) -> tuple[list[Step], str]:
    """Steps extended to the device work their runtime calls launched, as the TensorBoard plugin did.

    A step starts at its ProfilerStep span (or where the previous step's device work ended, if later) and
    ends when the last kernel/copy launched inside it ends. Trailing steps that launched no device work,
    or clearly less than the step before (the profiler stopped before their kernels ran), are dropped.
    """
    steps, note = host_steps(trace)
    if not trace.has_device_activity or not trace.runtime:
        return steps, note
    by_corr = _device_events_by_correlation(trace)
    runtime = trace.runtime  # sorted by start
    starts = [r.ts for r in runtime]
    device_span = []
    matched_count = []
    for s in steps:
        lo, hi, n = float("inf"), float("-inf"), 0
        for r in runtime[bisect.bisect_left(starts, s.start):bisect.bisect_right(starts, s.end)]:
            if r.ts + r.dur > s.end or r.args is None:
                continue
            for d in by_corr.get(r.args.correlation, ()):
                lo = min(lo, d.ts)
                hi = max(hi, d.ts + d.dur)
                n += 1
        device_span.append((lo, hi))
        matched_count.append(n)
    if not any(matched_count):
        return steps, note
    prev_end = steps[0].start
    first_device_start = device_span[0][0]
    if first_device_start != float("inf"):
        # Device work still running from before the first step (launched by an unrecorded step) delays
        # it. Work that ends before the first step's own device work cannot come from a later step.
        for group in (trace.kernels, trace.memcpys, trace.memsets):
            for d in group:
                end = d.ts + d.dur
                if end < first_device_start and end > prev_end:
                    prev_end = end
    out = []
    for s, (lo, hi) in zip(steps, device_span):
        start = max(prev_end, s.start)
        end = max(s.end, hi) if lo != float("inf") else max(s.end, start)
        out.append(Step(s.name, start, max(end, start)))
        prev_end = out[-1].end
    last = max((i for i, n in enumerate(matched_count) if n > 0), default=-1)
    keep = last + 1
    if last > 0 and matched_count[last - 1] * 0.8 > matched_count[last]:
        keep = last
    if 0 < keep < len(out):
        dropped = len(out) - keep
        out = out[:keep]
        note = (note + "; " if note else "") + (
            f"last {dropped} step(s) dropped: their device work was not fully captured")
    return out, note


STEP_NAME = re.compile(r"ProfilerStep#(\d+)")


def parse_steps(wanted: str) -> tuple[tuple[int, int], ...]:
    """'3-5', '2,4', '7' → ((3, 5), (2, 2), (4, 4)), ranges kept as bounds (never expanded: '1-100000000'
    costs nothing); AdvisorError naming the argument when it is not such a list."""
    from advisor.errors import AdvisorError

    ranges = []
    for part in wanted.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        low, high = low.strip(), (high.strip() if dash else low.strip())
        if not (low.isascii() and low.isdigit() and high.isascii() and high.isdigit()) or len(low + high) > 40:
            raise AdvisorError(f"--steps {wanted!r}: expected ProfilerStep numbers such as 3-5 or 2,4 or 7")
        if int(low) > int(high):
            raise AdvisorError(f"--steps {wanted!r}: the range {part} runs backwards")
        ranges.append((int(low), int(high)))
    return tuple(ranges)


def select_steps(steps: list[Step], wanted: str | None) -> list[Step]:
    """Keep the ProfilerStep numbers named by `wanted` ('3-5', '2,4', '7'); all when None."""
    if not wanted:
        return steps
    ranges = parse_steps(wanted)
    chosen = []
    for s in steps:
        number = STEP_NAME.fullmatch(s.name)
        if number is not None and any(low <= int(number.group(1)) <= high for low, high in ranges):
            chosen.append(s)
    return chosen


def role_intervals(trace: Trace) -> dict[str, iv.Intervals]:
    """Merged time intervals of each breakdown role over the whole trace."""
    collective_ids = {e.external_id for e in trace.ops if e.name in COLLECTIVE_OPS}
    kernel, comm = [], []
    for k in trace.kernels:
        is_comm = _is_communication_kernel(k.name) or (collective_ids and k.external_id in collective_ids)
        (comm if is_comm else kernel).append(k)
    dataloader, cpu_op = [], []
    for op in trace.ops:
        if op.name.startswith("enumerate(Data") and DATALOADER_NAME.match(op.name):
            dataloader.append(op)
        elif op.name in COLLECTIVE_OPS:
            comm.append(op)
        else:
            cpu_op.append(op)
    return {
        "kernel": iv.from_events(kernel),
        "memcpy": iv.from_events(trace.memcpys),
        "memset": iv.from_events(trace.memsets),
        "communication": iv.from_events(comm),
        "runtime": iv.from_events(trace.runtime),
        "dataloader": iv.from_events(dataloader),
        "cpu_op": iv.from_events(cpu_op),
    }


def exclusive_time(steps: list[Step], layers: list[tuple[str, iv.Intervals]], rest: str) -> dict[str, float]:
    """Average microseconds per step of each layer, each moment counted once, by the first layer active
    then; `rest` gets the moments no layer covers.

    The time of layer k is |layers 0..k| − |layers 0..k−1| inside the steps: the same as subtracting
    higher-priority time first, computed with unions only.
    """
    windows = iv.from_spans((s.start, s.end) for s in steps)
    covered_before = 0.0
    cumulative = iv.EMPTY
    totals = {}
    for name, intervals in layers:
        cumulative = iv.union(cumulative, intervals)
        covered = iv.length_within(cumulative, windows)
        totals[name] = covered - covered_before
        covered_before = covered
    totals[rest] = iv.length(windows) - covered_before
    n = len(steps)
    return {name: us / n for name, us in totals.items()}


def breakdown(steps: list[Step], roles: dict[str, iv.Intervals]) -> dict[str, float]:
    """Average microseconds per step of each role, each moment counted once by priority (`ROLES`)."""
    return exclusive_time(steps, [(role, roles[role]) for role in ROLES[:-1]], "other")


def bound_time(steps: list[Step], roles: dict[str, iv.Intervals], copies: CopyEvents) -> dict[str, float]:
    """Average microseconds per step that each bound holds, each moment counted once, by priority:
    compute (kernels, memsets) > communication > copy (host-to-device copies and the host's waits on them)
    > input (DataLoader) > host (the rest: runtime calls, CPU operators, Python, with the device idle)."""
    copy = iv.union(iv.from_events(list(copies.copies)),
                    iv.from_events(list(copies.sync_waits + copies.pageable_waits)))
    layers = [("compute", iv.union(roles["kernel"], roles["memset"])), ("communication", roles["communication"]),
              ("copy", copy), ("input", roles["dataloader"])]
    return exclusive_time(steps, layers, "host")


def gpu_utilization(trace: Trace, steps: list[Step]) -> dict[int, float]:
    """Per device: union of kernel intervals within the steps / the steps' span (the plugin's definition)."""
    start, end = steps[0].start, steps[-1].end
    if end <= start:
        return {}
    per_device = defaultdict(list)
    for k in trace.kernels:
        d = k.args.device if k.args is not None and k.args.device is not None else k.pid
        per_device[d].append(k)
    return {d: iv.length(iv.from_events(kernels), start, end) / (end - start)
            for d, kernels in per_device.items() if isinstance(d, int)}


def _in_steps(e: Event, steps: list[Step]) -> bool:
    # Steps are sorted and disjoint: find the last one starting at or before the event.
    i = bisect.bisect_right(steps, e.ts, key=_step_start) - 1
    return i >= 0 and e.ts < steps[i].end


def _step_start(s: Step) -> float:
    return s.start


def _in_steps_mask(events: list[Event], steps: list[Step]) -> np.ndarray:
    """Which events start inside a step (the vectorized `_in_steps`, for long event lists)."""
    ts = np.fromiter((e.ts for e in events), float, len(events))
    starts = np.array([s.start for s in steps])
    ends = np.array([s.end for s in steps])
    i = np.searchsorted(starts, ts, side="right") - 1
    return (i >= 0) & (ts < ends[np.clip(i, 0, None)])


@lru_cache(maxsize=None)
def _is_start_up_call(name: str) -> bool:
    return START_UP_CALL.match(name) is not None


@lru_cache(maxsize=None)
def _is_launch_call(name: str) -> bool:
    return LAUNCH_CALL.search(name) is not None


def launching_ops(trace: Trace, correlations: set) -> dict:
    """Correlation id of each runtime call in `correlations` → name of the innermost operator around it
    (user annotations are not operators; a call with no operator around it is left out).

    Matched by time on the calling thread rather than by 'External id', which some Kineto versions
    write as the correlation id (so it names no operator). Operators and runtime calls are both sorted
    by start already (enclosing operators first), so one merge pass per thread with a stack suffices.
    """
    ops_by_thread = defaultdict(list)
    for op in trace.ops:
        if op.cat != "user_annotation":  # '## forward ##', 'Optimizer.step#...': not operators
            ops_by_thread[op.tid].append(op)
    calls_by_thread = defaultdict(list)
    for r in trace.runtime:
        if r.args is not None and r.args.correlation in correlations:
            calls_by_thread[r.tid].append(r)
    out = {}
    for tid, calls in calls_by_thread.items():
        ops = ops_by_thread.get(tid, ())
        stack: list[Event] = []  # enclosing operators, innermost last
        i, n = 0, len(ops)
        for r in calls:
            start = r.ts
            while i < n and ops[i].ts <= start:
                op = ops[i]
                while stack and stack[-1].ts + stack[-1].dur <= op.ts:
                    stack.pop()
                stack.append(op)
                i += 1
            while stack and stack[-1].ts + stack[-1].dur <= start:
                stack.pop()
            if stack:
                out[r.args.correlation] = stack[-1].name
    return out


@dataclass(frozen=True)
class KernelMix:
    """What the step's kernels do: Tensor Core use, matmul work AMP could move, layout conversions."""

    kernel_us: float = 0.0  # per step, communication kernels left out
    tensor_core_share: float | None = None
    eligible_share: float | None = None
    eligible_op_share: float | None = None
    layout_share: float | None = None
    by_name_share: float = 0.0  # kernel time no operator launched, classified by its name


def kernel_mix(trace: Trace, steps: list[Step], vendor: str) -> KernelMix:
    """Shares of the steps' kernel time: on Tensor Cores, eligible for AMP but not on them, layout work.

    A kernel is matmul/convolution work when the innermost operator that launched it is (`ELIGIBLE_OP`),
    or, where no operator launched it (a CUDA graph replay, a compiled region), when its name says so
    (`MATMUL_KERNEL`). Layout conversions (`LAYOUT_KERNEL`) count as layout work even under a convolution:
    AMP does not remove them. Eligible share differs from the plugin's ratio on purpose: it counts only
    the eligible kernels that did *not* use Tensor Cores (what AMP could still move); the plugin's figure
    (all kernels of eligible ops) is `eligible_op_share`. Without a Tensor Core table for the vendor, the
    Tensor Core and eligible shares are unknown (None), not zero.
    """
    kernels = [k for k in trace.kernels if _in_steps(k, steps) and not _is_communication_kernel(k.name)]
    total = sum(k.dur for k in kernels)
    if not total:
        return KernelMix()
    op_of = launching_ops(trace, {k.args.correlation for k in kernels if k.args is not None})
    tc = eligible_left = eligible_all = layout = by_name = 0.0
    for k in kernels:
        on_tc = _is_tensor_core(vendor, k.name)
        if on_tc:
            tc += k.dur
        op = op_of.get(k.correlation)
        if op is None:
            by_name += k.dur
        eligible = _is_matmul_kernel(k.name) if op is None else _is_eligible_op(op)
        if eligible:
            eligible_all += k.dur
        if _is_layout_kernel(k.name):
            layout += k.dur
        elif eligible and not on_tc:
            eligible_left += k.dur
    known = vendor in _TC_REGEX
    return KernelMix(
        kernel_us=total / len(steps),
        tensor_core_share=tc / total if known else None,
        eligible_share=eligible_left / total if known else None,
        eligible_op_share=eligible_all / total,
        layout_share=layout / total,
        by_name_share=by_name / total,
    )


def _copy_kind(name: str) -> str | None:
    if HTOD not in name:
        return None
    if "Pageable" in name:
        return "pageable"
    if "Pinned" in name:
        return "pinned"
    return "unknown"


@dataclass(frozen=True)
class CopyEvents:
    """The steps' host-to-device copies and the runtime calls in which the host waited for them."""

    copies: tuple[Event, ...] = ()  # device-side copies inside the steps
    sync_waits: tuple[Event, ...] = ()  # blocking copy calls, synchronizes right after async copy calls
    pageable_waits: tuple[Event, ...] = ()  # async copy calls from pageable memory (the host stages the data)
    blocked: int = 0  # copy calls the host waited on, in all


def copy_events(trace: Trace, steps: list[Step]) -> CopyEvents:
    """Host-to-device copies in the steps, and where the host blocked on them.

    The host blocks on a copy inside a blocking memcpy call, inside an async copy call from pageable
    memory (the driver stages the data through a pinned buffer before the call returns: the call lasts
    about as long as the copy), and in a synchronize that directly follows the async copy call on the same
    thread (what `.to(device)` does without non_blocking).
    """
    kind_by_corr = {}
    copies = []
    for c in trace.memcpys:
        kind = _copy_kind(c.name)
        if kind is None:
            continue
        if c.correlation is not None:
            kind_by_corr[c.correlation] = kind
        if _in_steps(c, steps):
            copies.append(c)
    sync_waits, pageable_waits = [], []
    blocked = 0
    by_thread = defaultdict(list)
    for r in trace.runtime:
        by_thread[r.tid].append(r)
    for calls in by_thread.values():
        for i, r in enumerate(calls):
            kind = kind_by_corr.get(r.correlation)
            if kind is None or not _in_steps(r, steps):
                continue
            if "Async" not in r.name:
                sync_waits.append(r)
                blocked += 1
                continue
            synchronized = i + 1 < len(calls) and SYNC_CALL.search(calls[i + 1].name) is not None
            if synchronized:
                sync_waits.append(calls[i + 1])
            if kind == "pageable":
                pageable_waits.append(r)
            blocked += synchronized or kind == "pageable"
    return CopyEvents(tuple(copies), tuple(sync_waits), tuple(pageable_waits), blocked)


def host_to_device_copies(events: CopyEvents, steps: list[Step], kernel_intervals: iv.Intervals) -> Copies:
    """Host-to-device copy time by host memory kind, bytes, the host's waits and kernel overlap, per step."""
    n = len(steps)
    per_kind = defaultdict(float)
    byte_total, byte_known = 0.0, True
    for c in events.copies:
        per_kind[_copy_kind(c.name)] += c.dur
        if c.args is not None and c.args.bytes is not None:
            byte_total += c.args.bytes
        else:
            byte_known = False
    merged = iv.from_events(list(events.copies))
    copy_time = iv.length(merged)
    overlap = iv.overlap(merged, kernel_intervals) / copy_time if copy_time else None
    windows = iv.from_spans((s.start, s.end) for s in steps)
    busy = iv.union(merged, iv.from_events(list(events.sync_waits + events.pageable_waits)))
    exposed = iv.length_within(iv.union(busy, kernel_intervals), windows) - iv.length_within(kernel_intervals, windows)
    count = len(events.copies)
    return Copies(
        pageable_us=per_kind["pageable"] / n,
        pinned_us=per_kind["pinned"] / n,
        unknown_us=per_kind["unknown"] / n,
        count=count / n,
        bytes=(byte_total / n) if count and byte_known else None,
        synchronous=events.blocked / n,
        sync_wait_us=sum(r.dur for r in events.sync_waits) / n,
        pageable_wait_us=sum(r.dur for r in events.pageable_waits) / n,
        overlap_with_kernels=overlap,
        exposed_us=max(exposed, 0.0) / n,
    )


TIMELINE_POINTS = 400


def downsample_max(times: list[float], values: list[float], points: int = TIMELINE_POINTS,
                   ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """At most `points` samples: the maximum of each equal-time bucket (peaks are what matter)."""
    if len(times) <= points:
        return tuple(times), tuple(values)
    start, end = times[0], times[-1]
    width = (end - start) / points or 1.0
    best: dict[int, tuple[float, float]] = {}
    for t, v in zip(times, values):
        b = min(int((t - start) / width), points - 1)
        if b not in best or v > best[b][1]:
            best[b] = (t, v)
    kept = [best[b] for b in sorted(best)]
    return tuple(t for t, _ in kept), tuple(v for _, v in kept)


def memory_peaks(trace: Trace, devices: list[Device]) -> list[DeviceMemory]:
    """Peak allocated/reserved per device from `[memory]` events, against the device's capacity."""
    capacity = {d.index: d.total_memory for d in devices}
    grouped = defaultdict(list)
    for m in trace.memory:
        grouped[(m.device_type, m.device_id)].append(m)
    out = []
    for (dtype, did), samples in sorted(grouped.items()):
        name = "cpu" if dtype == 0 else f"cuda:{did}" if dtype == 1 else f"device{dtype}:{did}"
        samples.sort(key=lambda m: m.ts)
        allocated = [m.total_allocated for m in samples if m.total_allocated is not None]
        reserved = [m.total_reserved for m in samples if m.total_reserved is not None]
        growth = None
        if allocated:
            series = [(m.ts, m.total_allocated) for m in samples if m.total_allocated is not None]
        else:
            # Net allocations since the trace began. Frees of memory allocated before it make the sum dip
            # below zero: the growth is the largest rise above the lowest point so far, and the timeline
            # counts from the lowest point, so neither is ever negative.
            running = lowest = growth = 0.0
            series = []
            for m in samples:
                running += m.bytes
                lowest = min(lowest, running)
                growth = max(growth, running - lowest)
                series.append((m.ts, running))
            series = [(t, v - lowest) for t, v in series]
        t0 = samples[0].ts
        times, values = downsample_max([(t - t0) / 1000 for t, _ in series], [v for _, v in series])
        out.append(DeviceMemory(
            device=name,
            peak_allocated=max(allocated) if allocated else None,
            peak_reserved=max(reserved) if reserved else None,
            capacity=capacity.get(did) if dtype != 0 else None,
            growth=growth,
            timeline_ms=times,
            timeline_bytes=values,
        ))
    return out


# --- what bounds the step ---------------------------------------------------------------------------

COMPUTE_BOUND = 0.60  # kernels busy this share of the step: compute binds; below, the largest idle cause
CPU_INPUT_BOUND = 0.30  # CPU-only: the DataLoader share above which the input pipeline binds
MEMORY_NEARLY_GONE = 0.05  # headroom below this share of device memory
MIN_EVENTS_PER_STEP = 10  # a forward, backward and optimizer step record dozens
START_UP_SHARE = 0.50
OWN_PROCESS_SHARE = 0.50
LEAK_BYTES_PER_STEP = 1 << 20  # growth below 1 MiB a step is allocator noise, not a leak
LEAK_R2 = 0.9
DRY_WAIT = 0.20  # a step that waited this share of the median step on the loader found its queue empty


def memory_leak(trial: dict | None) -> dict | None:
    """The trial's memory growth when it is a leak (about the same rise every step), else None."""
    growth = ((trial or {}).get("summary") or {}).get("memory_growth") or {}
    per_step = growth.get("bytes_per_step") or 0.0
    median_diff = growth.get("median_difference_bytes") or 0.0
    # A leak grows by about the same amount every step; a one-off jump (optimizer state created on the
    # first step) has a slope but no typical step-to-step difference.
    if per_step < LEAK_BYTES_PER_STEP or median_diff < LEAK_BYTES_PER_STEP / 2 or (growth.get("r2") or 0) < LEAK_R2:
        return None
    return growth


def memory_pressure(trial: dict | None, memory: list[DeviceMemory]) -> str | None:
    """Why memory binds (out of memory, headroom nearly gone, a leak), or None."""
    if (trial or {}).get("status") == "oom":
        return "the trial ran out of memory"
    steps = ((trial or {}).get("summary") or {}).get("accumulation_steps")
    if steps not in (None, 1):
        return f"the batch runs as {steps} micro-batches with gradient accumulation to fit in memory"
    for m in memory:
        if m.device != "cpu" and m.headroom is not None and m.headroom < MEMORY_NEARLY_GONE:
            return (f"peak memory {m.peak_allocated / 1e9:.2f} GB of {m.capacity / 1e9:.1f} GB on {m.device} "
                    f"({100 * m.headroom:.1f}% free)")
    leak = memory_leak(trial)
    if leak is not None:
        return (f"memory grows {leak['bytes_per_step'] / 2**20:.1f} MiB per step: the run ends out of memory "
                "however much there is")
    return None


def degenerate(trace: Trace, steps: list[Step]) -> str | None:
    """Why the steps cannot describe training (too few events, events of another process, start-up calls),
    or None. A degenerate trace gets figures but no bound and no speed advice."""
    windows = [(s.start, s.end) for s in steps]
    host_events = trace.ops + trace.runtime
    device_events = trace.kernels + trace.memcpys + trace.memsets
    host_mask = _in_steps_mask(host_events, steps)
    count = int(host_mask.sum()) + int(_in_steps_mask(device_events, steps).sum())
    if count < MIN_EVENTS_PER_STEP * len(steps):
        return (f"only {count} events inside {len(steps)} step(s): too few to say what a step does "
                "(a forward, backward and optimizer step record dozens)")
    own = {e.pid for e in trace.steps}
    if own and {e.pid for e in host_events} - own:  # some host events come from another process
        pids = [e.pid for e, inside in zip(host_events, host_mask) if inside]
        mine = sum(1 for pid in pids if pid in own)
        if mine < OWN_PROCESS_SHARE * len(pids):
            others = sorted({str(pid) for pid in pids if pid not in own})
            return (f"{len(pids) - mine} of the {len(pids)} host events inside the steps come from process "
                    f"{', '.join(others[:3])}, not from the steps' process {', '.join(sorted(map(str, own)))}: "
                    "the figures would describe another process")
    total = sum(b - a for a, b in windows)
    start_up = [e for e in trace.runtime if _is_start_up_call(e.name) and _in_steps(e, steps)]
    start_up_us = iv.length_within(iv.from_events(start_up), iv.from_spans(windows))
    if total and start_up_us >= START_UP_SHARE * total:
        names = sorted({e.name for e in start_up})
        return (f"{100 * start_up_us / total:.0f}% of the step is in start-up calls ({', '.join(names[:4])}): "
                "this is a process starting, not a training step; profile steps after the first")
    return None


def _loader_workers(trial: dict) -> tuple[int, int]:
    """(num_workers, prefetch_factor) the trial's first DataLoader ran with."""
    loaders = trial.get("dataloaders") or []
    effective = (loaders[0].get("effective") if loaders else None) or {}
    knobs, user = trial.get("knobs") or {}, trial.get("user_values") or {}
    workers = next((v for v in (effective.get("num_workers"), knobs.get("num_workers"), user.get("num_workers"))
                    if v is not None), 0)
    prefetch = next((v for v in (effective.get("prefetch_factor"), knobs.get("prefetch_factor"),
                                 user.get("prefetch_factor")) if v is not None), 2)
    return int(workers or 0), int(prefetch or 2)


def loader_queue(trial: dict | None, trace: Trace, steps: list[Step], dataloader: iv.Intervals,
                 window_share: float) -> tuple[Finding | None, float | None]:
    """Whether the profiled window hid a loader limit behind batches the workers had queued earlier.

    With worker processes, a loader that keeps up is never waited for once its queue has filled; a step
    that waits long (≥ DRY_WAIT of the median step) found the queue empty, so the workers produce more
    slowly than the step consumes: the loader binds, on average, even if most steps of a short window were
    fed from the queue. Waits come from the trial record (wall − call per step, the first step left out:
    it starts the workers) or, without one, from the trace's DataLoader time per step. The share of time
    waiting from the first dry step on estimates the steady state; it is returned when it exceeds the
    window's share. A trial whose steps could all have come from the queue filled at the start says so.
    """
    waits, walls, where = [], [], "trace"
    workers = prefetch = 0
    if trial and trial.get("steps"):
        workers, prefetch = _loader_workers(trial)
        if workers:
            later = [s for s in trial["steps"][1:] if s.get("wall_s") is not None and s.get("call_s") is not None]
            waits = [max(0.0, s["wall_s"] - s["call_s"]) for s in later]
            walls = [s["wall_s"] for s in later]
            where = "trial"
    elif any(e.name.startswith("enumerate(DataLoader)#_MultiProcessing") for e in trace.ops):
        waits = [iv.length(dataloader, s.start, s.end) for s in steps]
        walls = [s.duration for s in steps]
    if len(waits) < 2 or not sum(walls):
        return None, None
    threshold = DRY_WAIT * median(walls)
    dry = [i for i, w in enumerate(waits) if w >= threshold]
    scope = "the trial's steps after the first" if where == "trial" else "the profiled steps"
    if dry and len(dry) < len(waits):
        first = dry[0]
        if not sum(walls[first:]):
            return None, None
        share = sum(waits[first:]) / sum(walls[first:])
        if share < window_share + 0.05:
            return None, None
        draining = len(waits) >= 3 and waits[-3] < waits[-2] < waits[-1] and dry[-1] == len(waits) - 1
        pattern = "the wait grows step after step: the queue is draining" if draining else (
            f"{len(dry)} of {len(waits)} steps waited {max(waits) / 1000:.1f} ms at most, the others "
            f"{median(waits) / 1000:.1f} ms or less")
        return Finding("loader-queue",
                       f"the DataLoader's queue ran dry during {scope} ({pattern}): the workers produce batches "
                       f"more slowly than the step uses them, so the loader binds; from the first dry step on "
                       f"the step waited {100 * share:.0f}% of the time, against {100 * window_share:.1f}% "
                       "averaged over the profiled window", share), share
    if where == "trial" and not dry and len(trial["steps"]) <= workers * prefetch + 1:
        return Finding("loader-window",
                       f"all {len(trial['steps'])} steps of the trial could have come from the {workers * prefetch} "
                       f"batches {workers} workers queue at the start (prefetch_factor {prefetch}): the DataLoader "
                       "share does not show whether the loader keeps up; profile more steps"), None
    return None, None


def _share(x: float) -> str:
    """A share of the step as evidence reads it: '97%', or '0.4%' below ten percent."""
    return f"{100 * x:.0f}%" if x >= 0.1 else f"{100 * x:.1f}%"


def find_bound(platform: str, shares: dict[str, float], problem: str | None, memory: str | None,
               loader: Finding | None) -> tuple[str | None, tuple[str, ...]]:
    """The key of BOUNDS that bounds the step, with one-line reasons, or (None, reasons) when the figures
    cannot say.

    - "memory" when the trial ran out of memory, ran micro-batches to fit, device headroom is under
      MEMORY_NEARLY_GONE, or memory grows every step (a leak): memory decides whether the run goes on at
      all, whatever the trace shows.
    - None when the trace is degenerate (`degenerate`): no other bound can be read from it.
    - CPU-only traces: "input" when the DataLoader holds at least CPU_INPUT_BOUND of the step, else
      "compute" (the CPU computing the step is all that is left).
    - Accelerators, from `bound_time` (each moment once: compute > communication > copy > input > host):
      "compute" when kernels keep the device busy at least COMPUTE_BOUND of the step; otherwise the
      largest reason the device idles: "input" (waiting on the DataLoader; over the trial's steps once
      its queue ran dry, when the window hid it, see `loader_queue`), "copy" (host-to-device copies and
      the host's waits on them, including synchronous pageable copies), "host" (runtime calls, CPU
      operators and Python with the device idle: launch overhead) or "communication" (collectives not
      overlapped with compute).
    """
    if memory is not None:
        return "memory", (memory,)
    if problem is not None:
        return None, (problem,)
    input_share = shares.get("input", 0.0)
    loader_line = (loader.message,) if loader is not None and loader.code == "loader-queue" else ()
    waiting = f"{_share(input_share)} of the step waiting on the DataLoader"
    if platform == "cpu":
        if input_share >= CPU_INPUT_BOUND:
            return "input", (waiting,) + loader_line
        return "compute", (f"the CPU computes the step; the DataLoader holds {_share(input_share)} of it",)
    device = "GPU" if platform == "gpu" else platform.upper()
    compute = shares.get("compute", 0.0)
    busy = f"kernels keep the {device} busy {_share(compute)} of the step"
    if compute >= COMPUTE_BOUND:
        return "compute", (busy,)
    reasons = {
        "input": waiting,
        "copy": f"{_share(shares.get('copy', 0.0))} of the step in host-to-device copies and the host's waits "
                "on them, with no kernel running",
        "host": f"{_share(shares.get('host', 0.0))} of the step on the host (runtime calls, CPU operators, "
                f"Python) with the {device} idle",
        "communication": f"{_share(shares.get('communication', 0.0))} of the step in communication not "
                         "overlapped with compute",
    }
    bound = max(reasons, key=lambda b: shares.get(b, 0.0))
    idle = f"kernels keep the {device} busy only {_share(compute)} of the step"
    return bound, (reasons[bound], idle) + (loader_line if bound == "input" else ())


def host_figures(trace: Trace, steps: list[Step]) -> dict:
    """Launch and optimizer figures per step: kernel launches, kernels, CUDA graph launches, and the
    optimizer's step (class, host time, implementation: fused, foreach or a per-parameter loop)."""
    n = len(steps)
    calls = [r for r in trace.runtime if _is_launch_call(r.name)]
    launches = [r for r, inside in zip(calls, _in_steps_mask(calls, steps)) if inside]
    out = {
        "launches_per_step": len(launches) / n,
        "kernels_per_step": int(_in_steps_mask(trace.kernels, steps).sum()) / n,
        "graph_launches_per_step": sum(1 for r in launches if "Graph" in r.name) / n,
    }
    spans = [e for e in trace.ops if e.name.startswith("Optimizer.step#") and OPTIMIZER_STEP.match(e.name)
             and _in_steps(e, steps)]
    if spans:
        starts = [op.ts for op in trace.ops]  # sorted: operators are sorted by start
        inside = [op.name for span in spans
                  for op in trace.ops[bisect.bisect_left(starts, span.ts):bisect.bisect_right(starts, span.end)]
                  if op.tid == span.tid and op.end <= span.end and op is not span]
        name = OPTIMIZER_STEP.match(spans[0].name).group(1)
        if "Fused" in name or any("_fused_" in o for o in inside):
            implementation = "fused"
        elif any("_foreach_" in o for o in inside):
            implementation = "foreach"
        else:
            implementation = "for-loop"
        out["optimizer"] = {"name": name, "us_per_step": sum(e.dur for e in spans) / n,
                            "implementation": implementation}
    return out


def _primary_devices(trace: Trace, utilization: dict[int, float]) -> list[Device]:
    used = trace.used_devices
    return sorted(used, key=lambda d: -utilization.get(d.index, 0.0))


def platform_of(trace: Trace) -> str:
    """'gpu' for device activity in the CUDA vocabulary (CUDA, ROCm), another accelerator's own name
    ('mtia') for activity or runtime in its categories, 'cpu' when the trace shows no accelerator."""
    if trace.gpu_vocabulary:
        return "gpu"
    return trace.accelerator or "cpu"


def diagnose(trace: Trace, steps_wanted: str | None = None, trial: dict | None = None) -> Diagnosis:
    """Compute every figure for one trace. Pure: the same trace gives the same Diagnosis."""
    steps, note = find_steps(trace)
    if steps_wanted:
        chosen = select_steps(steps, steps_wanted)
        if not chosen:
            from advisor.errors import AdvisorError

            names = ", ".join(s.name for s in steps[:10]) + (f" and {len(steps) - 10} more" if len(steps) > 10 else "")
            raise AdvisorError(f"{trace.path}: --steps {steps_wanted}: no such steps (it has {names})")
        steps = chosen
    roles = role_intervals(trace)
    shares = breakdown(steps, roles)
    step_time = sum(s.duration for s in steps) / len(steps)
    wait = iv.length_within(roles["dataloader"], iv.from_spans((s.start, s.end) for s in steps)) / len(steps)
    platform = platform_of(trace)
    utilization = gpu_utilization(trace, steps) if trace.kernels else {}
    devices = _primary_devices(trace, utilization)
    vendor = devices[0].vendor if devices else "unknown"
    mix = kernel_mix(trace, steps, vendor)
    copy_activity = copy_events(trace, steps)
    copies = host_to_device_copies(copy_activity, steps, roles["kernel"])
    memory = memory_peaks(trace, trace.devices)
    dataloader_share = shares["dataloader"] / step_time if step_time else 0.0
    missing = []
    if note.startswith("no ProfilerStep"):
        missing.append("ProfilerStep# spans (the whole trace is one step)")
    accelerator = platform != "cpu"
    name = "GPU" if platform == "gpu" else platform.upper()
    if accelerator and not any(d.described for d in trace.devices):
        known = (f"; vendor ({devices[0].vendor}) and architecture from kernel names"
                 if devices and devices[0].vendor != platform else "")
        missing.append(f"deviceProperties (device name, memory capacity and compute capability unknown{known})")
    if platform == "gpu" and trace.kernels and mix.tensor_core_share is None:
        missing.append("a known GPU vendor: Tensor Core use and matmul work AMP could move are unknown")
    if accelerator and platform != "gpu":
        missing.append(f"{name} kernel names that say which kernels use matrix units: their share and the "
                       "work mixed precision could move are unknown, so no AMP advice")
        missing.append(f"host-to-device copies named by direction and host memory ({name} copies are not): copy "
                       "figures unknown, so no pin_memory/non_blocking advice")
    for m in memory:
        if m.peak_allocated is not None and m.capacity and m.peak_allocated > m.capacity:
            missing.append(f"a memory capacity above the peak: {m.device} peaked at {m.peak_allocated / 1e9:.2f} GB "
                           f"of {m.capacity / 1e9:.2f} GB, so one of them is wrong and headroom is unknown")
    if accelerator and not any(m.peak_allocated is not None for m in memory if m.device != "cpu"):
        missing.append("[memory] events with 'Total Allocated' (profile_memory=True): peak memory and headroom "
                       "unknown")
    if accelerator and not trace.runtime:
        missing.append("runtime events: steps cannot be matched to the kernels they launched")
    if not roles["dataloader"][0].size:
        missing.append("DataLoader spans (enumerate(DataLoader)#...__next__): data loading time unknown")
    extra = {"median_step_us": median(s.duration for s in steps), "events": trace.event_count,
             "kernels_by_name_share": mix.by_name_share}
    if platform == "cpu":
        matmul_spans = iv.from_events([op for op in trace.ops if _is_eligible_op(op.name)])
        windows = iv.from_spans((s.start, s.end) for s in steps)
        span = iv.length(windows)
        extra["cpu_eligible_share"] = iv.length_within(matmul_spans, windows) / span if span else None
    else:
        extra.update(host_figures(trace, steps))
    main = utilization.get(devices[0].index) if devices and utilization else None
    if main is None and utilization:
        main = max(utilization.values())
    # What bounds the step.
    if platform == "cpu":
        bound_shares = {"input": dataloader_share, "compute": 1.0 - dataloader_share}
    else:
        bound_shares = {b: us / step_time if step_time else 0.0 for b, us in
                        bound_time(steps, roles, copy_activity).items()}
    loader, steady = loader_queue(trial, trace, steps, roles["dataloader"], dataloader_share)
    if steady is not None:
        # Time the window credited elsewhere (the host, mostly) was, in steady state, spent waiting.
        others = [b for b in bound_shares if b != "input"]
        rest = sum(bound_shares[b] for b in others)
        scale = (1.0 - steady) / rest if rest else 0.0
        bound_shares = {b: steady if b == "input" else v * scale for b, v in bound_shares.items()}
    elif loader is not None:
        missing.append("a window long enough to see the DataLoader keep up or not: " + loader.message)
    problem = degenerate(trace, steps)
    if problem is not None:
        missing.append("steps that describe training: " + problem)
        extra["degenerate"] = problem
    bound, evidence = find_bound(platform, bound_shares, problem, memory_pressure(trial, memory), loader)
    return Diagnosis(
        source=trace.path,
        platform=platform,
        devices=tuple(devices),
        steps=tuple(steps),
        step_note=note,
        step_time_us=step_time,
        breakdown_us=shares,
        dataloader_share=dataloader_share,
        dataloader_wait_share=wait / step_time if step_time else 0.0,
        copies=copies,
        kernel_us=mix.kernel_us,
        tensor_core_share=mix.tensor_core_share,
        eligible_share=mix.eligible_share,
        eligible_op_share=mix.eligible_op_share,
        gpu_utilization=main,
        utilization_by_device=utilization,
        memory=tuple(memory),
        missing=tuple(missing),
        layout_share=mix.layout_share,
        bound=bound,
        bound_evidence=evidence,
        bound_shares=bound_shares,
        loader_steady_share=steady,
        distributed=trace.distributed,
        trial=trial,
        findings=((loader,) if loader is not None else ()) + tuple(
            Finding("skipped-events", f"{count} {reason} left out of the analysis")
            for reason, count in trace.skipped.items()),
        skipped_events=tuple(trace.skipped.items()),
        extra=extra,
    )

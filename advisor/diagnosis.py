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

from advisor import intervals as iv
from advisor.trace import Device, Event, Trace

# Priority order of the step-time breakdown: each moment of a step is counted once, by the first role
# active at that moment (the plugin's scheme).
ROLES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_op", "other")

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


@lru_cache(maxsize=None)
def _is_communication_kernel(name: str) -> bool:
    return COMMUNICATION_KERNEL.match(name) is not None


@lru_cache(maxsize=None)
def _is_tensor_core(vendor: str, kernel_name: str) -> bool:
    regex = _TC_REGEX.get(vendor)
    return regex is not None and regex.search(kernel_name) is not None


@lru_cache(maxsize=None)
def _is_eligible_op(op_name: str) -> bool:
    return ELIGIBLE_OP.match(op_name) is not None


def tensor_core_families(kernel_name: str) -> list[str]:
    """Every Tensor Core / matrix core family whose pattern matches a kernel name (often more than one)."""
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
    sync_wait_us: float = 0.0  # host time blocked in those waits, per step
    overlap_with_kernels: float | None = None  # share of copy time that ran alongside a kernel

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
    # bucket's maximum so that peaks survive; cumulative allocations when the trace records no totals.
    timeline_ms: tuple[float, ...] = ()
    timeline_bytes: tuple[float, ...] = ()

    @property
    def headroom(self) -> float | None:
        """1 − peak allocated / capacity (allocated, not reserved: the caching allocator can release)."""
        if self.peak_allocated is None or not self.capacity:
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
    distributed: dict | None = None
    trial: dict | None = None  # the trial.json beside the trace, when it came from `advisor profile`
    findings: tuple[Finding, ...] = ()
    recommendations: tuple = ()  # filled by advisor.rules.recommend, kept here for the report and API
    extra: dict = field(default_factory=dict)

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
    spans = trace.ops or trace.runtime or trace.kernels or trace.memcpys
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


def select_steps(steps: list[Step], wanted: str | None) -> list[Step]:
    """Keep the ProfilerStep numbers named by `wanted` ('3-5', '2,4', '7'); all when None."""
    if not wanted:
        return steps
    numbers: set[int] = set()
    for part in wanted.split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-", 1)
            numbers.update(range(int(a), int(b) + 1))
        elif part:
            numbers.add(int(part))
    return [s for s in steps if s.name.startswith("ProfilerStep#") and int(s.name.split("#")[1]) in numbers]


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


def breakdown(steps: list[Step], roles: dict[str, iv.Intervals]) -> dict[str, float]:
    """Average microseconds per step of each role, each moment counted once by priority.

    The time of role k is |roles 0..k| − |roles 0..k−1| inside the steps: the same as subtracting
    higher-priority time first, computed with unions only.
    """
    windows = iv.from_spans((s.start, s.end) for s in steps)
    covered_before = 0.0
    cumulative = iv.EMPTY
    totals = {}
    for role in ROLES[:-1]:
        cumulative = iv.union(cumulative, roles[role])
        covered = iv.length_within(cumulative, windows)
        totals[role] = covered - covered_before
        covered_before = covered
    totals["other"] = iv.length(windows) - covered_before
    n = len(steps)
    return {role: us / n for role, us in totals.items()}


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


def launching_ops(trace: Trace, correlations: set) -> dict:
    """Correlation id of each runtime call in `correlations` → name of the innermost operator around it.

    Matched by time on the calling thread rather than by 'External id', which some Kineto versions
    write as the correlation id (so it names no operator). Operators and runtime calls are both sorted
    by start already (enclosing operators first), so one merge pass per thread with a stack suffices.
    """
    ops_by_thread = defaultdict(list)
    for op in trace.ops:
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


def tensor_cores(trace: Trace, steps: list[Step], vendor: str) -> tuple[float, float | None, float | None, float]:
    """(kernel µs, Tensor Core share, eligible-not-on-TC share, eligible-op share) of kernel time in steps.

    Eligible share differs from the plugin's ratio on purpose: it counts only the eligible operators'
    kernels that did *not* use Tensor Cores (what AMP could still move); the plugin's figure (all kernels
    of eligible ops) is `eligible_op_share`.
    """
    kernels = [k for k in trace.kernels if _in_steps(k, steps) and not _is_communication_kernel(k.name)]
    total = sum(k.dur for k in kernels)
    if not total:
        return 0.0, None, None, None
    op_of = launching_ops(trace, {k.args.correlation for k in kernels if k.args is not None})
    tc = eligible_left = eligible_all = linked = 0.0
    for k in kernels:
        on_tc = _is_tensor_core(vendor, k.name)
        if on_tc:
            tc += k.dur
        op = op_of.get(k.correlation)
        if op is None:
            continue
        linked += k.dur
        if _is_eligible_op(op):
            eligible_all += k.dur
            if not on_tc:
                eligible_left += k.dur
    share = tc / total if vendor in _TC_REGEX else None
    if linked < 0.5 * total:  # too few kernels traced back to an operator to say what AMP could move
        return total / len(steps), share, None, None
    return total / len(steps), share, eligible_left / linked, eligible_all / linked


def _copy_kind(name: str) -> str | None:
    if HTOD not in name:
        return None
    if "Pageable" in name:
        return "pageable"
    if "Pinned" in name:
        return "pinned"
    return "unknown"


def host_to_device_copies(trace: Trace, steps: list[Step], kernel_intervals: iv.Intervals) -> Copies:
    """Host-to-device copy time by host memory kind, bytes, synchronous copies and kernel overlap."""
    n = len(steps)
    step_spans = [(s.start, s.end) for s in steps]
    per_kind = defaultdict(float)
    count = 0
    byte_total, byte_known = 0.0, True
    copy_spans = []
    htod_corr = set()
    for c in trace.memcpys:
        kind = _copy_kind(c.name)
        if kind is None:
            continue
        if c.correlation is not None:
            htod_corr.add(c.correlation)
        if not _in_steps(c, steps):
            continue
        per_kind[kind] += c.dur
        count += 1
        copy_spans.append(c)
        if c.args is not None and c.args.bytes is not None:
            byte_total += c.args.bytes
        else:
            byte_known = False
    # A copy is synchronous when the host blocks on it: a blocking memcpy call, or a synchronize that
    # directly follows the async copy call on the same thread (what `.to(device)` does without non_blocking).
    sync_count, sync_wait = 0, 0.0
    by_thread = defaultdict(list)
    for r in trace.runtime:
        by_thread[r.tid].append(r)
    for calls in by_thread.values():
        for i, r in enumerate(calls):
            if r.correlation not in htod_corr or not any(s0 <= r.ts < s1 for s0, s1 in step_spans):
                continue
            if "Async" not in r.name:
                sync_count += 1
                sync_wait += r.dur
            elif i + 1 < len(calls) and SYNC_CALL.search(calls[i + 1].name):
                sync_count += 1
                sync_wait += calls[i + 1].dur
    merged = iv.from_events(copy_spans)
    copy_time = iv.length(merged)
    overlap = iv.overlap(merged, kernel_intervals) / copy_time if copy_time else None
    return Copies(
        pageable_us=per_kind["pageable"] / n,
        pinned_us=per_kind["pinned"] / n,
        unknown_us=per_kind["unknown"] / n,
        count=count / n,
        bytes=(byte_total / n) if count and byte_known else None,
        synchronous=sync_count / n,
        sync_wait_us=sync_wait / n,
        overlap_with_kernels=overlap,
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
            running = peak = 0.0
            series = []
            for m in samples:
                running += m.bytes
                peak = max(peak, running)
                series.append((m.ts, running))
            growth = peak
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


def _primary_devices(trace: Trace, utilization: dict[int, float]) -> list[Device]:
    used = trace.used_devices
    return sorted(used, key=lambda d: -utilization.get(d.index, 0.0))


def diagnose(trace: Trace, steps_wanted: str | None = None, trial: dict | None = None) -> Diagnosis:
    """Compute every figure for one trace. Pure: the same trace gives the same Diagnosis."""
    steps, note = find_steps(trace)
    if steps_wanted:
        chosen = select_steps(steps, steps_wanted)
        if not chosen:
            from advisor.errors import AdvisorError

            names = ", ".join(s.name for s in steps)
            raise AdvisorError(f"--steps {steps_wanted}: no such steps in {trace.path} (it has {names})")
        steps = chosen
    roles = role_intervals(trace)
    shares = breakdown(steps, roles)
    step_time = sum(s.duration for s in steps) / len(steps)
    wait = iv.length_within(roles["dataloader"], iv.from_spans((s.start, s.end) for s in steps)) / len(steps)
    platform = "gpu" if trace.has_device_activity else "cpu"
    utilization = gpu_utilization(trace, steps) if trace.kernels else {}
    devices = _primary_devices(trace, utilization)
    vendor = devices[0].vendor if devices else "unknown"
    kernel_us, tc_share, eligible, eligible_ops = tensor_cores(trace, steps, vendor)
    copies = host_to_device_copies(trace, steps, roles["kernel"])
    memory = memory_peaks(trace, trace.devices)
    missing = []
    if note.startswith("no ProfilerStep"):
        missing.append("ProfilerStep# spans (the whole trace is one step)")
    if platform == "gpu" and not any(d.described for d in trace.devices):
        missing.append("deviceProperties (device name, memory capacity and compute capability unknown)")
    if platform == "gpu" and not any(m.peak_allocated is not None for m in memory if m.device != "cpu"):
        missing.append("[memory] events with 'Total Allocated' (profile_memory=True): peak memory and headroom "
                       "unknown")
    if platform == "gpu" and not trace.runtime:
        missing.append("runtime events: steps cannot be matched to the kernels they launched")
    if not roles["dataloader"][0].size:
        missing.append("DataLoader spans (enumerate(DataLoader)#...__next__): data loading time unknown")
    extra = {"median_step_us": median(s.duration for s in steps), "events": trace.event_count}
    if platform == "cpu":
        matmul_spans = iv.from_events([op for op in trace.ops if _is_eligible_op(op.name)])
        windows = iv.from_spans((s.start, s.end) for s in steps)
        extra["cpu_eligible_share"] = iv.length_within(matmul_spans, windows) / iv.length(windows)
    main = utilization.get(devices[0].index) if devices and utilization else None
    if main is None and utilization:
        main = max(utilization.values())
    return Diagnosis(
        source=trace.path,
        platform=platform,
        devices=tuple(devices),
        steps=tuple(steps),
        step_note=note,
        step_time_us=step_time,
        breakdown_us=shares,
        dataloader_share=shares["dataloader"] / step_time if step_time else 0.0,
        dataloader_wait_share=wait / step_time if step_time else 0.0,
        copies=copies,
        kernel_us=kernel_us,
        tensor_core_share=tc_share,
        eligible_share=eligible,
        eligible_op_share=eligible_ops,
        gpu_utilization=main,
        utilization_by_device=utilization,
        memory=tuple(memory),
        missing=tuple(missing),
        distributed=trace.distributed,
        trial=trial,
        extra=extra,
    )

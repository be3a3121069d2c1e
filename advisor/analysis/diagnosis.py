"""Trace → Diagnosis: the figures of docs/figures.md, assembled.

Each figure is computed by the module named for it — steps, breakdown, kernels (Tensor Cores), copies,
launches, memory, bound — as pure functions over the parsed trace; `diagnose` calls them in turn and
gathers what they found, and what the trace lacks, into one `Diagnosis`. Where a definition follows the
deprecated TensorBoard profiler plugin (so results compare with it), the function says so; where it
deliberately differs, the docstring says how and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

from advisor.analysis import intervals as iv
from advisor.analysis.attention import attention
from advisor.analysis.bound import bound_time, find_bound, loader_queue, why_degenerate
from advisor.analysis.breakdown import breakdown, gpu_utilization, role_intervals
from advisor.analysis.communication import Communication, communication
from advisor.analysis.copy_times import Copies, copy_events, host_to_device_copies
from advisor.analysis.devices import Device
from advisor.analysis.findings import Finding
from advisor.analysis.kernels import conv_shapes_constant, is_conv_op, is_eligible_op, kernel_mix
from advisor.analysis.launches import host_figures
from advisor.analysis.memory_peaks import DeviceMemory, memory_peaks, memory_pressure
from advisor.analysis.steps import NO_STEP_SPANS, Step, find_steps, select_steps
from advisor.analysis.timeline import step_timelines
from advisor.analysis.trace import Trace
from advisor.errors import AdvisorError


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
    distributed: dict | None = None  # the trace's distributedInfo (backend, rank, world_size), as recorded
    communication: Communication | None = None  # collectives and their time, when the trace shows any
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
    def whole_trace(self) -> bool:
        """The trace has no ProfilerStep# spans: it is analysed as one step, whose batch is unknown."""
        return self.step_note.startswith(NO_STEP_SPANS)

    @property
    def device(self) -> Device | None:
        """The accelerator the step ran on (the one with most kernel time), if any."""
        return self.devices[0] if self.devices else None


def _primary_devices(trace: Trace, utilization: dict[int, float]) -> list[Device]:
    used = trace.used_devices
    return sorted(used, key=lambda d: -utilization.get(d.index, 0.0))


def platform_of(trace: Trace) -> str:
    """'gpu' for device activity in the CUDA vocabulary (CUDA, ROCm), another accelerator's own name
    ('mtia') for activity or runtime in its categories, 'cpu' when the trace shows no accelerator."""
    if trace.gpu_vocabulary:
        return "gpu"
    return trace.accelerator or "cpu"


def diagnose(trace: Trace, steps_wanted: str | None = None, trial: dict | None = None, *,
             timelines: bool = False) -> Diagnosis:
    """Compute every figure for one trace. Pure: the same trace gives the same Diagnosis. `timelines`: also
    lay each step of a data-parallel rank out in time (`extra["step_timelines"]`), for the views that draw
    the ranks side by side; left out otherwise, as it costs about a tenth of the analysis of a large trace."""
    steps, note = find_steps(trace)
    if steps_wanted:
        chosen = select_steps(steps, steps_wanted)
        if not chosen:
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
    if note.startswith(NO_STEP_SPANS):
        missing.append("ProfilerStep# spans (the whole trace is one step): without step boundaries the launch "
                       "cost per step and the batch a step takes are unknown, so no batch-size advice")
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
        windows = iv.from_spans((s.start, s.end) for s in steps)
        span = iv.length(windows)
        for key, wanted in (("cpu_eligible_share", is_eligible_op), ("cpu_conv_share", is_conv_op)):
            spans = iv.from_columns(trace.columns["ops"], trace.columns["ops"].where_name(wanted))
            extra[key] = iv.length_within(spans, windows) / span if span else None
        optimizer = host_figures(trace, steps).get("optimizer")
        if optimizer is not None:
            extra["optimizer"] = optimizer
    else:
        extra.update(host_figures(trace, steps))
        extra["conv_share"] = mix.conv_share
        extra["nchw_share"] = mix.nchw_share
        # The loader's wait with no kernel running: the breakdown credits the copies (and runtime calls) that
        # run during it before the loader, which hides a loader bound behind copies.
        windows = iv.from_spans((s.start, s.end) for s in steps)
        idle = iv.difference(roles["dataloader"], roles["kernel"], steps[0].start, steps[-1].end)
        extra["loader_idle_share"] = iv.length_within(idle, windows) / len(steps) / step_time if step_time else 0.0
    extra["conv_shapes_constant"] = conv_shapes_constant(trace, steps)
    found = attention(trace, steps, platform, step_time)  # its share of the step, by hand or fused
    extra["attention"] = found.to_dict() if found is not None else None
    modules = (trial or {}).get("attention_modules")
    if extra["attention"] is not None and isinstance(modules, list):  # what the sdpa trial's check read
        extra["attention"]["modules"] = [{"class": str(m.get("class")), "rewritable": bool(m.get("rewritable")),
                                          "why": str(m.get("why"))} for m in modules if isinstance(m, dict)]
    main = utilization.get(devices[0].index) if devices and utilization else None
    if main is None and utilization:
        main = max(utilization.values())
    # What bounds the step.
    comm = communication(trace, steps, roles, platform)
    if comm is not None and timelines:  # a rank of a data-parallel job: its step is drawn beside the other ranks'
        extra["step_timelines"] = step_timelines(steps, roles)
    if platform == "cpu":
        # Exposed communication (the rank waits in a collective) excludes DataLoader time: the two add up.
        exposed = comm.exposed_us / step_time if comm is not None and step_time else 0.0
        bound_shares = {"input": dataloader_share, "communication": exposed,
                        "compute": max(0.0, 1.0 - dataloader_share - exposed)}
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
    problem = why_degenerate(trace, steps)
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
        communication=comm,
        trial=trial,
        findings=((loader,) if loader is not None else ()) + tuple(
            Finding("skipped-events", f"{count} {reason} left out of the analysis")
            for reason, count in trace.skipped.items()),
        skipped_events=tuple(trace.skipped.items()),
        extra=extra,
    )

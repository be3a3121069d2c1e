"""What bounds the step: the time each bound holds, whether the trace can say at all, and the verdict.

A step is bound by its input pipeline, its host-to-device copies, the host (launch overhead), compute,
communication or memory (`BOUNDS`); recommendations address one of these.
"""

from __future__ import annotations

import re
from functools import lru_cache
from operator import attrgetter
from statistics import median

import numpy as np

from advisor.analysis import intervals as iv
from advisor.analysis.breakdown import exclusive_time
from advisor.analysis.copy_times import CopyEvents
from advisor.analysis.findings import Finding
from advisor.analysis.steps import Step, starts_in_steps
from advisor.analysis.trace import Trace
from advisor.knobs.in_trial import workers_queue

# What can bound a step, and how output names it. Recommendations address one of these (`Recommendation.bound`).
BOUNDS = {
    "input": "input pipeline (DataLoader)",
    "copy": "host-to-device copies",
    "host": "CPU/launch overhead",
    "compute": "compute",
    "communication": "communication",
    "memory": "memory",
}

COMPUTE_BOUND = 0.60  # kernels busy this share of the step: compute binds; below, the largest idle cause
INPUT_OVER_COMPUTE = 0.20  # ... unless the device waits on the DataLoader this share of it: the loader binds
COPY_OVER_INPUT = 0.15  # the host blocked in its copies this share of the step binds before the loader
CPU_INPUT_BOUND = 0.30  # CPU-only: the DataLoader share above which the input pipeline binds
CPU_COMMUNICATION_BOUND = 0.30  # CPU-only: the share of exposed communication above which it binds
MIN_EVENTS_PER_STEP = 10  # a forward, backward and optimizer step record dozens
START_UP_SHARE = 0.50
OWN_PROCESS_SHARE = 0.50
DRY_WAIT = 0.20  # a step that waited this share of the median step on the loader found its queue empty

# Runtime calls that set a process up (context, device queries, module loading): a step made of them is
# the first step of a process, not a training step.
START_UP_CALL = re.compile(r"^(cuInit|cuDevicePrimaryCtx\w*|cuCtxCreate\w*|cu(da)?DriverGetVersion|cudaRuntimeGetVersion|"
                           r"cudaGetDeviceCount|cudaGetDeviceProperties\w*|cudaDeviceGetAttribute|cudaSetDevice|"
                           r"cudaFree|cuModuleLoad\w*|cuLibraryLoad\w*|cudaFuncGetAttributes|cuModuleGetFunction|"
                           r"hipInit|hipGetDeviceCount|hipGetDeviceProperties\w*|hipDeviceGetAttribute|hipSetDevice)$")


PID = attrgetter("pid")


def bound_time(steps: list[Step], roles: dict[str, iv.Intervals], copies: CopyEvents) -> dict[str, float]:
    """Average microseconds per step that each bound holds, each moment counted once, by priority:
    compute (kernels, memsets) > communication > copy (host-to-device copies and the host's waits on them)
    > input (DataLoader) > host (the rest: runtime calls, CPU operators, Python, with the device idle)."""
    copy = iv.union(iv.from_events(list(copies.copies)),
                    iv.from_events(list(copies.sync_waits + copies.pageable_waits)))
    layers = [("compute", iv.union(roles["kernel"], roles["memset"])), ("communication", roles["communication"]),
              ("copy", copy), ("input", roles["dataloader"])]
    return exclusive_time(steps, layers, "host")


@lru_cache(maxsize=None)
def _is_start_up_call(name: str) -> bool:
    return START_UP_CALL.match(name) is not None


def why_degenerate(trace: Trace, steps: list[Step]) -> str | None:
    """Why the steps cannot describe training (too few events, events of another process, start-up calls),
    or None. A degenerate trace gets figures but no bound and no speed advice."""
    windows = [(s.start, s.end) for s in steps]
    host = [trace.columns[group] for group in ("ops", "runtime")]
    host_mask = np.concatenate([starts_in_steps(c.ts, steps) for c in host])
    count = int(host_mask.sum()) + sum(int(starts_in_steps(trace.columns[group].ts, steps).sum())
                                       for group in ("kernels", "memcpys", "memsets"))
    if count < MIN_EVENTS_PER_STEP * len(steps):
        return (f"only {count} events inside {len(steps)} step(s): too few to say what a step does "
                "(a forward, backward and optimizer step record dozens)")
    own = set(map(PID, trace.steps))
    if own and not own.issuperset(trace.host_pids):  # another process's events
        host_events = trace.ops + trace.runtime
        pids = [e.pid for e, inside in zip(host_events, host_mask) if inside]
        mine = sum(1 for pid in pids if pid in own)
        if mine < OWN_PROCESS_SHARE * len(pids):
            others = sorted({str(pid) for pid in pids if pid not in own})
            return (f"{len(pids) - mine} of the {len(pids)} host events inside the steps come from process "
                    f"{', '.join(others[:3])}, not from the steps' process {', '.join(sorted(map(str, own)))}: "
                    "the figures would describe another process")
    total = sum(b - a for a, b in windows)
    runtime = trace.columns["runtime"]
    start_up = np.flatnonzero(runtime.where_name(_is_start_up_call) & starts_in_steps(runtime.ts, steps))
    start_up_us = iv.length_within(iv.merge(runtime.ts[start_up], runtime.end[start_up]), iv.from_spans(windows))
    if total and start_up_us >= START_UP_SHARE * total:
        names = sorted({trace.runtime[i].name for i in start_up.tolist()})
        return (f"{100 * start_up_us / total:.0f}% of the step is in start-up calls ({', '.join(names[:4])}): "
                "this is a process starting, not a training step; profile steps after the first")
    return None


def _loader_workers(trial: dict) -> tuple[int, int]:
    """(num_workers, prefetch_factor) the trial's first DataLoader ran with."""
    loaders = trial.get("dataloaders") or []
    effective = (loaders[0].get("effective") if loaders else None) or {}
    return workers_queue(effective, trial.get("knobs") or {}, trial.get("user_values") or {})


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
            # trial.json times in seconds; the trace's, below, in microseconds: waits and walls are in µs.
            waits = [1e6 * max(0.0, s["wall_s"] - s["call_s"]) for s in later]
            walls = [1e6 * s["wall_s"] for s in later]
            where = "trial"
    elif any(name.startswith("enumerate(DataLoader)#_MultiProcessing") for name in trace.columns["ops"].names):
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
        others = [w for i, w in enumerate(waits) if i not in set(dry)]
        pattern = "the wait grows step after step: the queue is draining" if draining else (
            f"{len(dry)} of {len(waits)} steps waited up to {max(waits) / 1000:.1f} ms, the others "
            f"{median(others) / 1000:.1f} ms at the median")
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
    - None when the trace is degenerate (`why_degenerate`): no other bound can be read from it.
    - CPU-only traces: "input" when the DataLoader holds at least CPU_INPUT_BOUND of the step,
      "communication" when the rank waits in collectives with nothing computing at least
      CPU_COMMUNICATION_BOUND of it, else "compute" (the CPU computing the step is all that is left).
    - Accelerators, from `bound_time` (each moment once: compute > communication > copy > input > host):
      "compute" when kernels keep the device busy at least COMPUTE_BOUND of the step, unless it waits on
      the DataLoader INPUT_OVER_COMPUTE of it (a fifth of the step waiting on the loader holds the step
      back however busy the kernels are the rest of the time: "input", compute named next); otherwise
      the largest reason the device idles, except that copies binding COPY_OVER_INPUT of the step bind
      before the DataLoader (a training process that stages its pageable copies itself cannot take
      batches faster however many workers make them): "input" (waiting on the DataLoader; over the trial's steps once
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
        exposed = shares.get("communication", 0.0)
        if input_share >= CPU_INPUT_BOUND and input_share >= exposed:
            return "input", (waiting,) + loader_line
        if exposed >= CPU_COMMUNICATION_BOUND:
            return "communication", (f"{_share(exposed)} of the step waiting in collectives with nothing "
                                     "computing (communication not overlapped with compute)",)
        return "compute", (f"the CPU computes the step; the DataLoader holds {_share(input_share)} of it",)
    device = "GPU" if platform == "gpu" else platform.upper()
    compute = shares.get("compute", 0.0)
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
    if bound == "input" and shares.get("copy", 0.0) >= COPY_OVER_INPUT:
        bound = "copy"
    if compute >= COMPUTE_BOUND and (bound != "input" or input_share < INPUT_OVER_COMPUTE):
        return "compute", (f"kernels keep the {device} busy {_share(compute)} of the step",)
    if compute >= COMPUTE_BOUND:  # both hold the step: the loader first, compute once it keeps up
        idle = (f"kernels keep the {device} busy {_share(compute)} of the step: compute binds once the "
                "DataLoader keeps up")
    else:
        idle = f"kernels keep the {device} busy only {_share(compute)} of the step"
    return bound, (reasons[bound], idle) + (loader_line if bound == "input" else ())

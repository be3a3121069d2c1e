"""The host's side of the step: kernel launches, CUDA graph launches and the optimizer's step."""

from __future__ import annotations

import bisect
import re
from functools import lru_cache

from advisor.analysis import intervals as iv
from advisor.analysis.steps import Step, in_steps, in_steps_mask
from advisor.analysis.trace import Trace

LAUNCH_CALL = re.compile(r"LaunchKernel|^cuLaunch|GraphLaunch")
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#(\w+)\.step$")
# Host calls in which the training thread waits on the device rather than works (the what-if model's
# host path leaves them out: the device's side of the critical path holds that time).
WAIT_CALL = re.compile(r"Synchronize|^(cuda|hip)Memcpy(?!Async)|^aten::item$|^aten::_local_scalar_dense$")
# The range a trial puts around a closure handed to `optimizer.step(closure)` (advisor.trials.process.loop): its
# forward and backward are the closure's, not the optimizer's update.
CLOSURE_RANGE = "## optimizer closure: forward and backward ##"


@lru_cache(maxsize=None)
def _is_launch_call(name: str) -> bool:
    return LAUNCH_CALL.search(name) is not None


@lru_cache(maxsize=None)
def _is_wait(name: str) -> bool:
    """The DataLoader's __next__, or a call in which the host waits on the device (cached: a trace repeats a
    few hundred names over tens of thousands of events)."""
    return name.startswith("enumerate(Data") or WAIT_CALL.search(name) is not None


def host_figures(trace: Trace, steps: list[Step]) -> dict:
    """Launch and optimizer figures per step: kernel launches, kernels, CUDA graph launches, and the
    optimizer's step (class, host time, implementation: fused, foreach or a per-parameter loop)."""
    n = len(steps)
    calls = [r for r in trace.runtime if _is_launch_call(r.name)]
    launches = [r for r, inside in zip(calls, in_steps_mask(calls, steps)) if inside]
    out = {
        "launches_per_step": len(launches) / n,
        "kernels_per_step": int(in_steps_mask(trace.kernels, steps).sum()) / n,
        "graph_launches_per_step": sum(1 for r in launches if "Graph" in r.name) / n,
    }
    spans = [e for e in trace.ops if e.name.startswith("Optimizer.step#") and OPTIMIZER_STEP.match(e.name)
             and in_steps(e, steps)]
    if spans:
        starts = [op.ts for op in trace.ops]  # sorted: operators are sorted by start
        inside = [op for span in spans
                  for op in trace.ops[bisect.bisect_left(starts, span.ts):bisect.bisect_right(starts, span.end)]
                  if op.tid == span.tid and op.end <= span.end and op is not span]
        closures = [op for op in inside if op.name == CLOSURE_RANGE]
        own = [op.name for op in inside if op.name != CLOSURE_RANGE
               and not any(c.ts <= op.ts and op.end <= c.end for c in closures)]
        name = OPTIMIZER_STEP.match(spans[0].name).group(1)
        if "Fused" in name or any("_fused_" in o for o in own):
            implementation = "fused"
        elif any("_foreach_" in o for o in own):
            implementation = "foreach"
        else:
            implementation = "for-loop"
        closure_us = sum(c.dur for c in closures) / n
        out["optimizer"] = {"name": name, "us_per_step": sum(e.dur for e in spans) / n - closure_us,
                            "closure_us_per_step": closure_us, "implementation": implementation}
    out["host_busy_us_per_step"] = host_busy_us(trace, steps)
    return out


def host_busy_us(trace: Trace, steps: list[Step]) -> float:
    """The training thread's own work per step: its operators and runtime calls, less the DataLoader's
    __next__ and the calls in which it waits on the device (`WAIT_CALL`)."""
    tids = {e.tid for e in trace.steps}
    if not steps or not tids:
        return 0.0
    work_events, wait_events = [], []
    for e in trace.ops + trace.runtime:
        if e.tid in tids:
            (wait_events if _is_wait(e.name) else work_events).append(e)
    windows = iv.from_spans((s.start, s.end) for s in steps)
    work, waits = iv.from_events(work_events), iv.from_events(wait_events)
    busy = iv.length_within(work, windows) - iv.length_within(iv.intersect(work, waits), windows)
    return max(0.0, busy) / len(steps)

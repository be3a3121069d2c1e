"""The host's side of the step: kernel launches, CUDA graph launches and the optimizer's step."""

from __future__ import annotations

import bisect
import re
from functools import lru_cache

import numpy as np

from advisor.analysis import intervals as iv
from advisor.analysis.columns import among, distinct
from advisor.analysis.steps import Step, starts_in_steps
from advisor.analysis.events import Event
from advisor.analysis.trace import Trace

LAUNCH_CALL = re.compile(r"LaunchKernel|^cuLaunch|GraphLaunch")
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#(\w+)\.step$")
# Host calls in which the training thread waits on the device rather than works (the what-if model's
# host path leaves them out: the device's side of the critical path holds that time).
WAIT_CALL = re.compile(r"Synchronize|^(cuda|hip)Memcpy(?!Async)|^aten::item$|^aten::_local_scalar_dense$")
# The range a trial puts around a closure handed to `optimizer.step(closure)` (advisor.trials.interposition.loop): its
# forward and backward are the closure's, not the optimizer's update.
CLOSURE_RANGE = "## optimizer closure: forward and backward ##"
STEP_END_RANGE = "## the trial ends the step here ##"  # a loop with no target: where the trial's own work begins


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
    runtime, ops = trace.columns["runtime"], trace.columns["ops"]
    launches = runtime.where_name(_is_launch_call) & starts_in_steps(runtime.ts, steps)
    out = {
        "launches_per_step": int(launches.sum()) / n,
        "kernels_per_step": int(starts_in_steps(trace.columns["kernels"].ts, steps).sum()) / n,
        "graph_launches_per_step": int((launches & runtime.where_name(lambda name: "Graph" in name)).sum()) / n,
    }
    optimizer = ops.where_name(lambda name: name.startswith("Optimizer.step#") and OPTIMIZER_STEP.match(name))
    spans = [trace.ops[i] for i in np.flatnonzero(optimizer & starts_in_steps(ops.ts, steps)).tolist()]
    if spans:
        starts = ops.ts  # sorted: operators are sorted by start
        inside = [op for span in spans
                  for op in trace.ops[np.searchsorted(starts, span.ts, side="left"):
                                      np.searchsorted(starts, span.end, side="right")]
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
        step_starts = [s.start for s in steps]
        out["optimizer"] = {"name": name, "us_per_step": sum(own_span_us(span, inside, steps, step_starts)
                                                             for span in spans) / n - closure_us,
                            "closure_us_per_step": closure_us, "implementation": implementation}
    out["host_busy_us_per_step"] = host_busy_us(trace, steps)
    return out


def own_span_us(span: Event, inside: list[Event], steps: list[Step], step_starts: list[float]) -> float:
    """The optimizer's update in its step's span: up to the trial's mark where it ends the step there, and no
    further than the end of the step it starts in. Where the steps are counted at the optimizer's step (a script
    with no target), the trial's own end of the step runs in the span (torch's post-hooks do): the loss read, the
    profiler's step and, in the last, its stop, which made an MLP's AdamW read 12 ms a step where it took 6."""
    ends = [op.ts for op in inside if op.name == STEP_END_RANGE and span.ts <= op.ts <= span.end]
    step = steps[max(0, bisect.bisect_right(step_starts, span.ts) - 1)]
    return min([span.end, step.end, *ends]) - span.ts


def host_busy_us(trace: Trace, steps: list[Step]) -> float:
    """The training thread's own work per step: its operators and runtime calls, less the DataLoader's
    __next__ and the calls in which it waits on the device (`WAIT_CALL`)."""
    tids = distinct(trace.columns["steps"].tid)
    if not steps or not tids.size:
        return 0.0
    ops, runtime = trace.columns["ops"], trace.columns["runtime"]
    mine = [(among(c.tid, tids), c.where_name(_is_wait), c) for c in (ops, runtime)]
    work = iv.merge(np.concatenate([c.ts[on & ~wait] for on, wait, c in mine]),
                    np.concatenate([c.end[on & ~wait] for on, wait, c in mine]))
    waits = iv.merge(np.concatenate([c.ts[on & wait] for on, wait, c in mine]),
                     np.concatenate([c.end[on & wait] for on, wait, c in mine]))
    windows = iv.from_spans((s.start, s.end) for s in steps)
    busy = iv.length_within(work, windows) - iv.length_within(iv.intersect(work, waits), windows)
    return max(0.0, busy) / len(steps)

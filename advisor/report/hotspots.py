"""Trace → the heaviest kernels and operators, by name, for the report's "where the time went" tables.

The Diagnosis holds figures by role, not by name; a person reading a report also wants to see *which*
kernels and operators took the time. This is the one figure the report derives from a trace itself, from
the same parsed `Trace` the diagnosis used (torch-free). Names come from the trace as they are: the
templates render them as text (autoescape), never as markup.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from advisor.analysis.events import Event
from advisor.analysis.trace import Trace

TOP = 8


@dataclass(frozen=True)
class Hotspot:
    """One kernel or operator name and its time per step."""

    name: str
    us_per_step: float
    calls_per_step: float
    share: float  # of all kernel time (kernels) or of the step (operators' self time)


def _top(totals: dict[str, list[float]], steps: int, denominator: float, top: int) -> tuple[Hotspot, ...]:
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
    return tuple(Hotspot(name, us / steps, calls / steps, us / denominator if denominator else 0.0)
                 for name, (us, calls) in ranked)


def self_times(ops: list[Event]) -> dict[str, list[float]]:
    """{operator name: [self time µs, calls]}: each operator's duration minus its direct children's.

    Self time (not inclusive time) so that `aten::linear` and the `aten::addmm` inside it are not both
    counted for the same moment. Nesting is per thread, by start and end times.
    """
    by_thread: dict[tuple, list[Event]] = defaultdict(list)
    for e in ops:
        if e.dur is not None and e.ts is not None:
            by_thread[(e.pid, e.tid)].append(e)
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for events in by_thread.values():
        events.sort(key=lambda e: (e.ts, -e.dur))
        stack: list[list] = []  # [event, time covered by direct children]
        for e in events:
            while stack and e.ts >= stack[-1][0].end:
                _close(stack.pop(), totals)
            if stack:
                stack[-1][1] += e.dur
            stack.append([e, 0.0])
        while stack:
            _close(stack.pop(), totals)
    return totals


def _close(entry: list, totals: dict[str, list[float]]) -> None:
    event, children = entry
    slot = totals[event.name]
    slot[0] += max(event.dur - children, 0.0)
    slot[1] += 1


def hotspots(trace: Trace, steps: int, step_time_us: float, top: int = TOP) -> dict[str, tuple[Hotspot, ...]]:
    """{"kernels": top kernels by total time, "operators": top operators by self time}, per step."""
    steps = max(steps, 1)
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for k in trace.kernels:
        slot = kernels[k.name]
        slot[0] += k.dur or 0.0
        slot[1] += 1
    kernel_total = sum(us for us, _ in kernels.values())
    ops = [e for e in trace.ops if not e.name.startswith("ProfilerStep#")]
    return {
        "kernels": _top(kernels, steps, kernel_total, top),
        "operators": _top(self_times(ops), steps, step_time_us * steps, top),
    }

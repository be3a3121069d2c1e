"""Steps: the ProfilerStep spans, extended to the device work they launched, and which events fall in them.

With no ProfilerStep spans the whole trace is one step, and the note says so (docs/figures.md).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

import numpy as np

from advisor.analysis.columns import among, in_windows
from advisor.analysis.intervals import START
from advisor.analysis.events import Event
from advisor.analysis.trace import Trace
from advisor.errors import AdvisorError


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


NO_STEP_SPANS = "no ProfilerStep# spans"  # how a step note begins when the whole trace is one step


def host_steps(trace: Trace) -> tuple[list[Step], str]:
    """ProfilerStep spans; with none, the whole host timeline as one step (and a note saying so)."""
    if trace.steps:
        return [Step(e.name, e.ts, e.end) for e in trace.steps], ""
    spans = trace.ops or trace.runtime or trace.kernels or trace.memcpys or trace.memsets
    start = min(e.ts for e in spans)
    end = max(e.end for e in spans)
    return [Step("whole trace", start, end)], f"{NO_STEP_SPANS}: the whole trace is one step"


def find_steps(trace: Trace) -> tuple[list[Step], str]:
    """Steps extended to the device work their runtime calls launched, as the TensorBoard plugin did.

    A step starts at its ProfilerStep span (or where the previous step's device work ended, if later) and
    ends when the last kernel/copy launched inside it ends. Trailing steps that launched no device work,
    or clearly less than the step before (the profiler stopped before their kernels ran), are dropped.
    """
    steps, note = host_steps(trace)
    if not trace.has_device_activity or not trace.runtime:
        return steps, note
    device = [trace.columns[group] for group in ("kernels", "memcpys", "memsets")]
    device_events = trace.kernels + trace.memcpys + trace.memsets
    device_ts = np.concatenate([c.ts for c in device])
    device_end = np.concatenate([c.end for c in device])
    device_ids = np.concatenate([c.correlation for c in device])
    ids, per_id = np.unique(device_ids[device_ids != -1], return_counts=True)  # device events per correlation id
    runtime = trace.columns["runtime"]
    at = np.clip(np.searchsorted(ids, runtime.correlation), 0, max(ids.size - 1, 0))
    launched = (ids[at] == runtime.correlation) & (runtime.correlation != -1) if ids.size else \
        np.zeros(len(runtime), dtype=bool)
    device_span = []
    matched_count = []
    for s in steps:
        lo, hi, n = float("inf"), float("-inf"), 0
        calls = slice(np.searchsorted(runtime.ts, s.start, side="left"), np.searchsorted(runtime.ts, s.end, side="right"))
        inside = launched[calls] & (runtime.end[calls] <= s.end)
        if inside.any():
            step_ids = runtime.correlation[calls][inside]
            n = int(per_id[at[calls][inside]].sum())
            mine = np.flatnonzero(among(device_ids, step_ids))
            first = device_events[mine[np.argmin(device_ts[mine])]]
            last = device_events[mine[np.argmax(device_end[mine])]]
            lo, hi = first.ts, last.ts + last.dur  # the events' own numbers, as the step's bounds
        device_span.append((lo, hi))
        matched_count.append(n)
    if not any(matched_count):
        return steps, note
    prev_end = steps[0].start
    first_device_start = device_span[0][0]
    if first_device_start != float("inf"):
        # Device work still running from before the first step (launched by an unrecorded step) delays
        # it. Work that ends before the first step's own device work cannot come from a later step.
        earlier = np.flatnonzero((device_end < first_device_start) & (device_end > prev_end))
        if earlier.size:
            last = device_events[earlier[np.argmax(device_end[earlier])]]
            prev_end = last.ts + last.dur
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


def in_steps(e: Event, steps: list[Step]) -> bool:
    """Whether the event starts inside one of the steps."""
    # Steps are sorted and disjoint: find the last one starting at or before the event.
    i = bisect.bisect_right(steps, e.ts, key=_step_start) - 1
    return i >= 0 and e.ts < steps[i].end


def _step_start(s: Step) -> float:
    return s.start


def starts_in_steps(ts: np.ndarray, steps: list[Step]) -> np.ndarray:
    """Which of these start times lie inside a step (`in_steps` over a column of a Trace)."""
    return in_windows(ts, np.array([s.start for s in steps]), np.array([s.end for s in steps]))


def in_steps_mask(events: list[Event], steps: list[Step]) -> np.ndarray:
    """Which events start inside a step (the vectorized `in_steps`, for long event lists)."""
    ts = np.fromiter(map(START, events), float, len(events))
    starts = np.array([s.start for s in steps])
    ends = np.array([s.end for s in steps])
    i = np.searchsorted(starts, ts, side="right") - 1
    return (i >= 0) & (ts < ends[np.clip(i, 0, None)])

"""Steps: the ProfilerStep spans, extended to the device work they launched, and which events fall in them.

With no ProfilerStep spans the whole trace is one step, and the note says so (docs/figures.md).
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from advisor.analysis.columns import in_windows
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


def _device_events_by_correlation(trace: Trace) -> dict:
    by_corr = defaultdict(list)
    for group in (trace.kernels, trace.memcpys, trace.memsets):
        for e in group:
            c = e.correlation
            if c is not None:
                by_corr[c].append(e)
    return by_corr


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
    by_corr = _device_events_by_correlation(trace)
    runtime = trace.runtime  # sorted by start
    starts = [r.ts for r in runtime]
    device_span = []
    matched_count = []
    for s in steps:
        lo, hi, n = float("inf"), float("-inf"), 0
        step_end = s.end
        for r in runtime[bisect.bisect_left(starts, s.start):bisect.bisect_right(starts, step_end)]:
            if r.ts + r.dur > step_end or r.args is None:
                continue
            for d in by_corr.get(r.args.correlation, ()):  # comparisons, not min()/max(): the hottest loop
                end = d.ts + d.dur
                if d.ts < lo:
                    lo = d.ts
                if end > hi:
                    hi = end
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

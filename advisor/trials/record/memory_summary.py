"""The memory figures of a trial's record: the steps' memory growth (a leak's slope) and the CPU allocator's
live bytes read from the profiled steps' traces. Torch-free."""

from __future__ import annotations

import gzip
import statistics
from pathlib import Path
from typing import Any

import msgspec


def memory_growth(steps: list[dict[str, Any]], skip: int = 1) -> dict[str, Any] | None:
    """Memory growth per step: least-squares slope of per-step memory over the step index, with R².

    The most precise figure the steps have: `cuda_allocated_bytes` (the CUDA allocator's), else the
    profiled steps' `profiler_allocated_bytes` (the CPU allocator's live bytes from the trace), else
    `rss_bytes` (with the profiler recording, its own buffers add to the resident set every step, so the
    measured windows' steps, which run after it, when there are 3). For CUDA and rss the first `skip` steps
    are left out: they allocate what every later step reuses (optimizer state, allocator pools). None with
    fewer than 3 points.
    """
    windows = [s for s in steps if s.get("phase") == "window" and isinstance(s.get("rss_bytes"), (int, float))]
    if any("cuda_allocated_bytes" in s for s in steps):
        source, candidates = "cuda_allocated_bytes", steps[skip:]
    elif sum("profiler_allocated_bytes" in s for s in steps) >= 3:
        source, candidates = "profiler_allocated_bytes", steps
    elif len(windows) >= 3:  # after the profiler: its buffers grew the resident set in the steps it recorded
        source, candidates = "rss_bytes", windows
    else:
        source, candidates = "rss_bytes", steps[skip:]
    points = [(s["index"], s[source]) for s in candidates if isinstance(s.get(source), (int, float))]
    if len(points) < 3:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    syy = sum((y - mean_y) ** 2 for _, y in points)
    slope = sxy / sxx if sxx else 0.0
    r2 = (sxy * sxy / (sxx * syy)) if sxx and syy else 0.0
    # A leak adds about the same every step; a one-time allocation (optimizer state created at the first
    # optimizer step) is one jump: the median difference between consecutive steps tells them apart.
    differences = [b[1] - a[1] for a, b in zip(points, points[1:])]
    return {"bytes_per_step": slope, "r2": r2, "median_difference_bytes": statistics.median(differences),
            "steps": n, "source": source, "first_index": points[0][0]}


class _MemoryArgs(msgspec.Struct, gc=False):
    total_allocated: Any = msgspec.field(name="Total Allocated", default=None)
    device_type: Any = msgspec.field(name="Device Type", default=0)


class _Event(msgspec.Struct, gc=False):
    """The fields of a trace event read here; the rest of each event is skipped while decoding, and its
    args are decoded only for a `[memory]` event."""

    name: Any = ""
    ph: Any = None
    ts: Any = None
    dur: Any = 0
    args: msgspec.Raw = msgspec.Raw(b"")


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event] = []


def _memory_args(args: msgspec.Raw) -> _MemoryArgs | None:
    """A `[memory]` event's allocator figures, or None where its args are not an object of them."""
    try:
        return msgspec.json.decode(args, type=_MemoryArgs) if args else None
    except msgspec.DecodeError:
        return None


def profiler_memory(trace_path: Path) -> tuple[int | None, dict[int, int]]:
    """From the trace's CPU `[memory]` events (profile_memory=True): the largest `Total Allocated`, and
    per `ProfilerStep#N` the `Total Allocated` at the step's end.

    The profiler counts only allocations made while it records, so the per-step figure is the CPU
    allocator's live bytes relative to the profiler's start: exact for growth, unlike the resident set,
    which the profiler's own event buffers inflate step after step.
    """
    try:
        opener = gzip.open if trace_path.suffix == ".gz" else open
        with opener(trace_path, "rb") as f:
            events = msgspec.json.decode(f.read(), type=_Trace).traceEvents
    except (OSError, ValueError, EOFError, msgspec.DecodeError):
        return None, {}
    memory = []
    for e in events:
        if e.name == "[memory]" and isinstance(e.ts, (int, float)):
            figures = _memory_args(e.args)
            if figures is not None and isinstance(figures.total_allocated, (int, float)) and figures.device_type == 0:
                memory.append((e.ts, figures.total_allocated))
    memory.sort()
    ends = {}
    for e in events:
        name = str(e.name)
        if e.ph == "X" and name.startswith("ProfilerStep#") and name[13:].isdigit() and isinstance(e.ts, (int, float)):
            ends[int(name[13:])] = e.ts + (e.dur or 0)
    by_step, position, current = {}, 0, None
    for step, end in sorted(ends.items(), key=lambda item: item[1]):
        while position < len(memory) and memory[position][0] <= end:
            current = memory[position][1]
            position += 1
        if current is not None:
            by_step[step] = current
    return (max(v for _, v in memory) if memory else None), by_step


def add_profiler_memory(steps: list[dict[str, Any]], trace_paths: list[Path]) -> int | None:
    """Give each profiled step its `profiler_allocated_bytes`; return the traces' peak `Total Allocated`."""
    peaks, by_step = [], {}
    for path in trace_paths:
        peak, figures = profiler_memory(path)
        if peak is not None:
            peaks.append(peak)
        by_step.update(figures)
    for step in steps:
        if step.get("index") in by_step:
            step["profiler_allocated_bytes"] = by_step[step["index"]]
    return max(peaks, default=None)

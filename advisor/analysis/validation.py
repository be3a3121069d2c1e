"""What the analysis refuses in a trace's events, and what it leaves out as odd but legal.

A trace is input from anywhere: times and byte counts that cannot be real (missing, negative, a week
long, beyond an exbibyte) would give figures that are nonsense, so the first such event, in file order,
is named in a TraceError. ProfilerStep spans of zero length, or overlapping the step before, are left
out and counted. The checks are vectorized over all kept events at once.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter
from pathlib import Path

import numpy as np

from advisor.analysis.events import Event
from advisor.errors import TraceError

# Bounds beyond which a trace's numbers cannot be real, and figures computed from them would be nonsense
# (300-digit step times): no event lasts, or lies from the trace's median time, more than a week; no copy,
# allocation or device memory is larger than an exbibyte.
MAX_SPAN_US = 7 * 24 * 3600 * 1e6
MAX_BYTES = 2**60


def floats_of(events: list[Event], name: str):
    """One time field of the events as a float array: None → NaN, an integer too large for a float → inf."""
    try:
        return np.fromiter(map(attrgetter(name), events), float, len(events))
    except (TypeError, OverflowError):  # a missing time, or a huge integer: the slow way, value by value
        values = map(attrgetter(name), events)
        return np.array([v if v is None or abs(v) < 1e308 else float("inf") for v in values], dtype=float)


def _low_median(values) -> float:
    """The lower median: one of the values themselves, so that of two times the later one is the outlier."""
    if values.size == 0:
        return 0.0
    k = (values.size - 1) // 2
    return float(np.partition(values, k)[k])


def _first_in_file(events: list[Event], candidates: list[Event]) -> tuple[int, Event]:
    """(index in the file, event) of the candidate that comes first in the file."""
    position = {id(e): i for i, e in enumerate(events)}
    e = min(candidates, key=lambda c: position[id(c)])
    return position[id(e)], e


def check_times(path: Path | str, events: list[Event], groups: list[list[Event]], memory_events: list[Event],
                scale: float, times: tuple | None = None, memory_ts: np.ndarray | None = None) -> None:
    """TraceError naming the first event (in file order) whose times the analysis cannot use: no 'ts' or
    'dur', a negative duration, one longer than MAX_SPAN_US, a time further than that from the rest. `groups`:
    the timed events, in groups; `times`: their (starts, durations) as `floats_of` reads them, and `memory_ts`
    the memory events' starts, where the caller has them already."""
    count = sum(map(len, groups))  # (the groups are joined where an event is named only)
    if times is None:
        timed = list(chain(*groups))
        times = floats_of(timed, "ts"), floats_of(timed, "dur")
    timed_ts, timed_dur = times
    with np.errstate(invalid="ignore", over="ignore"):
        ts = np.concatenate([timed_ts, floats_of(memory_events, "ts") if memory_ts is None else memory_ts]) * scale
        dur = np.concatenate([timed_dur, np.zeros(len(memory_events))]) * scale
        finite = np.isfinite(ts) & np.isfinite(dur)
        center = _low_median(ts[finite])
        bad = ~finite | (dur < 0) | (dur > MAX_SPAN_US) | (np.abs(ts - center) > MAX_SPAN_US)
    if bad.any():
        everyone = list(chain(*groups, memory_events))
        i, e = _first_in_file(events, [everyone[k] for k in np.flatnonzero(bad)])
        if e.name == "[memory]" and e.ph == "i":
            problem = "has no 'ts'" if e.ts is None else f"has a time far from the rest of the trace (ts {e.ts})"
            raise TraceError(path, f"event {i} ([memory]) {problem}")
        if e.ts is None or e.dur is None:
            missing = "ts" if e.ts is None else "dur"
            raise TraceError(path, f"event {i} ({e.name!r}) is a complete event without '{missing}'")
        if e.dur < 0:
            problem = f"has a negative duration (dur {e.dur})"
        elif e.dur * scale > MAX_SPAN_US or not np.isfinite(float(e.dur) * scale):
            problem = f"lasts longer than a week (dur {e.dur})"
        else:
            problem = f"lies more than a week from the rest of the trace (ts {e.ts})"
        raise TraceError(path, f"event {i} ({e.name!r}) {problem}")
    if not (dur > 0).any() and np.ptp(ts[:count]) == 0:
        raise TraceError(path, "its events span no time (each lasts 0 µs, all at one moment): nothing to analyse")


def check_sizes(path: Path | str, events: list[Event], memory_events: list[Event], memcpys: list[Event],
                fields: dict) -> None:
    """TraceError naming the first event whose byte counts are negative (but for freed bytes) or beyond
    MAX_BYTES: a copy's bytes, an allocation's bytes, the allocator's totals. `fields`: the memory events'
    `columns.memory_fields` (or those fields as arrays, as `sorting.EventSorter.memory_fields` reads them)."""
    bad = []
    if not all_byte_counts(fields):
        for e in memory_events:
            a = e.args
            if a is not None and not (is_byte_count(a.alloc_bytes, signed=True) and is_byte_count(a.total_allocated)
                                      and is_byte_count(a.total_reserved)):
                bad.append(e)
    bad += [e for e in memcpys if e.args is not None and not is_byte_count(e.args.bytes)]
    if bad:
        i, e = _first_in_file(events, bad)
        a = e.args
        counts = {key: getattr(a, name, None) for key, name in (  # a copy's arguments or an allocation's
            ("Bytes", "alloc_bytes"), ("Total Allocated", "total_allocated"), ("Total Reserved", "total_reserved"),
            ("bytes", "bytes"))}
        key = next(k for k, v in counts.items() if not is_byte_count(v, signed=k == "Bytes"))
        raise TraceError(path, f"event {i} ({e.name!r}) has '{key}': {counts[key]}, not a byte count")


BYTE_FIELDS = (("alloc_bytes", True), ("total_allocated", False), ("total_reserved", False))


def all_byte_counts(fields: dict[str, list]) -> bool:
    """Whether every `[memory]` event's byte counts (`fields`: their `columns.memory_fields`) pass `is_byte_count`
    (checked on arrays at once; False also where that cannot say, as for integers too large for a float to hold
    exactly: the caller then looks at each event)."""
    for name, signed in BYTE_FIELDS:
        try:
            values = np.array(fields[name], dtype=float)  # None: NaN
        except (TypeError, ValueError, OverflowError):
            return False
        known = values[~np.isnan(values)]
        if known.size and (np.abs(known).max() >= 2.0**53
                           or not ((-MAX_BYTES if signed else 0) <= known.min() and known.max() <= MAX_BYTES)):
            return False
    return True


def is_byte_count(value, signed: bool = False) -> bool:
    """A byte count the analysis can use: absent, or a number within ±MAX_BYTES (negative only if signed)."""
    return value is None or ((-MAX_BYTES if signed else 0) <= value <= MAX_BYTES)


def usable_steps(steps: list[Event], skipped: dict[str, int]) -> list[Event]:
    """ProfilerStep spans that can be steps: those of zero length, and those that start before the step
    before ends (steps are disjoint spans), are left out and counted in `skipped`."""
    kept: list[Event] = []
    for e in steps:
        if e.dur <= 0:
            reason = "ProfilerStep# spans of zero length"
        elif kept and e.ts < kept[-1].ts + kept[-1].dur:
            reason = "ProfilerStep# spans that overlap the step before"
        else:
            kept.append(e)
            continue
        skipped[reason] = skipped.get(reason, 0) + 1
    return kept

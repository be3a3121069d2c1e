"""One step laid out in time: which role holds each moment (the breakdown's priority), for the ranks of a
data-parallel job drawn side by side."""

from __future__ import annotations

import numpy as np

from advisor.analysis import intervals as iv
from advisor.analysis.breakdown import ROLES
from advisor.analysis.steps import Step

MAX_SEGMENTS = 2000  # per step: enough to draw, bounded for a trace with very many short operators


def step_timelines(steps: list[Step], roles: dict[str, iv.Intervals]) -> dict[str, dict]:
    """Each step as segments [role, start, end] in µs from its start, each moment given to the first role
    active then (`ROLES`); moments no role covers are left out ("other"). Keyed by step name."""
    return {step.name: one_step(step, roles) for step in steps}


def one_step(step: Step, roles: dict[str, iv.Intervals]) -> dict:
    """One step's segments (see `step_timelines`)."""
    taken = iv.EMPTY
    segments = []
    for role in ROLES[:-1]:
        within = _clip(roles[role], step.start, step.end)
        for a, b in zip(*within):
            for lo, hi in _uncovered(float(a), float(b), taken):
                segments.append([role, lo - step.start, hi - step.start])
        taken = iv.union(taken, within)
    segments.sort(key=lambda s: s[1])
    if len(segments) > MAX_SEGMENTS:  # keep the longest: short ones would not show anyway
        segments = sorted(sorted(segments, key=lambda s: s[1] - s[2])[:MAX_SEGMENTS], key=lambda s: s[1])
    return {"step": step.name, "duration_us": step.duration, "segments": segments}


def _clip(intervals: iv.Intervals, lo: float, hi: float) -> iv.Intervals:
    starts, ends = intervals
    keep = (ends > lo) & (starts < hi)
    return np.maximum(starts[keep], lo), np.minimum(ends[keep], hi)


def _uncovered(a: float, b: float, taken: iv.Intervals) -> list[tuple[float, float]]:
    """Parts of [a, b] outside the `taken` intervals (sorted, disjoint)."""
    out, cursor = [], a
    starts, ends = taken
    first = int(np.searchsorted(ends, a, side="right"))  # the taken intervals before a end before it
    for lo, hi in zip(starts[first:].tolist(), ends[first:].tolist()):
        if hi <= cursor:
            continue
        if lo >= b:
            break
        if lo > cursor:
            out.append((cursor, lo))
        cursor = max(cursor, hi)
        if cursor >= b:
            break
    if cursor < b:
        out.append((cursor, b))
    return out

"""One step laid out in time: which role holds each moment (the breakdown's priority), for the ranks of a
data-parallel job drawn side by side."""

from __future__ import annotations

from advisor.analysis import intervals as iv
from advisor.analysis.breakdown import ROLES
from advisor.analysis.steps import Step

MAX_SEGMENTS = 2000  # per step: enough to draw, bounded for a trace with very many short operators
SHORTEST = 1 / 5000  # of the step: a segment shorter than this is not drawn (below a pixel), nor kept


def step_timelines(steps: list[Step], roles: dict[str, iv.Intervals]) -> dict[str, dict]:
    """Each step as segments [role, start, end] in µs from its start, each moment given to the first role
    active then (`ROLES`); moments no role covers are left out ("other"), and segments too short to draw
    (`SHORTEST`). Keyed by step name."""
    return {step.name: one_step(step, roles) for step in steps}


def one_step(step: Step, roles: dict[str, iv.Intervals]) -> dict:
    """One step's segments (see `step_timelines`)."""
    window = iv.from_spans([(step.start, step.end)])
    taken = iv.EMPTY
    segments = []
    for role in ROLES[:-1]:
        within = iv.intersect(roles[role], window)
        starts, ends = iv.difference(within, taken, step.start, step.end)
        visible = ends - starts >= SHORTEST * step.duration
        starts, ends = starts[visible], ends[visible]
        segments += [[role, a - step.start, b - step.start] for a, b in zip(starts.tolist(), ends.tolist())]
        taken = iv.union(taken, within)
    segments.sort(key=lambda s: s[1])
    if len(segments) > MAX_SEGMENTS:  # keep the longest: short ones would not show anyway
        segments = sorted(sorted(segments, key=lambda s: s[1] - s[2])[:MAX_SEGMENTS], key=lambda s: s[1])
    return {"step": step.name, "duration_us": step.duration, "segments": segments}

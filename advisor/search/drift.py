"""Drift: whether the machine changed between the best's measurement and a candidate's, so that the
decision must compare the candidate with the best measured again beside it.

Every decision compares two trials run one after another. On a shared machine other jobs come and go
between them, and the change reads as the knob's effect. Two signs say the machine changed:

- the load beside the windows (`advisor.trials.process.machine_load`): the share of the machine the trial got,
  1 − its contention (the share of its ready time its threads waited for a CPU, or where that is not
  known other processes' share of the CPU; and other processes' share of the GPU where NVML tells). It
  changed by a factor LOAD_RATIO or more within the candidate's windows, or between the best's latest
  run and the candidate. A ratio, not a difference: on a saturated machine the trial gets 18% of the
  CPU instead of 25% when another job starts, and that is as large a change as 70% instead of 100%;
- the windows themselves: the candidate's first and second halves differ beyond their noise (a step in
  speed no knob made, as the machine changed under the trial), or the best's runs disagree beyond it.

Then the session runs the best once more beside the candidate and decides on that run (and on the
candidate's windows measured at the same load, when the load changed within its trial). Pure functions
over trial records.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from advisor.trials.record.measurement import Measurement, measure, noise, window_groups

LOAD_RATIO = 1.3  # the share of the machine a trial gets changing by this factor is a changed machine
FLOOR = 0.02  # a share below this counts as this (a trial never gets none of the machine)
DRIFT_Z = 3.0  # halves of a trial this many standard errors apart: a step no knob made (≈ 1 in 400 by chance)
DURING = "the machine's load changed during this trial"
SINCE = "the machine's load changed since the best was measured"
STEPPED = "the trial's speed stepped between its first and second halves"
BEST_DRIFTED = "the best's own runs disagree"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def contention(load: dict[str, Any]) -> float:
    """How much of the machine others held from a trial beside one window: its wait for a CPU (else other
    processes' CPU share), or other processes' GPU share where that is larger."""
    cpu = load.get("waited") if _number(load.get("waited")) else load.get("other_cpu")
    shares = [v for v in (cpu, load.get("gpu_other")) if _number(v)]
    return min(1.0, max(0.0, max(shares))) if shares else 0.0


def window_loads(record: dict[str, Any]) -> list[float]:
    """The contention beside each window of a trial (0: the machine was the trial's)."""
    return [contention(s["load"]) for s in record.get("steps") or []
            if isinstance(s, dict) and isinstance(s.get("load"), dict)]


def apart(a: float, b: float) -> bool:
    """Whether two contentions leave a trial shares of the machine LOAD_RATIO or more apart."""
    x, y = max(FLOOR, 1 - a), max(FLOOR, 1 - b)
    return max(x, y) / min(x, y) >= LOAD_RATIO


def _halves(record: dict[str, Any]) -> tuple[Measurement, Measurement] | None:
    groups, source = window_groups(record.get("steps") or [])
    if source != "windows" or len(groups) < 4:
        return None
    half = len(groups) // 2
    return measure([[s for g in groups[:half] for s in g]]), measure([[s for g in groups[half:] for s in g]])


def stepped(record: dict[str, Any]) -> bool:
    """Whether a trial's windows changed speed between its halves beyond DRIFT_Z standard errors."""
    halves = _halves(record)
    if halves is None or not all(h.samples_per_s for h in halves):
        return False
    first, second = halves
    spread = noise(first, second) / 2  # one standard error of the difference
    return spread > 0 and abs(second.samples_per_s / first.samples_per_s - 1) > DRIFT_Z * spread


def best_disagrees(best_runs: list[dict[str, Any]]) -> bool:
    """Whether the best's latest run and its earlier ones differ beyond DRIFT_Z standard errors."""
    if len(best_runs) < 2:
        return False
    latest, earlier = measure([best_runs[0].get("steps") or []]), measure(r.get("steps") or [] for r in best_runs[1:])
    if not latest.samples_per_s or not earlier.samples_per_s:
        return False
    spread = noise(latest, earlier) / 2
    return spread > 0 and abs(latest.samples_per_s / earlier.samples_per_s - 1) > DRIFT_Z * spread


def machine_changed(best_runs: list[dict[str, Any]], candidate: dict[str, Any]) -> str | None:
    """Why the candidate must be compared with the best measured again beside it, or None.
    `best_runs`: the best's records, latest first."""
    loads = window_loads(candidate)
    if loads and apart(max(loads), min(loads)):
        return DURING
    before = window_loads(best_runs[0]) if best_runs else []
    if loads and before and apart(statistics.fmean(loads), statistics.fmean(before)):
        return SINCE
    if stepped(candidate):
        return STEPPED
    if best_disagrees(best_runs):
        return BEST_DRIFTED
    return None


def pair_changed(best_runs: list[dict[str, Any]], other_runs: list[dict[str, Any]]) -> str | None:
    """Why two settings measured again side by side must be decided on those two runs alone, not pooled
    with their earlier ones (both lists latest first), or None."""
    if not best_runs or not other_runs:
        return None
    return machine_changed(best_runs, other_runs[0]) or ("the runner-up's own runs disagree"
                                                         if best_disagrees(other_runs) else None)


def same_load(best_runs: list[dict[str, Any]], other_runs: list[dict[str, Any]]) -> tuple[list, list] | None:
    """The runs of each setting measured at one load (not `apart`), at the load of the latest run of
    the other setting that has a match; None where no load level holds runs of both."""
    for latest in other_runs:
        level = mean_load(latest)
        if level is None:
            return None
        near = [[r for r in runs if (m := mean_load(r)) is not None and not apart(m, level)]
                for runs in (best_runs, other_runs)]
        if near[0] and near[1]:
            return near[0], near[1]
    return None


def at_load(record: dict[str, Any], level: float | None) -> list[dict[str, Any]]:
    """The record's steps, less the windows whose load is `apart` from `level` (the load
    the best was measured again at), when at least two windows are left; else all of them."""
    steps = record.get("steps") or []
    if level is None:
        return steps
    groups, source = window_groups(steps)
    if source != "windows":
        return steps
    kept = []
    for group in groups:
        load = window_loads({"steps": group})
        if load and not apart(load[-1], level):
            kept.append(group)
    if len(kept) < 2 or len(kept) == len(groups):
        return steps
    return [s for s in steps if s.get("phase") != "window"] + [s for g in kept for s in g]


def mean_load(record: dict[str, Any]) -> float | None:
    """The mean load beside a trial's windows (None where it reported none)."""
    loads = window_loads(record)
    return statistics.fmean(loads) if loads else None


def load_text(record: dict[str, Any]) -> str | None:
    """The load beside a trial's windows in words, e.g. 'others held 12–48% of the machine from it'."""
    loads = window_loads(record)
    if not loads:
        return None
    low, high = min(loads), max(loads)
    span = f"{100 * low:.0f}%" if math.isclose(low, high, abs_tol=0.005) else f"{100 * low:.0f}–{100 * high:.0f}%"
    return f"others held {span} of the machine from it"

"""Drift: whether the machine changed between the best's measurement and a candidate's, so that the
decision must compare the candidate with the best measured again beside it.

Every decision compares two trials run one after another. On a shared machine other jobs come and go
between them, and the change reads as the knob's effect. Two signs say the machine changed:

- the load beside the windows (`advisor.trials.harness.machine_load`): the share of the machine the trial got,
  1 − its contention (the share of the CPU its processes asked for that others took, its own workers'
  demand not counted; or where that is not known other processes' share of the CPU; and other processes'
  share of the GPU where NVML tells). It
  changed by a factor LOAD_RATIO or more within the candidate's windows, or between the best's latest
  run and the candidate. A ratio, not a difference: on a saturated machine the trial gets 18% of the
  CPU instead of 25% when another job starts, and that is as large a change as 70% instead of 100%;
- the windows themselves: the candidate's first and second halves differ beyond their noise (a step in
  speed no knob made, as the machine changed under the trial), or the best's runs disagree beyond it.

Then the session runs the best once more beside the candidate and decides on the windows of both that ran
at one load (`at_one_load`); where none did, the candidate runs again. Pure functions over trial records.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from advisor.search.record import TrialRow
from advisor.trials.record.measurement import Measurement, measure, noise, window_groups

LOAD_RATIO = 1.3  # the share of the machine a trial gets changing by this factor is a changed machine
FLOOR = 0.02  # a share below this counts as this (a trial never gets none of the machine)
DRIFT_Z = 3.0  # halves of a trial this many standard errors apart: a step no knob made (≈ 1 in 400 by chance)
DURING = "the machine's load changed during this trial"
SINCE = "the machine's load changed since the best was measured"
STEPPED = "the trial's speed stepped between its first and second halves"
BEST_DRIFTED = "the best's own runs disagree"
# Windows a setting needs at one load for a decision on them: two leave their noise a guess from one difference
# (a loaded live session kept batch 256 at "+40.7%, noise 27.7%" on two windows of each).
AT_ONE_LOAD = 3
# Others holding more than this share of what a trial asked for: its threads wait more than they run, and its
# speed is erratic. Under a CPU hog per core (60-68% held) the conv example ran at a fifth to a tenth of its quiet
# speed, varying from second to second and from one setting to another: a loaded live session kept batch 256 at
# "+57%" on such windows. A load that only slows every step alike (the replay's, up to half) stays comparable.
ERRATIC = 0.5


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def contention(load: dict[str, Any]) -> float:
    """How much of the machine others held from a trial beside one window: the share of the CPU it asked
    for that others took (records before it: its wait for a CPU; else other processes' CPU share), or
    other processes' GPU share where that is larger."""
    cpu = next((load[k] for k in ("taken", "waited", "other_cpu") if _number(load.get(k))), None)
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
    if not steady(candidate):
        return DURING
    loads = window_loads(candidate)
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
    return (machine_changed(best_runs, other_runs[0])
            or ("the runner-up's own runs disagree" if best_disagrees(other_runs) else None)
            or (SPANNED if spans_loads(best_runs + other_runs) else None))


SPANNED = "their runs ran at different loads"


def spans_loads(runs: list[dict[str, Any]]) -> bool:
    """Whether some of these runs had shares of the machine LOAD_RATIO or more apart (pooled, their figures
    would mix loads)."""
    levels = [level for run in runs if (level := mean_load(run)) is not None]
    return len(levels) > 1 and apart(max(levels), min(levels))


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


def chained(rows: list[TrialRow]) -> float:
    """The session's speedup as the product of its kept changes' gains, each measured against the best as
    measured close to it in time (the chain that a load changing between baseline and best cannot bend)."""
    ratio = 1.0
    for row in rows:
        if row.decision == "kept" and _number(row.gain):
            ratio *= 1 + row.gain
    return ratio


def steps_at(record: dict[str, Any], level: float) -> list[dict[str, Any]]:
    """The record's steps with only the windows that ran at `level` (not `apart` from it): its other steps and
    those windows (none where its windows were not kept apart)."""
    steps = record.get("steps") or []
    groups, source = window_groups(steps)
    if source != "windows":
        return []
    kept = [g for g in groups if (loads := window_loads({"steps": g})) and not apart(loads[-1], level)]
    return [s for s in steps if s.get("phase") != "window"] + [s for g in kept for s in g] if kept else []


def at_one_load(a_runs: list[dict[str, Any]], b_runs: list[dict[str, Any]]) -> tuple[list, list] | None:
    """Two settings' runs, each cut to its windows at the quietest load that both ran AT_ONE_LOAD windows at
    (their runs together); None where no load level holds that many of both. Never at a load past ERRATIC
    where they ran quieter too."""
    levels = sorted({load for run in a_runs + b_runs for load in window_loads(run)})
    for level in levels:
        if level > ERRATIC and apart(level, levels[0]):
            break
        a = [dict(r, steps=steps) for r in a_runs if (steps := steps_at(r, level))]
        b = [dict(r, steps=steps) for r in b_runs if (steps := steps_at(r, level))]
        if _windows(a) >= AT_ONE_LOAD and _windows(b) >= AT_ONE_LOAD:
            return a, b
    return None


def quiet_as_ever(matched: tuple[list, list] | None, runs: list[dict[str, Any]]) -> bool:
    """Whether two runs cut to one load (`at_one_load`; None: they share none) ran at the quietest load
    that any of `runs` ran a window at (where no load is known, they did)."""
    quietest = min((load for run in runs for load in window_loads(run)), default=None)
    if quietest is None:
        return True
    levels = [level for run in (matched[0] + matched[1] if matched else []) if (level := mean_load(run)) is not None]
    return bool(levels) and not apart(max(levels), quietest)


def _windows(runs: list[dict[str, Any]]) -> int:
    """The steady-state windows of these runs together."""
    return sum(len(window_groups(r["steps"])[0]) for r in runs)


def steady(record: dict[str, Any]) -> bool:
    """Whether every window of a trial ran at one load (none known: taken as one)."""
    loads = window_loads(record)
    return not loads or not apart(max(loads), min(loads))


def holds_across_loads(keep: bool, candidate: dict[str, Any], best: dict[str, Any]) -> bool:
    """Whether a decision between runs at two loads holds anyway: the candidate had less of the machine than
    the best and still measured faster (kept), or more of it and still measured slower (reverted)."""
    mine, theirs = mean_load(candidate), mean_load(best)
    if mine is None or theirs is None:
        return False
    return mine > theirs if keep else mine < theirs

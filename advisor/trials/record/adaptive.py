"""Adaptive windows: a warm trial measures until its figure decides against the best, not a fixed count.

A new process pays its start-up, model build and warm-up again; one more window in a trial that is
already warm costs only the window. So a trial told what it is compared with (`Against`: the best's
samples/s, its relative standard error, the gain worth keeping and the equivalence margin) measures
at least `min_windows` windows, then after each one asks `settled`: clearly better (the gain beyond
its noise and the gain worth keeping), clearly worse (the whole interval below the best), equivalent
(the whole interval of the difference within ± the margin) or not better (even the top of its interval
is not a gain worth keeping); it stops there, or at
`max_windows`. The noise is `advisor.trials.record.measurement`'s: two standard errors of the difference.

Torch-free and pure: the step schedule (`advisor.trials.record.schedule`) in the trial process and the replay
runner (`advisor.trials.replay.surface`) call the same rule, with what each window measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from advisor.trials.record.measurement import ratio_relative_se

CAP_FACTOR = 3  # at most this many times the windows asked for, in a trial measured against the best
# No earlier end where the best's own noise keeps the verdict from settling: the verdict asks two standard errors
# of the difference, but the search keeps a change that addresses the bound at one, so windows that cannot settle
# the verdict still narrow the figure it decides on (twice tried, twice reverted: cut so, the replayed four-change
# surfaces ended at 0.57-0.79 of their best in seeds that reached it before). Nor an end where the windows left
# could not lift the figure over the search's own bar by the cap (stochastic curtailment, tried on 2026-12-03 with
# the load beside the windows allowed for): the replayed sessions took 6 % less simulated time at the median
# (3 % under drift), and the worst seeds of three surfaces at 10 % fell below 0.85 (docs/benchmarks.md). Nor a
# later end for a trial read better until its standard error is no wider than the best's it replaces (tried the
# same day): the replayed sessions took as long at the median, and the ridge under drift fell to 0.836.
MIN_WINDOWS = 3  # a standard error needs a few windows before it means anything


@dataclass(frozen=True)
class Against:
    """What a trial's windows are compared with: the best's figure and noise, and what settles it."""

    samples_per_s: float
    relative_se: float | None
    min_gain: float  # a gain smaller than this is not kept, however sure
    margin: float  # within ± this (the whole interval), the two are the same for the search
    min_windows: int
    max_windows: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the trial's config, trial.json's `schedule.against`)."""
        return {"samples_per_s": self.samples_per_s, "relative_se": self.relative_se, "min_gain": self.min_gain,
                "margin": self.margin, "min_windows": self.min_windows, "max_windows": self.max_windows}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Against | None":
        """Back from JSON; None for no target (a fixed count of windows)."""
        if not isinstance(data, dict) or not data.get("samples_per_s"):
            return None
        return cls(float(data["samples_per_s"]), data.get("relative_se"), float(data.get("min_gain") or 0.0),
                   float(data.get("margin") or 0.0), int(data.get("min_windows") or MIN_WINDOWS),
                   int(data.get("max_windows") or MIN_WINDOWS))


def windows_target(samples_per_s: float | None, relative_se: float | None, min_gain: float,
                   windows: int) -> Against | None:
    """The target of a trial measured against a best with this figure (None when there is none to beat)."""
    if not samples_per_s or windows < 1:
        return None
    return Against(samples_per_s, relative_se, min_gain, min_gain, min(windows, MIN_WINDOWS) if windows > 1 else 1,
                   max(windows, CAP_FACTOR * windows))


def settled(groups: list[tuple[float, float]], target: Against) -> str | None:
    """'better', 'worse', 'equivalent' or 'not better' once the windows so far (samples, seconds each) decide against
    the target; None while they do not, or before `min_windows`."""
    if len(groups) < target.min_windows:
        return None
    seconds = sum(t for _, t in groups)
    if seconds <= 0:
        return None
    rate = sum(s for s, _ in groups) / seconds
    se = ratio_relative_se(groups)
    if se is None:
        se = target.relative_se
    if se is None:
        return None
    gain = rate / target.samples_per_s - 1
    noise = 2 * math.hypot(se, target.relative_se if target.relative_se is not None else se)
    if gain > max(target.min_gain, noise):
        return "better"
    if gain + noise < 0:
        return "worse"
    if abs(gain) + noise <= target.margin:
        return "equivalent"
    if gain + noise < target.min_gain:
        return "not better"  # not clearly slower, but even the top of its interval is not worth keeping
    return None

"""Steady-state samples/s of a trial, and how far chance alone could move it.

A trial measures its step in *windows* after the profiled steps (the harness's measurement phase): each
window lasts at least `window_s` seconds and spans at least one cycle of the DataLoader's workers, so a
prefetch queue that fills and drains is averaged inside each window rather than mistaken for a change.
Samples/s is all samples over all time (a ratio estimator over the windows); its noise comes from the
spread between windows, never from single steps. A script that ended within its first windows leaves one or
two: its noise is then read from blocks of their steps too (`window_blocks`), not taken as none, nor as the
spread of two windows that happened to agree.

Trials recorded without windows (older records, recorded surfaces) are measured on their profiled
steps, in blocks of consecutive steps: blocks of two where steps alternate (a queue filling and
draining: negative lag-1 autocorrelation), single steps otherwise. Pure functions over step records.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable

BLOCK_STEPS = 2
Z95 = 1.96
# Steps a window holds at least, whatever its seconds (`schedule.StepSchedule`): windows of one or two long steps
# read a decision's noise at 17-22% on a quiet machine (char transformer, 0.5 s steps, 1 s windows); five steps
# average the step-to-step spread down to a few percent.
MIN_WINDOW_STEPS = 5


@dataclass(frozen=True)
class Measurement:
    """Samples/s of one or more runs of the same settings, with its relative standard error."""

    samples_per_s: float | None
    relative_se: float | None  # standard error of samples_per_s / samples_per_s; None with one window too short
    windows: tuple[float, ...]  # samples/s of each window (or block of steps)
    steps: int
    seconds: float
    source: str  # "windows" | "blocks" | "steps"
    wait_share: float | None  # share of the measured time the loop spent outside the step (loading data)
    unit: str = "samples/s"  # "steps/s" where no step knew its batch size (no DataLoader, no batch argument)

    @property
    def interval(self) -> tuple[float, float] | None:
        """About 95% of the time the true samples/s lies in here."""
        if self.samples_per_s is None or self.relative_se is None:
            return None
        half = Z95 * self.relative_se * self.samples_per_s
        return max(0.0, self.samples_per_s - half), self.samples_per_s + half

    def to_dict(self) -> dict[str, Any]:
        """JSON form (trial.json `summary.steady`)."""
        return {"samples_per_s": self.samples_per_s, "relative_se": self.relative_se,
                "interval": list(self.interval) if self.interval else None, "windows": list(self.windows),
                "steps": self.steps, "seconds": self.seconds, "source": self.source, "wait_share": self.wait_share,
                "unit": self.unit}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _usable(step: dict[str, Any]) -> bool:
    return _number(step.get("wall_s")) and _number(step.get("batch_size"))


def per_step(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps that know no batch size count one each: their rate is steps/s."""
    return [dict(s, batch_size=1) for s in steps if isinstance(s, dict) and _number(s.get("wall_s"))]


def window_groups(steps: list[dict[str, Any]]) -> tuple[list[list[dict]], str]:
    """The steps grouped as the trial measured them: its windows, else blocks of its profiled steps."""
    windows: dict[int, list[dict]] = {}
    for step in steps:
        if isinstance(step.get("window"), int) and _usable(step):
            windows.setdefault(step["window"], []).append(step)
    if windows:
        return [windows[k] for k in sorted(windows)], "windows"
    recorded = [s for s in steps if s.get("recorded") and _usable(s)]
    alternating = lag1_autocorrelation([s["wall_s"] for s in recorded]) < -0.3
    size = BLOCK_STEPS if alternating and len(recorded) >= 2 * BLOCK_STEPS else 1
    return chunks(recorded, size), "blocks" if size > 1 else "steps"


def chunks(steps: list[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    """Consecutive steps `size` at a time, a short last chunk joined to the one before it."""
    blocks = [steps[i:i + size] for i in range(0, len(steps), size)]
    if len(blocks) > 1 and len(blocks[-1]) < size:
        last = blocks.pop()  # popped first: with two blocks, [-2] is gone once it is
        blocks[-1] = blocks[-1] + last
    return blocks


def lag1_autocorrelation(values: list[float]) -> float:
    """Correlation of each value with the next: about 0 for independent steps, negative when they alternate."""
    if len(values) < 3:
        return 0.0
    mean = statistics.fmean(values)
    dev = [v - mean for v in values]
    var = sum(d * d for d in dev)
    return sum(a * b for a, b in zip(dev, dev[1:])) / var if var else 0.0


def window_blocks(window: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """A window's steps as (samples, seconds) of blocks of MIN_WINDOW_STEPS consecutive steps (a short last block
    joins the one before): a noise estimate where the windows give none, or one of a single degree of freedom.
    Read within a window, it can only understate the spread between windows."""
    return [(sum(s["batch_size"] for s in b), sum(s["wall_s"] for s in b)) for b in chunks(window, MIN_WINDOW_STEPS)]


def ratio_relative_se(groups: list[tuple[float, float]]) -> float | None:
    """Relative standard error of R = Σ samples / Σ seconds over groups (samples, seconds).

    The ratio estimator's linearised variance: residuals e_i = samples_i − R·seconds_i, var(R) ≈
    Σ e_i² / (n (n − 1) · mean(seconds)²). Windows of unequal length are weighted by their length.
    """
    n = len(groups)
    if n < 2:
        return None
    samples = sum(s for s, _ in groups)
    seconds = sum(t for _, t in groups)
    if seconds <= 0 or samples <= 0:
        return None
    rate = samples / seconds
    residual = sum((s - rate * t) ** 2 for s, t in groups)
    variance = residual / (n * (n - 1) * (seconds / n) ** 2)
    return math.sqrt(variance) / rate


def measure(runs: Iterable[list[dict[str, Any]]]) -> Measurement:
    """The pooled measurement of one or more runs (each a trial's step records) of the same settings, in
    samples/s; in steps/s where no step of any run knew its batch size."""
    runs = [list(run) for run in runs]
    unit = "samples/s"
    if not any(_usable(s) for run in runs for s in run if isinstance(s, dict)):
        runs, unit = [per_step(run) for run in runs], "steps/s"
    groups: list[tuple[float, float]] = []
    rates, sources, cuts = [], set(), []
    steps = 0
    waited = walls = 0.0
    for run in runs:
        cut, source = window_groups(run)
        sources.add(source)
        cuts += cut
        for group in cut:
            samples = sum(s["batch_size"] for s in group)
            seconds = sum(s["wall_s"] for s in group)
            groups.append((samples, seconds))
            rates.append(samples / seconds)
            steps += len(group)
            for s in group:
                # Waiting for data: the time outside the step's call (with no step function, the
                # harness makes that the time in the DataLoader's __next__).
                call = s.get("call_s")
                if isinstance(call, (int, float)) and math.isfinite(call):
                    waited += max(0.0, s["wall_s"] - call)
                    walls += s["wall_s"]
    samples = sum(s for s, _ in groups)
    seconds = sum(t for _, t in groups)
    source = "windows" if sources == {"windows"} else ("blocks" if "blocks" in sources else "steps")
    se = ratio_relative_se(groups)
    if source == "windows" and len(cuts) < 3:
        # The script ended within its first windows: one gives no spread, two a spread of one degree of freedom,
        # which two windows that happen to agree make nil (an MLP's baseline: 7270 and 7274 samples/s, ±0.03 %,
        # and a batch of 128 was reverted as 13 % slower on it). Their steps in blocks say at least as much.
        blocks = ratio_relative_se([block for cut in cuts for block in window_blocks(cut)])
        se = max((x for x in (se, blocks) if x is not None), default=None)
    return Measurement(
        samples_per_s=samples / seconds if seconds > 0 else None,
        relative_se=se,
        windows=tuple(rates),
        steps=steps,
        seconds=seconds,
        source=source,
        wait_share=waited / walls if walls > 0 else None,
        unit=unit,
    )


def job(ranks: list[Measurement]) -> Measurement:
    """The measurement of a data-parallel job from each rank's: samples/s summed (every rank trains on its
    own batches), standard errors added in quadrature, the longest wait (a straggler's) kept."""
    if len(ranks) == 1:
        return ranks[0]
    rates = [m.samples_per_s for m in ranks]
    if not all(rates):
        return Measurement(None, None, (), sum(m.steps for m in ranks), max(m.seconds for m in ranks),
                           ranks[0].source, None, ranks[0].unit)
    total = sum(rates)
    known = [m for m in ranks if m.relative_se is not None]
    se = math.sqrt(sum((m.relative_se * m.samples_per_s) ** 2 for m in known)) / total if known else None
    waits = [m.wait_share for m in ranks if m.wait_share is not None]
    width = min(len(m.windows) for m in ranks)
    return Measurement(total, se, tuple(sum(m.windows[i] for m in ranks) for i in range(width)),
                       sum(m.steps for m in ranks), max(m.seconds for m in ranks), ranks[0].source,
                       max(waits) if waits else None, ranks[0].unit)


def noise(a: Measurement, b: Measurement) -> float:
    """Relative change between the two that chance alone could produce (about 95%): twice the standard
    error of the difference. A measurement without a noise estimate (one window) counts as noisy as
    the other; two such are compared without one (0)."""
    se_a = a.relative_se if a.relative_se is not None else b.relative_se
    se_b = b.relative_se if b.relative_se is not None else a.relative_se
    return 2 * math.hypot(se_a or 0.0, se_b or 0.0)

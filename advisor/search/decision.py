"""Whether a tried change is kept: beyond the measured noise (and the least gain worth keeping), with a
finite loss not far above the baseline's. Torch-free."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from advisor.trials.record.measurement import Measurement, noise


LOSS_TOLERANCE = 0.25  # a kept change may raise the loss by at most this share of the baseline's


@dataclass(frozen=True)
class Decision:
    """Keep or revert a candidate, and the measured figures behind it."""

    keep: bool
    reason: str
    gain: float
    noise: float
    inconclusive: bool = False  # a gain worth keeping but within the noise: worth measuring again


def decide(best: Measurement, candidate: Measurement, candidate_losses: list[float],
           reference_losses: list[float], min_gain: float, *, addresses_bound: bool = False) -> Decision:
    """Keep a candidate only beyond the measured noise (and `min_gain`) with a finite loss not far above the
    reference's.

    The noise is two standard errors of the difference (about 95%). A change that addresses the bound
    the best trial measured is expected to help, so one standard error of evidence is enough for it
    (about 84% one-sided); a change tried in a round over the knobs needs two.
    """
    if not candidate.samples_per_s or not best.samples_per_s:
        return Decision(False, "no throughput measured", 0.0, 0.0)
    unit = candidate.unit  # steps/s where no step knew its batch size
    gain = candidate.samples_per_s / best.samples_per_s - 1
    spread = noise(best, candidate)
    threshold = max(min_gain, spread / 2 if addresses_bound else spread)
    if candidate_losses and not all(math.isfinite(x) for x in candidate_losses):
        return Decision(False, "loss is not finite", gain, spread)
    if candidate_losses and reference_losses and all(math.isfinite(x) for x in reference_losses):
        base, cand = statistics.median(reference_losses), statistics.median(candidate_losses)
        allowed = max(LOSS_TOLERANCE * abs(base), max(reference_losses) - min(reference_losses))
        # Only a loss that rose: a trial whose loader took longer to start profiles steps later in training,
        # where the loss is lower (an H200's trial with 14 workers waited 29 steps where the baseline waited 2).
        if cand - base > allowed:
            return Decision(False, f"loss rose from {base:.4g} to {cand:.4g} (more than {allowed:.3g})", gain, spread)
    # The noise said is always `spread` (the row's "noise", the report's column); the bar it was held to, where
    # that differs: one standard error for a change that addresses the bound, or the least gain worth keeping.
    bar = "" if threshold == spread else f"; the bar {100 * threshold:.1f}%: " + (
        "one standard error, the change addresses the bound" if threshold < spread else "the least gain kept")
    said = f"noise {100 * spread:.1f}%{bar}"
    if gain < -threshold:
        return Decision(False, f"{100 * gain:+.1f}% {unit}: slower ({said})", gain, spread)
    if gain <= threshold:
        where = "within the noise" if abs(gain) <= spread else "short of the bar"
        return Decision(False, f"{100 * gain:+.1f}% {unit} is {where} ({said})", gain, spread,
                        inconclusive=gain > min_gain)
    return Decision(True, f"{100 * gain:+.1f}% {unit} ({said})", gain, spread)

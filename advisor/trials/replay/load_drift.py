"""A machine whose load comes and goes, for replayed sessions: `--replay-drift D`.

The load factor L(t) over the session's simulated time (seconds) is piecewise constant: spells of
exponentially distributed length (mean `period_s`), each quiet (L = 1) or loaded (L = 1 + D·u, u drawn
between 0.5 and 1), half and half, from a seeded generator. A step served at time t runs L(t) times
slower than recorded: another job switched on and off beside the trial, at a strength that changes.
The load is other processes' use, so a replayed trial reports it beside each window, as a live trial's
`advisor.trials.harness.machine_load` does: 1 − 1/L of the machine.
"""

from __future__ import annotations

import bisect
import random

PERIOD_S = 20.0  # mean length of a spell of one load, in simulated seconds (a job switched every ~20 s)


class LoadDrift:
    """The load factor L(t) ≥ 1 at simulated time t, drawn lazily and reproducibly from `seed`."""

    def __init__(self, strength: float, seed: int = 0, period_s: float = PERIOD_S):
        self.strength, self.period_s = strength, period_s
        self.random = random.Random(f"drift-{seed}")
        self.starts: list[float] = [0.0]
        self.factors: list[float] = [self._draw()]

    def _draw(self) -> float:
        if self.random.random() < 0.5:
            return 1.0
        return 1.0 + self.strength * self.random.uniform(0.5, 1.0)

    def factor(self, t: float) -> float:
        """How many times slower than recorded a step at time t runs."""
        while self.starts[-1] <= t:
            self.starts.append(self.starts[-1] + self.random.expovariate(1.0 / self.period_s))
            self.factors.append(self._draw())
        return self.factors[bisect.bisect_right(self.starts, t) - 1]


def other_load(factor: float) -> float:
    """The share of the machine other processes take when they slow a step `factor` times."""
    return round(1.0 - 1.0 / factor, 4)

"""What the grid benchmarks share: one real trial's samples/s, and the re-measure of two winners (the
maximum of many noisy trials is biased upwards, so both are measured again, alternately, and their medians
compared)."""

from __future__ import annotations

import statistics
from pathlib import Path

from advisor.trials.knobs import Knobs
from advisor.trials.runner import run_trial

STEPS = 5
WINDOWS, WINDOW_S = 3, 1.0  # every trial, grid and session alike, measures its steady state the same way
REMEASURE = 5


def measure(target: str, knobs: Knobs, folder: Path, name: str) -> float:
    """Samples/s of one real trial on the CPU (0 if it failed)."""
    result = run_trial(target, knobs, folder / name, name=name, steps=STEPS, profile=True, device="cpu",
                       windows=WINDOWS, window_s=WINDOW_S)
    return (result.samples_per_s or 0.0) if result.ok else 0.0


def remeasure(target: str, grid_knobs: Knobs, advisor_knobs: Knobs, folder: Path) -> tuple[float, float]:
    """Median samples/s of the grid's and the advisor's best, each measured REMEASURE times, alternately
    (so that drift in the machine's load hits both alike)."""
    grid, advisor = [], []
    for r in range(REMEASURE):
        grid.append(measure(target, grid_knobs, folder, f"grid-{r}"))
        advisor.append(measure(target, advisor_knobs, folder, f"advisor-{r}"))
    return statistics.median(grid), statistics.median(advisor)

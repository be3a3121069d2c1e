"""What the grid benchmarks share: one real trial's samples/s, and the re-measure of two winners (the
maximum of many noisy trials is biased upwards, so both are measured again, alternately, and their medians
compared)."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

from advisor.trials.knobs import Knobs
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec

STEPS = 5
WINDOWS, WINDOW_S = 3, 1.0  # every trial, grid and session alike, measures its steady state the same way
REMEASURE = 5


def measure(target: str, knobs: Knobs, folder: Path, name: str) -> float:
    """Samples/s of one real trial on the CPU (0 if it failed)."""
    result = run_trial(TrialSpec(target, knobs, folder / name, name=name, steps=STEPS, profile=True, device="cpu",
                                 windows=WINDOWS, window_s=WINDOW_S))
    return (result.samples_per_s or 0.0) if result.ok else 0.0


def measure_grid(target: str, values: dict[str, list], knobs_of, folder: Path) -> list[tuple[float, dict]]:
    """Every combination of the values as one real trial: (samples/s, point) each, printed as it goes."""
    points = [dict(zip(values, combo)) for combo in itertools.product(*values.values())]
    grid = []
    for i, point in enumerate(points):
        sps = measure(target, knobs_of(point), folder, f"{i:02d}")
        grid.append((sps, point))
        print(f"  grid {i + 1:2d}/{len(points)} {point}: {sps:.1f} samples/s", flush=True)
    return grid


def remeasure(target: str, grid_knobs: Knobs, advisor_knobs: Knobs, folder: Path) -> tuple[float, float]:
    """Median samples/s of the grid's and the advisor's best, each measured REMEASURE times, alternately
    (so that drift in the machine's load hits both alike); one figure for both where the session found the
    grid's best setting itself (two medians of one setting differ by the noise alone)."""
    if grid_knobs.to_dict() == advisor_knobs.to_dict():
        print("  the session's best is the grid's best setting: measured once for both")
        same = statistics.median(measure(target, grid_knobs, folder, f"both-{r}") for r in range(REMEASURE))
        return same, same
    grid, advisor = [], []
    for r in range(REMEASURE):
        grid.append(measure(target, grid_knobs, folder, f"grid-{r}"))
        advisor.append(measure(target, advisor_knobs, folder, f"advisor-{r}"))
    return statistics.median(grid), statistics.median(advisor)


def floor_met(session: float, grid: float, trials: int, points: int) -> int:
    """Print the ratio and whether the floor is met (95% of the grid's best, at most a third of its points);
    the exit code."""
    print(f"  ratio session/grid: {session / grid:.3f} samples/s; trials {trials}/{points} = {trials / points:.2f}")
    ok = session >= 0.95 * grid and trials <= points / 3
    print(f"  {'PASS' if ok else 'FAIL'}: at least 95% of the grid's best with at most a third of its points")
    return 0 if ok else 1

"""Benchmark: the advisor's sequence against an exhaustive grid over the same knob values.

Reference example: examples/char_transformer.py (compute-bound; `SEARCH_EXAMPLE=image_classifier` for the
DataLoader-bound one). The grid runs every combination of the values the sequence can reach on this
machine — num_workers {user's, 2, 4, ...} up to the CPU count, amp {off, bf16}, batch {32, 64, 128} — as
real trials. The advisor runs with a budget of
a third of the grid's trials. Both winners are then re-measured alternately (the maximum of many noisy
trials is biased upwards), and their median samples/s compared.

Floor (issue 4): the advisor reaches at least 95% of the grid's best samples/s with at most a third of the
grid's trials. Exit code 1 if it does not.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from advisor.trials.knobs import Knobs  # noqa: E402
from advisor.search.session import run_session  # noqa: E402
from advisor.search.state import SessionOptions, document  # noqa: E402
from grid import STEPS, WINDOW_S, WINDOWS, floor_met, measure_grid, remeasure  # noqa: E402

EXAMPLE = os.environ.get("SEARCH_EXAMPLE", "char_transformer")
TARGET = f"{ROOT / 'examples' / (EXAMPLE + '.py')}:train_step"


def grid_values() -> dict[str, list]:
    """The knob values the advisor's sequence can reach here."""
    workers = [0] + [w for w in (2, 4, 8, 16) if w <= (os.cpu_count() or 1)]
    return {"num_workers": workers, "amp": [None, "bf16"], "batch_size": [32, 64, 128]}


def knobs_of(values: dict) -> Knobs:
    """Knobs for one grid point (the example's own values stay unset, as in the sequence)."""
    workers = values["num_workers"]
    return Knobs(amp=values["amp"], batch_size=None if values["batch_size"] == 32 else values["batch_size"],
                 num_workers=workers or None, persistent_workers=True if workers else None)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        grid = measure_grid(TARGET, grid_values(), knobs_of, tmp / "grid")
        points, budget = [p for _, p in grid], len(grid) // 3
        grid_best_sps, grid_best = max(grid, key=lambda g: g[0])
        options = SessionOptions(steps=STEPS, max_trials=budget, device="cpu", windows=WINDOWS, window_s=WINDOW_S)
        state = run_session(TARGET, tmp / "session", options,
                            log=lambda m: print("  advisor " + m, flush=True))
        state = document(state)  # the record as session.json holds it
        best_row = next(t for t in state["trials"] if t["name"] == state["best"])
        advisor_knobs = Knobs.from_dict(best_row["knobs"])
        g, a = remeasure(TARGET, knobs_of(grid_best), advisor_knobs, tmp / "again")
    trials = len(state["trials"])
    print(f"search quality ({EXAMPLE}, {len(points)}-point grid, advisor budget {budget} trials)")
    print(f"  grid best    : {grid_best} {grid_best_sps:.1f} samples/s in its trial, {g:.1f} re-measured")
    print(f"  advisor best : {advisor_knobs.label() or 'as written'} {best_row['samples_per_s']:.1f} samples/s "
          f"in its trial, {a:.1f} re-measured, after {trials} trials")
    return floor_met(a, g, trials, len(points))


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: the advisor's session against a CPU grid over the model knobs and the batch, on the
convolutional example (examples/conv_classifier.py, compute-bound here).

The grid runs every combination of AMP {off, bf16 where the CPU computes bf16} × channels_last {off, on} ×
torch.compile {off, on} × batch {32, 64, 128} as real trials (compile time is not in samples/s: it runs in
the steps before the measured windows). The session runs with a budget of a third of the grid's points.
Both winners are re-measured alternately and their medians compared (one figure for both where the session
found the grid's best setting itself).

Floor (issue 25): the session reaches at least 95% of the grid's best samples/s with at most a third of the
grid's points. It also prints what the session found and what it cost in time, compile included.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from advisor.trials.harness.trial_facts import device_facts  # noqa: E402
from advisor.trials.knobs import Knobs  # noqa: E402
from advisor.search.session import run_session  # noqa: E402
from advisor.search.state import SessionOptions, document  # noqa: E402
from grid import STEPS, WINDOW_S, WINDOWS, floor_met, measure_grid, remeasure  # noqa: E402

TARGET = f"{ROOT / 'examples' / 'conv_classifier.py'}:train_step"


def grid_values() -> dict[str, list]:
    """The knob values the session can reach on this CPU (bf16 autocast only where it computes bf16)."""
    bf16 = (device_facts("cpu").get("cpu") or {}).get("bf16_instructions")
    return {"amp": [None, "bf16"] if bf16 else [None], "channels_last": [False, True], "compile": [False, True],
            "batch_size": [32, 64, 128]}


def knobs_of(point: dict) -> Knobs:
    """Knobs for one grid point (the example's own values stay unset, as in the session)."""
    return Knobs(amp=point["amp"], channels_last=point["channels_last"] or None, compile=point["compile"] or None,
                 batch_size=None if point["batch_size"] == 32 else point["batch_size"])


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        started = time.monotonic()
        grid = measure_grid(TARGET, grid_values(), knobs_of, tmp / "grid")
        points, budget = [p for _, p in grid], len(grid) // 3
        grid_s = time.monotonic() - started
        grid_best_sps, grid_best = max(grid, key=lambda g: g[0])
        options = SessionOptions(steps=STEPS, max_trials=budget, device="cpu", windows=WINDOWS, window_s=WINDOW_S)
        started = time.monotonic()
        state = run_session(TARGET, tmp / "session", options, log=lambda m: print("  advisor " + m, flush=True))
        state = document(state)  # the record as session.json holds it
        session_s = time.monotonic() - started
        best_row = next(t for t in state["trials"] if t["name"] == state["best"])
        advisor_knobs = Knobs.from_dict(best_row["knobs"])
        g, a = remeasure(TARGET, knobs_of(grid_best), advisor_knobs, tmp / "again")
    trials = len(state["trials"])
    compiles = [t["compile"]["compile_s"] for t in state["trials"] if (t.get("compile") or {}).get("compile_s")]
    print(f"knob grid (conv_classifier, {len(points)}-point grid in {grid_s:.0f} s, session budget {budget} trials)")
    print(f"  grid best    : {grid_best} {grid_best_sps:.1f} samples/s in its trial, {g:.1f} re-measured")
    print(f"  session best : {advisor_knobs.label()} {best_row['samples_per_s']:.1f} samples/s in its trial, "
          f"{a:.1f} re-measured, after {trials} trials in {session_s:.0f} s "
          f"({len(compiles)} compiles, {sum(compiles):.0f} s of compile time)")
    for t in state["trials"]:
        print(f"    {t['name']}: {t['change']}: {t['decision']} ({t['reason']})")
    return floor_met(a, g, trials, len(points))


if __name__ == "__main__":
    sys.exit(main())

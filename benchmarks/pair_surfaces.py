"""Response surfaces where two knobs pay only together, made from real trial folders with set throughputs.

The recorded H100 surface binds on the loader everywhere, so one knob at a time finds its best. Real GPUs
have pairs: pinned copies pay only with more workers (and more workers only with pinned copies), bf16
pays only with a larger batch. Each surface here copies real trial folders (their traces, steps and
device facts as recorded) to every point of a grid, names the point's settings in its `trial.json`, and
sets its samples/s from a table (its steps scaled to match), so that the search is tested on a known
best that needs two moves:

- `pinning_workers` (40 points, from `tests/data/surfaces/h100-image-classifier`): workers 8 → 14 with
  pageable copies reads −2% (the copies staged on the training thread cap the loader), pinning alone at 8
  workers +3.5%, both together +77%; AMP and a larger batch cost a little (the loader binds).
- `amp_batch` (18 points, from `sample_runs/char_transformer`, a CPU with bf16 instructions, compute-bound):
  bf16 alone −2%, batch 32 → 64 alone −2%, both +40% (batch 128 with bf16: +30%); workers change nothing.

    build_surface(name, folder) -> (points folder, {settings: samples/s})
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "tests" / "data" / "surfaces" / "h100-image-classifier"
CHAR = ROOT / "sample_runs" / "char_transformer" / "trials"


def _pinning_workers() -> dict[tuple, tuple[Path, float]]:
    """(amp, batch, workers, pinned) → (real folder, samples/s)."""
    pageable = {0: 140, 2: 300, 4: 600, 8: 1000, 14: 980}
    pinned = {0: 137, 2: 303, 4: 612, 8: 1035, 14: 1770}
    grid = {}
    for amp, batch, workers, pin in itertools.product((None, "bf16"), (32, 64), (0, 2, 4, 8, 14), (False, True)):
        rate = (pinned if pin else pageable)[workers] * (0.98 if amp else 1.0) * (0.97 if batch == 64 else 1.0)
        source = H100 / f"{amp or 'fp32'}-b{batch}-w{workers}-{'pin' if pin else 'pageable'}"
        grid[(amp, batch, workers, pin)] = (source, rate)
    return grid


def _amp_batch() -> dict[tuple, tuple[Path, float]]:
    """(amp, batch, workers, pinned) → (real folder, samples/s)."""
    factor = {(None, 32): 1.0, (None, 64): 0.98, (None, 128): 0.96,
              ("bf16", 32): 0.98, ("bf16", 64): 1.40, ("bf16", 128): 1.30}
    source = {32: "01-amp-bf16", 64: "02-batch-64", 128: "03-batch-128"}
    grid = {}
    for (amp, batch), workers in itertools.product(factor, (0, 2, 4)):
        folder = CHAR / ("00-baseline" if (amp, batch) == (None, 32) else source[batch])
        grid[(amp, batch, workers, False)] = (folder, 80.0 * factor[(amp, batch)] * (0.99 if workers else 1.0))
    return grid


SURFACES = {"pinning_workers": _pinning_workers, "amp_batch": _amp_batch}


def set_point(source: Path, folder: Path, settings: tuple, rate: float) -> None:
    """Copy a real trial folder to `folder` as the point `settings` = (amp, batch, workers, pinned), its
    samples/s `rate` (the recorded steps' times scaled to it, their shape kept)."""
    amp, batch, workers, pin = settings
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("events.out.tfevents.*", "output.log"))
    path = folder / "trial.json"
    record = json.loads(path.read_text())
    record["knobs"] = {**(record.get("knobs") or {}), "amp": amp, "batch_size": batch, "num_workers": workers,
                       "persistent_workers": True if workers else None, "pin_memory": pin, "non_blocking": pin}
    steps = [s for s in record.get("steps") or [] if "window" not in s]
    recorded = [s for s in steps if s.get("recorded")] or steps
    was = sum(s.get("batch_size") or batch for s in recorded) / sum(s["wall_s"] for s in recorded)
    scale = (was / rate) * (batch / (recorded[0].get("batch_size") or batch))
    for s in steps:
        s["wall_s"] *= scale
        if s.get("call_s") is not None:
            s["call_s"] *= scale
        s["batch_size"] = batch
    record["steps"] = steps
    summary = record.setdefault("summary", {})
    summary.update(samples_per_s=rate, batch_size=batch, steady=None)
    path.write_text(json.dumps(record))


def build_surface(name: str, folder: Path) -> tuple[Path, dict[tuple, float]]:
    """Write the surface `name` of SURFACES into `folder`; its points' settings and samples/s."""
    grid = SURFACES[name]()
    for settings, (source, rate) in grid.items():
        amp, batch, workers, pin = settings
        set_point(source, folder / f"{amp or 'fp32'}-b{batch}-w{workers}-{'pin' if pin else 'pageable'}",
                  settings, rate)
    return folder, {s: rate for s, (_, rate) in grid.items()}

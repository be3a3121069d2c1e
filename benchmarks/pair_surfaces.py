"""Response surfaces where knobs pay only together, made from real trial folders with set throughputs.

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
- `four_changes` (100 points, from the H100 surface: fp32/bf16 × batch 32–512 × workers 0–14 × pageable/
  pinned, the script's own settings batch 32 with 4 workers, as the image classifier of seed 004): a step
  whose loader and training thread each hold part of it (`_partial_bound`), so that its best (bf16, batch 512,
  14 workers, pinned copies: ×3.7) needs four changes together. From the baseline bf16 alone reads +0.4%
  and pinned copies +4% (noise hides both); with the loader fed (14 workers) pinned copies pay +37%, bf16
  +15% and batch 128 → 512 +12%. Each point's steps keep the share of time the loop waits for data that
  its bound gives.
- `four_changes_holes`: the same with a tenth of its settings removed (never the script's own): a trial
  there fails, as a live setting that runs out of memory or crashes.
- `ridge` (90 points, from the H100 surface, the script's own settings batch 32 with no workers, as the
  seed-004 image classifier a user tried on an H100): a ridge that one move at a time walks off. Batch alone
  +1-8 %; at batch 32 more workers than 4 slow the step (−9 %, −13 %: each worker's batches cost the training
  thread) where at batch 128 the same move gains +26 %; pinned copies cost −10 % at batch 32 (the pinning
  thread sits in the loader's path) and gain +89 % at batch 128 with 14 workers (the pageable copies staged on
  the training thread were its bound); bf16 +5 % under the loader bound. The best (bf16, batch 512, 14 workers,
  pinned: ×4.85) needs batch ≥ 128, 14 workers and pinned copies together; fp32 alone reaches ×4.23; fp32 at
  batch 512 runs out of memory (no point: the trial fails).

    build_surface(name, folder) -> (points folder, {settings: samples/s})
"""

from __future__ import annotations

import itertools
import json
import math
import random
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


def _partial_bound(amp: str | None, batch: int, workers: int, pin: bool) -> tuple[float, float]:
    """(samples/s, the training thread's share of the step) of a step that the loader and the training
    thread each partly bind: the loader's time per sample (its workers, a little faster per sample with a
    larger batch), the training thread's (a fixed cost per step, bf16's casts among it; its compute, less in
    bf16; its copies, staged on the thread when pageable); with workers, the larger of the two and 30% of
    the other (their overlap is partial), without, both in turn."""
    loader = 1 / ({0: 150, 2: 310, 4: 600, 8: 1150, 14: 1950}[workers] * (1 + 0.05 * math.log2(batch / 32)))
    train = (0.010 + (0.004 if amp else 0.0)) / batch + (2.5e-4 if amp else 4.0e-4) + (0.5e-4 if pin else 3.0e-4)
    step = loader + train if workers == 0 else max(loader, train) + 0.3 * min(loader, train)
    return 1 / step, min(1.0, train / step)


FOUR_CHANGES_USER = {"batch_size": 32, "num_workers": 4, "pin_memory": False, "persistent_workers": True,
                     "prefetch_factor": None}


def _four_changes(holes: bool = False) -> dict[tuple, tuple[Path, float, float]]:
    """(amp, batch, workers, pinned) → (real folder, samples/s, busy share); `holes`: a tenth left out."""
    grid = {}
    for amp, batch, workers, pin in itertools.product((None, "bf16"), (32, 64, 128, 256, 512), (0, 2, 4, 8, 14),
                                                      (False, True)):
        source = H100 / f"{amp or 'fp32'}-b{min(batch, 128 if amp is None or workers == 0 else 64)}-w{workers}-" \
                        f"{'pin' if pin else 'pageable'}"
        grid[(amp, batch, workers, pin)] = (source, *_partial_bound(amp, batch, workers, pin))
    if holes:  # a tenth of the settings, never the script's own, drawn once
        own = (None, 32, 4, False)
        for settings in random.Random("holes").sample(sorted(set(grid) - {own}, key=str), len(grid) // 10):
            del grid[settings]
    return grid


def _ridge_rate(amp: str | None, batch: int, workers: int, pin: bool) -> tuple[float, float]:
    """(samples/s, the training thread's share of the step) of the ridge: per sample (ms), the loader (its
    workers' rate, the pinning thread's cost per batch where copies are pinned) and the training thread (a
    cost per step and per worker, its compute, less in bf16, its copies, staged on it when pageable); with
    workers the larger of the two and a fifth of the other, without, both in turn."""
    train = (14 + 2 * workers) / batch + (0.05 if amp else 0.35) + (0.1 if pin else 0.96)
    if workers == 0:
        step = 1.8 + train
    else:
        loader = 1000 / {2: 300, 4: 520, 8: 540, 14: 1530}[workers] + (16 / batch if pin else 0.0)
        step = max(loader, train) + 0.2 * min(loader, train)
    return 1000 / step, min(1.0, train / step)


def _ridge() -> dict[tuple, tuple[Path, float, float]]:
    """(amp, batch, workers, pinned) → (real folder, samples/s, busy share); fp32 at batch 512 does not fit."""
    grid = {}
    for amp, batch, workers, pin in itertools.product((None, "bf16"), (32, 64, 128, 256, 512), (0, 2, 4, 8, 14),
                                                      (False, True)):
        if amp is None and batch == 512:
            continue
        source = H100 / f"{amp or 'fp32'}-b{min(batch, 128 if amp is None or workers == 0 else 64)}-w{workers}-" \
                        f"{'pin' if pin else 'pageable'}"
        grid[(amp, batch, workers, pin)] = (source, *_ridge_rate(amp, batch, workers, pin))
    return grid


SURFACES = {"pinning_workers": _pinning_workers, "amp_batch": _amp_batch, "four_changes": _four_changes,
            "four_changes_holes": lambda: _four_changes(holes=True), "ridge": _ridge}
USER_VALUES = {"four_changes": FOUR_CHANGES_USER, "four_changes_holes": FOUR_CHANGES_USER,
               "ridge": dict(FOUR_CHANGES_USER, num_workers=0, persistent_workers=False)}
# The trials a session has on a built surface where a third of its points is more than a user gives: the
# ridge's 19 (the budget the session that walked off it had).
BUDGETS = {"ridge": 19}


def set_point(source: Path, folder: Path, settings: tuple, rate: float, busy: float | None = None,
              user_values: dict | None = None) -> None:
    """Copy a real trial folder to `folder` as the point `settings` = (amp, batch, workers, pinned), its
    samples/s `rate` (the recorded steps' times scaled to it, their shape kept); `busy`: the share of each
    step the training thread held (the rest waiting for data), where the surface sets it; `user_values`:
    the script's own settings, where they are not the source's."""
    amp, batch, workers, pin = settings
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("events.out.tfevents.*", "output.log"))
    path = folder / "trial.json"
    record = json.loads(path.read_text())
    if user_values is not None:
        record["user_values"] = dict(user_values)
    record["knobs"] = {**(record.get("knobs") or {}), "amp": amp, "batch_size": batch, "num_workers": workers,
                       "persistent_workers": True if workers else None, "pin_memory": pin, "non_blocking": pin}
    steps = [s for s in record.get("steps") or [] if "window" not in s]
    recorded = [s for s in steps if s.get("recorded")] or steps
    was = sum(s.get("batch_size") or batch for s in recorded) / sum(s["wall_s"] for s in recorded)
    scale = (was / rate) * (batch / (recorded[0].get("batch_size") or batch))
    for s in steps:
        s["wall_s"] *= scale
        if busy is not None:
            s["call_s"] = s["wall_s"] * busy
        elif s.get("call_s") is not None:
            s["call_s"] *= scale
        s["batch_size"] = batch
    record["steps"] = steps
    summary = record.setdefault("summary", {})
    summary.update(samples_per_s=rate, batch_size=batch, steady=None)
    path.write_text(json.dumps(record))


def build_surface(name: str, folder: Path) -> tuple[Path, dict[tuple, float]]:
    """Write the surface `name` of SURFACES into `folder`; its points' settings and samples/s."""
    grid = SURFACES[name]()
    for settings, (source, rate, *busy) in grid.items():
        amp, batch, workers, pin = settings
        set_point(source, folder / f"{amp or 'fp32'}-b{batch}-w{workers}-{'pin' if pin else 'pageable'}",
                  settings, rate, *busy, user_values=USER_VALUES.get(name))
    return folder, {s: rate for s, (_, rate, *_) in grid.items()}

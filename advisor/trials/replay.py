"""Replay: a session whose trials are served from a recorded response surface instead of being run.

A surface is a folder of trial folders (any names), each a real `trial.json` and its trace, recorded at
many knob settings of the same step (`benchmarks/record_surface.py` records one; `tests/data/surfaces/`
holds one recorded on an H100). Given knobs, the runner serves the recorded trial whose settings they
give (the knobs over the user's own values: AMP, batch size, workers, pinned memory, non_blocking
copies, accumulation; worker persistence and prefetch depth are not told apart), copied into the
session's own folder under the session's trial name. With it the search is tested on real GPU
measurements without a GPU.

A surface may hold several recordings of one setting (folders with the same settings): a re-measure
serves the next one. With `noise` (0 included) each served trial's steady-state windows are drawn afresh
around the recording's samples/s with that relative spread (a seeded generator: the same seed replays
the same session), so every measurement, re-measures included, carries independent noise as on a live
machine, and a setting can be measured again (`remeasure`); at 0 every window is the recorded figure. With
`noise` None the recording is served as it is, and with one recording per setting it cannot be measured
again. The search draws its
candidate values (worker counts, batch sizes, AMP dtypes, pinned copies) from those the surface holds
(`advisor.search.strategy.surface_space`).
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError
from advisor.trials.storage import write_json_atomic
from advisor.trials.knobs import Knobs
from advisor.trials.record import SCHEMA as TRIAL_SCHEMA, TRIAL_FILE, TrialResult, load_trial

SETTINGS = ("amp", "batch_size", "num_workers", "pin_memory", "non_blocking", "accumulation_steps")


@dataclass(frozen=True)
class SurfacePoint:
    """One recorded trial of a surface and the settings it ran with."""

    folder: Path
    settings: tuple
    user_values: dict


def settings_of(knobs: dict[str, Any], user_values: dict[str, Any]) -> tuple:
    """What a trial ran with: each setting the knobs change, over the user's values (defaults where unset)."""
    defaults = {"amp": None, "batch_size": None, "num_workers": 0, "pin_memory": False, "non_blocking": False,
                "accumulation_steps": 1}
    values = []
    for name in SETTINGS:
        value = knobs.get(name)
        if value is None:
            value = user_values.get(name)
        values.append(defaults[name] if value is None else value)
    return tuple(values)


def load_surface(folder: Path | str) -> list[SurfacePoint]:
    """Every recorded trial under a surface folder; one-line errors for a folder that holds none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise AdvisorError(f"{folder}: no such folder (expected a surface: a folder of trial folders)")
    points = []
    for path in sorted(folder.glob(f"*/{TRIAL_FILE}")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise AdvisorError(f"{path}: cannot read the recorded trial: {exc}") from None
        if not isinstance(record, dict) or record.get("schema") != TRIAL_SCHEMA:
            raise AdvisorError(f"{path}: not an {TRIAL_SCHEMA} document")
        user = record.get("user_values") or {}
        points.append(SurfacePoint(path.parent, settings_of(record.get("knobs") or {}, user), user))
    if not points:
        raise AdvisorError(f"{folder}: holds no recorded trials (no */{TRIAL_FILE})")
    return points


NOISE_WINDOWS = 5  # steady-state windows drawn for a served trial under noise
NOISE_WINDOW_STEPS = 4  # steps in each


class ReplayRunner:
    """Serves recorded trials for the session's knobs, into `out/trials/<name>`; with `noise`, each with
    steady-state windows drawn around its recorded samples/s (relative spread `noise`, generator `seed`)."""

    def __init__(self, points: list[SurfacePoint], out: Path, noise: float | None = None, seed: int = 0):
        self.points = points
        self.out = Path(out)
        # The baseline's user values: every point of a surface was recorded from the same step.
        self.user_values = points[0].user_values
        self.by_settings: dict[tuple, list[SurfacePoint]] = {}
        for p in points:
            self.by_settings.setdefault(p.settings, []).append(p)
        self.served: dict[tuple, int] = {}
        self.noise = noise
        self.random = random.Random(seed)
        # Measuring a setting again counts new steps only where there are new ones to count.
        self.remeasure = noise is not None or any(len(v) > 1 for v in self.by_settings.values())

    def __call__(self, name: str, knobs: Knobs) -> TrialResult:
        folder = self.out / "trials" / name
        if folder.exists():
            raise AdvisorError(f"{folder}: already holds a trial; choose another folder")
        wanted = settings_of(knobs.to_dict(), self.user_values)
        recordings = self.by_settings.get(wanted)
        if not recordings:
            return self._not_recorded(folder, name, knobs, wanted)
        served = self.served.get(wanted, 0)
        self.served[wanted] = served + 1
        point = recordings[served % len(recordings)]  # a re-measure serves the next recording
        shutil.copytree(point.folder, folder)
        record = json.loads((folder / TRIAL_FILE).read_text())
        record.update(name=name, knobs=knobs.to_dict(), replayed_from=str(point.folder))
        if self.noise is not None and record.get("status") == "ok":
            self._draw_windows(record)
        write_json_atomic(folder / TRIAL_FILE, record)
        return load_trial(folder)

    def _draw_windows(self, record: dict[str, Any]) -> None:
        """Replace the record's steady-state windows by NOISE_WINDOWS drawn around its samples/s: each
        window's rate × (1 + noise · N(0, 1)), its steps keeping the recorded share of time spent waiting
        for data (so the bound the session reads is the recording's)."""
        from advisor.trials.measurement import measure

        summary = record.get("summary") or {}
        rate, batch = summary.get("samples_per_s"), summary.get("batch_size")
        profiled = [s for s in record.get("steps") or [] if "window" not in s]
        if not rate or not batch:
            return
        shares = [min(1.0, s["call_s"] / s["wall_s"]) for s in profiled if s.get("recorded")
                  and s.get("wall_s") and s.get("call_s") is not None]
        busy = statistics.median(shares) if shares else 1.0
        steps, index = list(profiled), len(profiled)
        for window in range(NOISE_WINDOWS):
            drawn = rate * max(0.05, 1 + self.noise * self.random.gauss(0.0, 1.0))
            for _ in range(NOISE_WINDOW_STEPS):
                wall = batch / drawn
                steps.append({"index": index, "wall_s": wall, "call_s": wall * busy, "data_s": wall * (1 - busy),
                              "recorded": False, "phase": "window", "window": window, "batch_size": batch,
                              "loss": summary.get("loss")})
                index += 1
        record["steps"] = steps
        steady = measure([steps])
        summary.update(steady=steady.to_dict(), samples_per_s=steady.samples_per_s)
        record["replay_noise"] = self.noise

    def _not_recorded(self, folder: Path, name: str, knobs: Knobs, wanted: tuple) -> TrialResult:
        """A trial the surface cannot serve: recorded as an error, so the session goes on without it."""
        folder.mkdir(parents=True)
        text = ", ".join(f"{k}={v}" for k, v in zip(SETTINGS, wanted))
        now = time.time()
        record = {"schema": TRIAL_SCHEMA, "name": name, "target": "replay", "script": None, "script_args": [],
                  "device": None, "knobs": knobs.to_dict(), "knob_outcomes": {}, "user_values": self.user_values,
                  "dataloaders": [], "status": "error", "message": f"the surface holds no trial with {text}",
                  "device_facts": None, "steps": [], "summary": None, "trace_files": [],
                  "times": {"started_at": now, "ended_at": now, "duration_s": 0.0}}
        write_json_atomic(folder / TRIAL_FILE, record)
        return load_trial(folder)

"""Replay: a session whose trials are served from a recorded response surface instead of being run.

A surface is a folder of trial folders (any names), each a real `trial.json` and its trace, recorded at
many knob settings of the same step (`benchmarks/record_surface.py` records one; `tests/data/surfaces/`
holds one recorded on an H100). Given knobs, the runner serves the recorded trial whose settings they
give (the knobs over the user's own values: AMP, batch size, workers, pinned memory, non_blocking
copies, accumulation, threads, 8-bit copies and the model knobs; worker persistence and prefetch depth are
not told apart), copied into the session's own folder under the session's trial name. With it the search is
tested on real GPU measurements without a GPU.

A surface may hold several recordings of one setting (folders with the same settings): a re-measure
serves the next one, with the trace of the setting's first recording where its own was not kept
(`record_surface.py --traces first`), as a live re-measure profiles the same step again.

With `noise` (0 included) each served trial's steady-state windows are drawn afresh around the setting's
samples/s (the median of its recordings, the truth a bench judges the session by: drawn around each recording's
own figure, the setting's truth would change with how often it is served) with that relative spread (a seeded
generator: the same seed replays the same session), so every measurement, re-measures included, carries
independent noise as on a live machine, and a setting can be measured again (`remeasure`); at 0 every window is
that figure. With `noise` None the recording is served as it is, and with one recording per setting it cannot be
measured again. Measured against the best (`against`, `advisor.trials.record.adaptive`), a served trial draws
windows until they settle the comparison, as a live trial measures them. With `drift`
(`advisor.trials.replay.load_drift`) a load that comes and goes slows each step served at its time, and each
window reports it. With `draws` each served trial is a process of its own: its windows are drawn around its
setting's samples/s × (1 + draws · N(0, 1)), one draw a trial, as a live setting runs at a level of its own in
each process (`advisor.search.draws`).

Every served trial is placed on a simulated clock: it costs its recorded start-up, profiled steps and
end, and its drawn windows (each slowed by the load at its time), so `times` in its record read as a live
trial's and the session's wall time (and time to the best) is that of the recorded machine. The search draws its
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
from advisor.files import regular_traces_in
from advisor.trials.record.storage import write_json_atomic
from advisor.knobs import BY_NAME, FLAG, KNOBS
from advisor.trials.knobs import Knobs
from advisor.trials.record import SCHEMA as TRIAL_SCHEMA, TRIAL_FILE, TrialResult, load_trial
from advisor.trials.record.adaptive import Against, settled
from advisor.trials.replay.load_drift import LoadDrift, other_load

# What tells two recorded settings apart: the knobs a surface holds (`Knob.on_surface`: the loader's and the
# step's, the threads, the model knobs, 8-bit copies; a CPU truth surface varies those).
SETTINGS = tuple(k.name for k in KNOBS if k.on_surface)
# The on/off knobs among them: off where neither knob nor script sets them.
SWITCHES = tuple(k.name for k in KNOBS if k.on_surface and k.kind == FLAG)


@dataclass(frozen=True)
class SurfacePoint:
    """One recorded trial of a surface and the settings it ran with."""

    folder: Path
    settings: tuple
    user_values: dict
    samples_per_s: float | None = None  # what it measured (None where it measured nothing)


def settings_of(knobs: dict[str, Any], user_values: dict[str, Any]) -> tuple:
    """What a trial ran with: each setting the knobs change, over the user's values (defaults where unset)."""
    values = []
    for name in SETTINGS:
        value = knobs.get(name)
        if value is None:
            value = user_values.get(name)
        value = BY_NAME[name].unset if value is None else value
        values.append(bool(value) if name in SWITCHES else value)
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
        points.append(SurfacePoint(path.parent, settings_of(record.get("knobs") or {}, user), user,
                                   (record.get("summary") or {}).get("samples_per_s")))
    if not points:
        raise AdvisorError(f"{folder}: holds no recorded trials (no */{TRIAL_FILE})")
    return points


NOISE_WINDOWS = 5  # steady-state windows drawn for a served trial under noise
NOISE_WINDOW_STEPS = 4  # steps in each


class ReplayRunner:
    """Serves recorded trials for the session's knobs, into `out/trials/<name>`; with `noise`, each with
    steady-state windows drawn around its setting's recorded samples/s (relative spread `noise`, generator
    `seed`); with `draws`, around a level drawn for each served trial (relative spread `draws`)."""

    def __init__(self, points: list[SurfacePoint], out: Path, noise: float | None = None, seed: int = 0,
                 drift: float | None = None, draws: float | None = None):
        self.points = points
        self.out = Path(out)
        # The baseline's user values: every point of a surface was recorded from the same step.
        self.user_values = points[0].user_values
        self.by_settings: dict[tuple, list[SurfacePoint]] = {}
        for p in points:
            self.by_settings.setdefault(p.settings, []).append(p)
        self.served: dict[tuple, int] = {}
        self.truth = {settings: statistics.median(rates) for settings, recordings in self.by_settings.items()
                      if (rates := [p.samples_per_s for p in recordings if p.samples_per_s])}
        self.noise = noise
        self.random = random.Random(seed)
        # Measuring a setting again counts new steps only where there are new ones to count.
        self.remeasure = noise is not None or any(len(v) > 1 for v in self.by_settings.values())
        self.drift = LoadDrift(drift, seed) if drift else None
        # Each served process a draw of its setting's level (`advisor.search.draws`), from a generator of its own:
        # a seed replays the same windows with draws as without.
        self.draws, self.draw_random = draws, random.Random(f"draws-{seed}")
        self.process_draws = draws or 0.0  # the session's `TrialRunner.process_draws`: none, or the ones served
        self.adaptive = noise is not None  # windows are drawn, so as many as a comparison needs
        self.paired = False  # one trial at a time: served trials take no turns
        self.epoch = time.time()
        self.clock = 0.0  # simulated seconds since the session began

    def __call__(self, name: str, knobs: Knobs, against: dict[str, Any] | None = None) -> TrialResult:
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
        if not regular_traces_in(folder):
            record["trace_files"] = self._setting_trace(recordings, folder)
        asked = knobs.to_dict()
        # The outcomes of the knobs this trial sets: a recording's knob set to "off" said nothing of this one.
        outcomes = {k: v for k, v in (record.get("knob_outcomes") or {}).items() if asked.get(k) is not None}
        record.update(name=name, knobs=asked, knob_outcomes=outcomes, replayed_from=str(point.folder))
        if self.noise is not None and record.get("status") == "ok":
            self._draw_windows(record, self.truth.get(wanted), Against.from_dict(against))
        else:
            self._retime(record, 0.0)
        write_json_atomic(folder / TRIAL_FILE, record)
        return load_trial(folder)

    @staticmethod
    def _setting_trace(recordings: list[SurfacePoint], folder: Path) -> list[str]:
        """A run recorded without its trace (`record_surface.py --traces first`) is served with the trace of its
        setting's first run that has one, as a live trial of that setting would have profiled the same step."""
        for other in recordings:
            traces = regular_traces_in(other.folder)
            if traces:
                for trace in traces:
                    shutil.copy2(trace, folder / trace.name)
                return [t.name for t in traces]
        return []

    def _load(self, t: float) -> float:
        return self.drift.factor(t) if self.drift is not None else 1.0

    def _retime(self, record: dict[str, Any], windows_s: float) -> None:
        """Place the served trial on the simulated clock: its recorded start-up and profiled steps (slowed
        by the load when they run), then `windows_s` of windows, then its recorded end."""
        times = record.get("times") or {}
        stamps = [times.get(k) for k in ("started_at", "first_step_at", "last_step_at", "ended_at")]
        if all(isinstance(x, (int, float)) for x in stamps):
            startup, profiled, end = (b - a for a, b in zip(stamps, stamps[1:]))
        else:
            startup, profiled, end = float(times.get("duration_s") or 0.0), 0.0, 0.0
        start = self.clock
        first = start + startup * self._load(start)
        warm = first + profiled * self._load(first)
        last = warm + windows_s
        self.clock = last + end * self._load(last)
        record["times"] = {"started_at": self.epoch + start, "first_step_at": self.epoch + first,
                           "last_step_at": self.epoch + last, "ended_at": self.epoch + self.clock,
                           "duration_s": self.clock - start, "simulated": True}

    def _draw_windows(self, record: dict[str, Any], truth: float | None, target: Against | None = None) -> None:
        """Replace the record's steady-state windows by windows drawn around the setting's samples/s: each window's
        rate × (1 + noise · N(0, 1)) over the load at its time, its steps keeping the recorded share of
        time spent waiting for data (so the bound the session reads is the recording's). NOISE_WINDOWS
        of them; against a `target`, until they settle the comparison (at most its cap)."""
        from advisor.trials.record.measurement import measure

        summary = record.get("summary") or {}
        rate, batch = truth, summary.get("batch_size")
        if rate and self.draws:
            rate *= max(0.05, 1 + self.draws * self.draw_random.gauss(0.0, 1.0))
        profiled = [s for s in record.get("steps") or [] if "window" not in s]
        if not rate or not batch:
            self._retime(record, 0.0)
            return
        shares = [min(1.0, s["call_s"] / s["wall_s"]) for s in profiled if s.get("recorded")
                  and s.get("wall_s") and s.get("call_s") is not None]
        busy = statistics.median(shares) if shares else 1.0
        steps, index = list(profiled), len(profiled)
        start = self.clock
        self._retime(record, 0.0)  # where the windows begin: after the profiled steps
        t = record["times"]["last_step_at"] - self.epoch
        begin, groups, verdict = t, [], None
        most = target.max_windows if target is not None else NOISE_WINDOWS
        for window in range(most):
            load = self._load(t)
            drawn = rate / load * max(0.05, 1 + self.noise * self.random.gauss(0.0, 1.0))
            wall = batch / drawn
            for k in range(NOISE_WINDOW_STEPS):
                steps.append({"index": index, "wall_s": wall, "call_s": wall * busy, "data_s": wall * (1 - busy),
                              "recorded": False, "phase": "window", "window": window, "batch_size": batch,
                              "loss": summary.get("loss")})
                index += 1
            cpu = self._on_cpu(record)  # the load holds the CPU from a CPU trial, the GPU from a GPU one
            steps[-1]["load"] = {"waited": other_load(load) if cpu else 0.0, "other_cpu": other_load(load) if cpu else 0.0,
                                 "gpu_other": None if cpu else other_load(load)}
            t += NOISE_WINDOW_STEPS * wall
            groups.append((NOISE_WINDOW_STEPS * batch, NOISE_WINDOW_STEPS * wall))
            verdict = settled(groups, target) if target is not None else None
            if verdict is not None:
                break
        self.clock = start  # the trial on the clock again, now that its windows' length is known
        self._retime(record, t - begin)
        record["steps"] = steps
        if target is not None:
            record.setdefault("schedule", {}).update(against=target.to_dict(), verdict=verdict,
                                                     windows_measured=len(groups))
        steady = measure([steps])
        summary.update(steady=steady.to_dict(), samples_per_s=steady.samples_per_s)
        record["replay_noise"] = self.noise
        if self.draws:
            record["replay_draws"] = self.draws

    @staticmethod
    def _on_cpu(record: dict[str, Any]) -> bool:
        return (record.get("device_facts") or {}).get("type") != "cuda"

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

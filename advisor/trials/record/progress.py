"""Where a running trial is, read from outside it: its phase (starting, warm-up, profiled steps, window k of
N, finishing) and an estimate of the seconds left.

The trial's process already writes one JSON line per step as it ends (`steps.jsonl`, flushed), and the
schedule its driver sized once the training loader was known (`schedule.json`: the wait grows by the
batches the workers queue, a window by their count). `ProgressWatch` reads both, incrementally, from the
parent while it waits; `trial_progress` is the pure part. Torch-free.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from advisor.trials.record.schedule import MIN_WINDOW_STEPS

PHASES = ("starting", "warm-up", "profiled", "settling", "window", "finishing", "done")


@dataclass(frozen=True)
class TrialProgress:
    """A running trial's phase: `phase` (one of PHASES), the step of the phase in progress (`step` of
    `steps`; for a window, `step` is the window, of `steps` windows), the seconds it has run and an
    estimate of those left (None before its first step ends); `answer_s`, where the session says it, the seconds
    left to the session's answer at most (this trial's, and the trials its budget still allows after it)."""

    trial: str
    phase: str
    step: int = 0
    steps: int = 0
    elapsed_s: float = 0.0
    remaining_s: float | None = None
    answer_s: float | None = None

    def describe(self) -> str:
        """'starting', 'warm-up step 2 of 3', 'profiled step 1 of 5', 'window 2 of 5', 'finishing'."""
        if self.phase == "window":
            return f"window {self.step} of {self.steps}"
        if self.phase in ("warm-up", "profiled", "settling"):
            return f"{self.phase} step {self.step} of {self.steps}"
        return self.phase


def planned_schedule(record_schedule: dict[str, Any]) -> dict[str, Any]:
    """The schedule a trial asked for (trial.json's `schedule`), as the driver's schedule.json reads before
    the loader adds its queue: the stand-in until that file is written."""
    return {"wait": record_schedule.get("wait", 0), "warmup": record_schedule.get("warmup", 0),
            "active": record_schedule.get("active", 1), "settle": 0,
            "windows": record_schedule.get("windows", 0), "window_s": record_schedule.get("window_s", 0.0),
            "min_window_steps": MIN_WINDOW_STEPS}


def _windows_closed(schedule: dict[str, Any], window_steps: list[dict[str, Any]]) -> tuple[int, float]:
    """Windows closed by these window steps (as `StepSchedule.count_window_step` closes them), and the
    seconds the open one has run."""
    closed, count, wall = 0, 0, 0.0
    for step in window_steps:
        count, wall = count + 1, wall + float(step.get("wall_s") or 0.0)
        if wall >= schedule["window_s"] and count >= schedule["min_window_steps"]:
            closed, count, wall = closed + 1, 0, 0.0
    return closed, wall


def trial_progress(trial: str, schedule: dict[str, Any], steps: list[dict[str, Any]], elapsed_s: float,
                   finished: bool = False) -> TrialProgress:
    """The phase of the step in progress once `steps` have ended, and the seconds left: the steps left
    before the windows at the median step so far, each window left at max(its seconds, its steps)."""
    if finished:
        return TrialProgress(trial, "done", elapsed_s=elapsed_s, remaining_s=0.0)
    if not steps:
        return TrialProgress(trial, "starting", elapsed_s=elapsed_s)
    warm = schedule["wait"] + schedule["warmup"]
    profiled = warm + schedule["active"]
    before_windows = profiled + schedule["settle"]
    # The first step's time holds the script's set-up and first batches: its call alone stands in for a
    # step until a second one has ended.
    walls = [float(s.get("wall_s") or 0.0) for s in steps[1:]] or [float(steps[0].get("call_s") or 0.0)]
    step_s = median(walls)
    window_s = max(schedule["window_s"], schedule["min_window_steps"] * step_s)
    closed, open_s = _windows_closed(schedule, [s for s in steps if s.get("phase") == "window"])
    index, windows = len(steps), schedule["windows"]
    against = schedule.get("against") or {}
    if against and closed >= windows:  # measured against the best: on until its windows settle, up to the cap
        windows = max(windows, min(closed + 1, int(against.get("max_windows") or windows)))
    remaining = max(0, before_windows - index) * step_s
    if index < before_windows:
        remaining += windows * window_s
    else:
        remaining += max(0.0, window_s - open_s) + max(0, windows - closed - 1) * window_s
    if index < warm:
        return TrialProgress(trial, "warm-up", index + 1, warm, elapsed_s, remaining)
    if index < profiled:
        return TrialProgress(trial, "profiled", index - warm + 1, schedule["active"], elapsed_s, remaining)
    if index < before_windows:
        return TrialProgress(trial, "settling", index - profiled + 1, schedule["settle"], elapsed_s, remaining)
    if closed < windows:
        return TrialProgress(trial, "window", closed + 1, windows, elapsed_s, remaining)
    return TrialProgress(trial, "finishing", elapsed_s=elapsed_s, remaining_s=0.0)


class ProgressWatch:
    """Reads a running trial's steps file (new lines only) and schedule file, and says where it is."""

    def __init__(self, trial: str, steps_file: Path, schedule_file: Path, planned: dict[str, Any]):
        self.trial, self.steps_file, self.schedule_file = trial, steps_file, schedule_file
        self.planned = planned_schedule(planned)
        self.schedule: dict[str, Any] | None = None
        self.steps: list[dict[str, Any]] = []
        self.offset = 0
        self.started = time.monotonic()

    def poll(self, finished: bool = False) -> TrialProgress:
        """The trial's progress now (`finished`: its process has ended)."""
        self._read()
        return trial_progress(self.trial, self.schedule or self.planned, self.steps,
                              time.monotonic() - self.started, finished)

    def _read(self) -> None:
        if self.schedule is None:
            try:
                self.schedule = {**self.planned, **json.loads(self.schedule_file.read_text())}
            except (OSError, ValueError, TypeError):
                pass  # not written yet: the planned schedule stands in
        try:
            with open(self.steps_file, "rb") as f:
                if f.seek(0, 2) < self.offset:  # set aside for a second run (a native crash): start over
                    self.offset, self.steps, self.schedule = 0, [], None
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written is read next time
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                self.steps.append(json.loads(line))
            except ValueError:
                continue

"""The phases of a trial's steps, torch-free: which phase each step is in, and when the trial has measured
what it needs. The step driver (`advisor.trials.harness.driver`) holds one and moves it on at the end of each step.

Phases: `wait` (the first steps, and the batches the workers queued before the first step, which make
the loader look free), `warmup`, `profiled`, then, without the profiler, `settle` (the queue refilled
while the trace was written) and measurement `window`s of at least `window_s` seconds, MIN_WINDOW_STEPS
steps and one cycle of the workers each. The trial is measured after `windows` windows; or, measured
against the best (`against`, `advisor.trials.record.adaptive`), once its windows settle the comparison, between
the target's least and most windows.
"""

from __future__ import annotations

from typing import Any

from advisor.trials.record.adaptive import Against, settled
from advisor.trials.record.measurement import MIN_WINDOW_STEPS


class StepSchedule:
    """The phase of each step of a trial, and the measurement windows counted so far."""

    def __init__(self, wait: int, warmup: int, active: int, windows: int = 0, window_s: float = 0.0,
                 loop: bool = False, against: Against | None = None):
        # The first step of a loop (no step function) holds the script's own set-up: never profiled.
        self.wait = max(wait, 1) if loop else wait
        self.warmup, self.active = warmup, active
        self.total = self.wait + self.warmup + self.active  # the profiled part, measurement aside
        self.windows, self.window_s = windows, window_s
        self.queue_depth = 0  # batches the loader's workers queue before the first step
        self.settle = 0
        self.min_window_steps = MIN_WINDOW_STEPS
        self.window, self.window_steps, self.window_wall = 0, 0, 0.0
        self.against = against if windows else None
        self.groups: list[tuple[float, float]] = []  # (samples, seconds) of each closed window
        self.window_samples = 0.0
        self.verdict: str | None = None  # what settled an adaptive trial's windows
        self.settle_until = 0  # after a pause (windows taken in turns): steps before this one settle again

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> StepSchedule:
        """The schedule a trial's config asks for (`wait`, `warmup`, `active`, `measure`, `loop`)."""
        measure = config.get("measure") or {}
        return cls(config["wait"], config["warmup"], config["active"], windows=int(measure.get("windows") or 0),
                   window_s=float(measure.get("window_s") or 0.0), loop=bool(config.get("loop")),
                   against=Against.from_dict(measure.get("against")))

    def add_queue(self, workers: int, prefetch_factor: int | None) -> None:
        """Skip the batches `workers` queue before the first step, and as many again after profiling (the
        queue refills while the trace is written); a window then spans at least one cycle of the workers."""
        self.queue_depth = workers * (prefetch_factor or 2) if workers > 0 else 0
        self.wait += self.queue_depth
        self.total += self.queue_depth
        self.settle = self.queue_depth if self.windows else 0
        self.min_window_steps = max(MIN_WINDOW_STEPS, workers)

    def record_fewer(self, steps: int) -> None:
        """Profile `steps` steps instead (the trace's budget holds no more: `trace_budget`)."""
        self.total -= self.active - steps
        self.active = steps

    def fit_windows(self, step_s: float, seconds_left: float) -> str | None:
        """Before the first window: where the windows cannot end before the trial's time limit at `step_s` a
        step, measure what fits (fewer windows, fewer steps each, or none: the profiled steps decide), so
        that a trial of long steps ends measured instead of timed out. Returns why it was cut, or None."""
        if not self.windows or step_s <= 0:
            return None
        room = 0.8 * seconds_left  # the rest: the end of the process, a step slower than the last
        per_window = max(self.min_window_steps * step_s, self.window_s)
        asked = self.against.max_windows if self.against is not None else self.windows
        if asked * per_window <= room:
            return None
        fit = int(room // per_window)
        before = f"{asked} window(s) of {self.min_window_steps} steps of {step_s:.1f} s"
        if fit >= 1:
            self.windows, self.against = fit, None
        elif room >= step_s:
            self.windows, self.against, self.min_window_steps = 1, None, int(room // step_s)
        else:
            self.windows, self.against = 0, None
        kept = (f"{self.windows} window(s) of {self.min_window_steps} step(s)" if self.windows
                else "none: the profiled steps decide")
        return f"{before} would outlast the trial's time limit ({seconds_left:.0f} s left): measured {kept}"

    def phase(self, index: int) -> str:
        """`wait`, `warmup`, `profiled`, `settle` or `window` for the step with this index."""
        if index < self.wait:
            return "wait"
        if index < self.wait + self.warmup:
            return "warmup"
        if index < self.total:
            return "profiled"
        return "settle" if index < max(self.total + self.settle, self.settle_until) else "window"

    def resettle(self, index: int) -> None:
        """The trial paused before step `index` (another measured meanwhile): its workers' queue refilled, so
        as many steps as the queue holds settle again before the next window counts."""
        self.settle_until = index + self.queue_depth

    def first_profiled(self, index: int) -> bool:
        """Whether the step with this index is the first the profiler records."""
        return index == self.wait + self.warmup

    def count_window_step(self, wall: float, samples: float | None = None) -> bool:
        """A step of the current window took `wall` seconds (for `samples` samples): the window closes once
        it has lasted `window_s` seconds and `min_window_steps` steps. Returns whether it closed."""
        self.window_steps += 1
        self.window_wall += wall
        self.window_samples += samples or 0.0
        if self.window_wall >= self.window_s and self.window_steps >= self.min_window_steps:
            self.groups.append((self.window_samples or float(self.window_steps), self.window_wall))
            self.window, self.window_steps, self.window_wall, self.window_samples = self.window + 1, 0, 0.0, 0.0
            if self.against is not None and self.verdict is None:
                self.verdict = settled(self.groups, self.against)
            return True
        return False

    def measured(self) -> bool:
        """Whether all the measurement windows have closed: `windows` of them; measured against the best,
        once they settle the comparison (at least its least windows) or at its most."""
        if self.against is not None:
            return self.verdict is not None or self.window >= self.against.max_windows
        return self.window >= self.windows

    def to_dict(self) -> dict[str, Any]:
        """The steps each phase took: trial.json's `schedule`."""
        return {"wait": self.wait, "warmup": self.warmup, "active": self.active, "queue_depth": self.queue_depth,
                "settle": self.settle, "windows": self.windows, "window_s": self.window_s,
                "min_window_steps": self.min_window_steps, "windows_measured": self.window,
                **({"against": self.against.to_dict(), "verdict": self.verdict} if self.against else {})}

    def completed_message(self) -> str:
        """What a trial whose steps all ran says it measured."""
        text = f"{self.active} steps profiled"
        if self.windows:
            text += f", then {self.window} window(s) of at least {self.window_s:g} s measured"
        return text

    def script_ended(self, steps_run: int, script: str, target: str | None, processes: str = "") -> dict[str, str]:
        """Status and message when the script returned on its own after `steps_run` steps: ok once the
        profiled steps ran (with the windows it got), an error before (`processes`: what it says of the processes
        the script started itself, where it counted none)."""
        if steps_run >= self.total:
            # Measured against the best, the count asked for is a range: up to its most, fewer once settled.
            asked = (f"up to {self.against.max_windows}, before they settled the comparison with the best"
                     if self.against is not None and self.verdict is None else f"of {self.windows}")
            return {"status": "ok", "message": f"{self.completed_message()}; {script} ended after "
                                               f"{self.window} measurement window(s) ({asked})"}
        what = f"call(s) of {target}" if target else "optimizer step(s)"
        message = (f"{script} finished after {steps_run} {what}; the trial needs {self.total} (wait {self.wait} + "
                   f"warmup {self.warmup} + record {self.active})")
        if not steps_run and processes:  # pytorch/examples' mnist_hogwild trains in processes it starts
            message += processes
        elif not steps_run and not target:  # pytorch/examples' word_language_model updates p.data by hand
            message += (": a step is counted at each torch.optim optimizer's step(); where the script updates its "
                        f"parameters itself, name a function that runs one training step ({script}:FUNCTION)")
        # What the search reads: a larger batch runs the script's samples in fewer steps still.
        return {"status": "error", "message": message, "script_ended": {"steps": steps_run, "needed": self.total}}

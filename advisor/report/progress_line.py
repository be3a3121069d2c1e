"""A running trial's progress on a terminal: its phase and an estimate of the time left, with rich's
progress display, one line that goes once the trial has ended. Nothing at all where the output is not a
terminal (a pipe, a file, a notebook's captured output).

It shows what `advisor.trials.record.progress.TrialProgress` says (phase, step of steps, elapsed, remaining):
this module computes nothing but, before a trial's first step, the previous trial's length as the
estimate (the script's set-up costs each trial about the same).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


def _seconds(value: float) -> str:
    """'~8 s left', '~2 min left'."""
    return f"~{value:.0f} s left" if value < 90 else f"~{value / 60:.0f} min left"


def _span(value: float) -> str:
    """'40 s', '3 min'."""
    return f"{value:.0f} s" if value < 90 else f"{value / 60:.0f} min"


class TrialProgressDisplay:
    """Shows each trial's progress as it comes (`update`), on `console`; one line per running trial (two run at
    once where their windows are taken in turns, each reporting from its own thread)."""

    def __init__(self, console: Console):
        self.console = console
        self.progress: Progress | None = None
        self.tasks: dict[str, Any] = {}  # trial name -> its line
        self.last_duration_s: float | None = None  # the previous trial's, start to end
        self.lock = threading.Lock()

    def update(self, p: Any) -> None:
        """Show a trial's progress (a TrialProgress); its "done" ends its line."""
        with self.lock:
            if p.phase == "done":
                self._end(p.trial)
                self.last_duration_s = p.elapsed_s
                return
            remaining = p.remaining_s
            if p.phase == "starting" and self.last_duration_s is not None:
                remaining = max(0.0, self.last_duration_s - p.elapsed_s)  # as long as the last trial, at a guess
            number = p.trial.split("-", 1)[0]
            description = f"trial {number}: {p.describe()}"
            estimate = "" if remaining is None else _seconds(remaining)
            if p.answer_s is not None:  # the session's: this trial's time left and the trials its budget allows after
                estimate += ("; " if estimate else "") + f"the answer in at most {_span(p.answer_s + (remaining or 0))}"
            total = None if remaining is None else p.elapsed_s + remaining
            if self.progress is None:
                self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                                         TextColumn("{task.fields[estimate]}"), TimeElapsedColumn(),
                                         console=self.console, transient=True)
                self.progress.start()
            if p.trial not in self.tasks:
                self.tasks[p.trial] = self.progress.add_task(description, total=total, estimate=estimate)
            self.progress.update(self.tasks[p.trial], description=description, total=total, completed=p.elapsed_s,
                                 estimate=estimate)

    def _end(self, trial: str) -> None:
        """End a trial's line; the display with the last (erased: the session prints the results in their place)."""
        task = self.tasks.pop(trial, None)
        if self.progress is None:
            return
        self.progress.refresh()  # its last state drawn before the line goes
        if not self.tasks:
            self.progress.stop()
            self.progress = None
        elif task is not None:
            self.progress.remove_task(task)

    def close(self) -> None:
        """End every line."""
        with self.lock:
            for trial in list(self.tasks):
                self._end(trial)
            if self.progress is not None:
                self.progress.stop()
                self.progress = None


def progress_display(console: Console) -> Callable[[Any], None] | None:
    """The progress callback for a session's trials on this console, or None where it is not a terminal
    (nothing extra is printed there)."""
    return TrialProgressDisplay(console).update if console.is_terminal else None

"""A running trial's progress on a terminal: its phase and an estimate of the time left, with rich's
progress display, one line that goes once the trial has ended. Nothing at all where the output is not a
terminal (a pipe, a file, a notebook's captured output).

It shows what `advisor.trials.record.progress.TrialProgress` says (phase, step of steps, elapsed, remaining):
this module computes nothing but, before a trial's first step, the previous trial's length as the
estimate (the script's set-up costs each trial about the same).
"""

from __future__ import annotations

from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


def _seconds(value: float) -> str:
    """'~8 s left', '~2 min left'."""
    return f"~{value:.0f} s left" if value < 90 else f"~{value / 60:.0f} min left"


class TrialProgressDisplay:
    """Shows each trial's progress as it comes (`update`), on `console`; one line per running trial."""

    def __init__(self, console: Console):
        self.console = console
        self.progress: Progress | None = None
        self.task: Any = None
        self.last_duration_s: float | None = None  # the previous trial's, start to end

    def update(self, p: Any) -> None:
        """Show a trial's progress (a TrialProgress); its "done" ends the line."""
        if p.phase == "done":
            self.close()
            self.last_duration_s = p.elapsed_s
            return
        remaining = p.remaining_s
        if p.phase == "starting" and self.last_duration_s is not None:
            remaining = max(0.0, self.last_duration_s - p.elapsed_s)  # as long as the last trial, at a guess
        number = p.trial.split("-", 1)[0]
        description = f"trial {number}: {p.describe()}"
        estimate = "" if remaining is None else _seconds(remaining)
        total = None if remaining is None else p.elapsed_s + remaining
        if self.progress is None:
            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                                     TextColumn("{task.fields[estimate]}"), TimeElapsedColumn(),
                                     console=self.console, transient=True)
            self.progress.start()
            self.task = self.progress.add_task(description, total=total, estimate=estimate)
        self.progress.update(self.task, description=description, total=total, completed=p.elapsed_s,
                             estimate=estimate)

    def close(self) -> None:
        """End the line (it is erased: the session prints the trial's result in its place)."""
        if self.progress is not None:
            self.progress.stop()
        self.progress, self.task = None, None


def progress_display(console: Console) -> Callable[[Any], None] | None:
    """The progress callback for a session's trials on this console, or None where it is not a terminal
    (nothing extra is printed there)."""
    return TrialProgressDisplay(console).update if console.is_terminal else None

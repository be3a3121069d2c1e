"""Alternating windows: two warm trials that take turns to measure, so that both see the same load.

Before a session ends, its baseline and its best run side by side (`advisor.search.ending`): both start,
both run their profiled steps, then each measurement window of one is followed by one of the other, the
trial whose turn it is not sleeping before its next step meanwhile, its DataLoader workers stopped (SIGSTOP)
until its turn comes back: their refill of its queue would run beside the other's window (the demo's baseline,
no workers and two threads on two cores, measured 8-26 % below its speed alone beside a best whose two workers
refilled, and the speedup read off the pair 6-9 % high; with the workers stopped, within 1-2 % of each alone). A
load that comes and goes then falls on both alike, window by window, and the speedup is read off windows
measured seconds apart, not off runs minutes apart. After a pause a trial runs its loader's queue depth of
steps again before its next window counts (`StepSchedule.resettle`): the batches queued before it paused
would make its loader look free.

The turn is a file in a folder both trials know: `turn` holds the name of the trial that measures now; a trial
passes it on after each window, and writes `done-NAME` once it has measured all its windows (the other then
measures without waiting). Neither measures its first window before both have reached theirs (`ready-NAME`):
the other's start-up and profiled steps would run beside it; and the first to finish waits for the other's
`done-NAME` before it ends (`wait_for_the_other`), so that its ending does not run beside the other's last
window. `windows.log` holds a line per window measured (name, window, start, end: epoch seconds; then its samples and
seconds), which shows the windows did not overlap. A trial waits at most `wait_s` for its turn (the other may have
failed), then measures anyway. Where the pair is told the noise that settles it (`settle`: the speedup's pairs and
the confirmation's), both stop once the windows they logged put their ratio within it (`settled`): each reads the
same log, so the two stop after as many windows each. Torch-free.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.trials.record.adaptive import MIN_WINDOWS
from advisor.trials.record.measurement import ratio_relative_se

# How often a waiting trial reads the turn: small beside a window of a second or more. Each read wakes the
# waiting process beside the other's window: every 2 ms, the windows measured 3-4% of the CPU taken by others.
POLL_S = 0.01
TURN_FILE, LOG_FILE = "turn", "windows.log"


@dataclass(frozen=True)
class Turns:
    """Where two trials take turns, and which of the two this one is."""

    folder: str
    me: str
    other: str
    wait_s: float
    settle: float = 0.0  # both stop once their ratio's noise is within this (0: every window asked for)
    min_windows: int = MIN_WINDOWS  # ... and each has measured at least this many

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the trial's config, trial.json's `schedule.turns`)."""
        return {"folder": self.folder, "me": self.me, "other": self.other, "wait_s": self.wait_s,
                "settle": self.settle, "min_windows": self.min_windows}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Turns | None":
        """Back from JSON; None for a trial that measures alone."""
        if not isinstance(data, dict) or not data.get("folder"):
            return None
        return cls(str(data["folder"]), str(data["me"]), str(data["other"]), float(data.get("wait_s") or 60.0),
                   float(data.get("settle") or 0.0), int(data.get("min_windows") or MIN_WINDOWS))


def start_turns(folder: Path, first: str, second: str, wait_s: float,
                settle: float = 0.0) -> tuple[Turns, Turns]:
    """A fresh turn folder whose first turn is `first`'s; the two trials' ends of it (`settle`: see `Turns`)."""
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder / TURN_FILE, first)
    return (Turns(str(folder), first, second, wait_s, settle), Turns(str(folder), second, first, wait_s, settle))


def _write(path: Path, text: str) -> None:
    # A partial file of each writer's own: both trials (and the session's threads, as each trial ends) write the
    # turn, at once when the two end together, and one's rename took the other's partial file from under it
    # (a measured trial then ended in FileNotFoundError).
    partial = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def wait_for_turn(turns: Turns, first: bool = False) -> float:
    """Sleep until it is this trial's turn, the other has measured all its windows, or `wait_s` passed;
    the seconds waited. Before the `first` window, also until the other has reached its windows (its
    start-up and profiled steps would run beside this one's first window)."""
    folder, began = Path(turns.folder), time.monotonic()
    if first:
        (folder / f"ready-{turns.me}").write_text("")
    while time.monotonic() - began < turns.wait_s:
        if (folder / f"done-{turns.other}").exists():
            break
        try:
            mine = (folder / TURN_FILE).read_text() == turns.me
            if mine and (not first or (folder / f"ready-{turns.other}").exists()):
                break
        except OSError:
            pass  # between the other's write and its rename
        time.sleep(POLL_S)
    return time.monotonic() - began


def pass_turn(turns: Turns, window: int, started: float, ended: float,
              group: tuple[float, float] | None = None) -> None:
    """This trial measured window `window` from `started` to `ended` (epoch seconds), `group` its (samples,
    seconds): log it, pass the turn."""
    folder = Path(turns.folder)
    measured = f" {group[0]:.6g} {group[1]:.6f}" if group else ""
    with open(folder / LOG_FILE, "a") as log:
        log.write(f"{turns.me} {window} {started:.6f} {ended:.6f}{measured}\n")
    _write(folder / TURN_FILE, turns.other)


def settled(turns: Turns) -> bool:
    """Whether the windows both trials logged so far put the ratio of their samples/s within `turns.settle` (two
    standard errors of the difference, as `measurement.noise` reads them), with as many each, `min_windows` at
    least."""
    if not turns.settle:
        return False
    sides = [window_groups(Path(turns.folder)).get(name, []) for name in (turns.me, turns.other)]
    if len(sides[0]) != len(sides[1]) or len(sides[0]) < turns.min_windows:  # as many windows each: a load alike
        return False
    errors = [ratio_relative_se(side) for side in sides]
    return None not in errors and 2 * math.hypot(*errors) <= turns.settle


def finished(turns: Turns) -> None:
    """This trial measured all its windows: the other need not wait for it again."""
    folder = Path(turns.folder)
    (folder / f"done-{turns.me}").write_text("")
    _write(folder / TURN_FILE, turns.other)


def wait_for_the_other(turns: Turns) -> None:
    """Sleep until the other trial has measured all its windows too (or `wait_s` passed): what this one does
    once it has measured (its profiler's and its loader's ends, its record, its exit) must not run beside the
    other's last window (it took 5-10% of the CPU from the conv example's last window, 10% of its speed)."""
    done, began = Path(turns.folder) / f"done-{turns.other}", time.monotonic()
    while not done.exists() and time.monotonic() - began < turns.wait_s:
        time.sleep(POLL_S)


def _logged(folder: Path) -> list[list[str]]:
    """The fields of each line of `windows.log`, in the order they were logged (none before the first window)."""
    try:
        return [line.split() for line in (Path(folder) / LOG_FILE).read_text().splitlines()]
    except OSError:
        return []


def windows_log(folder: Path) -> list[tuple[str, int, float, float]]:
    """The windows measured in turn: (trial, window, start, end), in the order they were logged."""
    return [(p[0], int(p[1]), float(p[2]), float(p[3])) for p in _logged(folder) if len(p) in (4, 6)]


def window_groups(folder: Path) -> dict[str, list[tuple[float, float]]]:
    """Each trial's windows measured in turn, as (samples, seconds), in the order they were logged."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for p in _logged(folder):
        if len(p) == 6:
            groups.setdefault(p[0], []).append((float(p[4]), float(p[5])))
    return groups

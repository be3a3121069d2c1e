"""What the budget keeps back for the end of a session: the confirmation of the best, and the speedup's runs of
the baseline beside the best. Every path that runs a trial (the loop, a pair's second move, the best measured
again beside a drifted candidate) leaves them. A --time-budget is the whole session's, its end included: the
search leaves the end the time of the trials kept back for it, and the end runs what the time left holds, each
trial priced at this session's trial time (`cost.trial_seconds`). Torch-free."""

from __future__ import annotations

import math
import time
from pathlib import Path

from advisor.search.record import SessionRecord
from advisor.search.cost import trial_seconds
from advisor.search.state import SessionOptions
from advisor.search.timing import session_time
from advisor.search.trial_runner import TrialRunner

CONFIRM_TRIALS = 2  # the best and the runner-up, each measured once more before the session ends
SPEEDUP_BUDGET = 16  # from this budget on (the default), a trial is kept back for the baseline beside the best
SPEEDUP_DRAWS = 2  # from that budget on, pairs of the baseline and the best in turns kept back: each one draw
# A trial is worth running while it is expected to improve the answer by this share of the least gain worth keeping
# (`advisor.search.expected`): the search's next candidate, the runner-up measured again beside the best. Not the
# whole of it: a trial is worth more than its own expected gain, as the base of the pairs that follow it (at the
# whole, the replayed four-change surface with holes ended on 0.57 and 0.79 of its best in 2 of 30 seeds).
STOP_SHARE = 0.5


def reserve(options: SessionOptions, run: TrialRunner) -> int:
    """Trials kept back for the end (with a budget that allows it): the best and the runner-up, to confirm the
    best; with SPEEDUP_BUDGET trials or more, the baseline once more before them, so that the speedup is read
    beside the best, or (a runner of two trials at once, `run.paired`) SPEEDUP_DRAWS pairs of the baseline and
    the best side by side, their windows in turns. A smaller budget spends those on the search, and measures the
    speedup at one load only where trials are left. A runner that cannot measure a setting twice keeps none."""
    if not run.remeasure or options.max_trials < 4 * CONFIRM_TRIALS:
        return 0
    return CONFIRM_TRIALS + ((2 * SPEEDUP_DRAWS if run.paired else 1) if options.max_trials >= SPEEDUP_BUDGET else 0)


def kept_for_time(options: SessionOptions, run: TrialRunner) -> int:
    """Trials' time the search leaves for the end under --time-budget: those `reserve` keeps back, and at least
    the two that confirm the best or read the speedup at one load (a runner that cannot measure twice: none)."""
    return max(reserve(options, run), CONFIRM_TRIALS) if run.remeasure else 0


def trials_in_time(out: Path, state: SessionRecord, options: SessionOptions, started: float | None) -> float:
    """How many trials of this session's length the --time-budget left holds (inf without one). The time spent is
    the clock's since `started` (time.monotonic()), or what the trials recorded where that is more; a replay's is
    its trials' simulated time alone (the recorded machine's, not this one's)."""
    if options.time_budget_s is None:
        return math.inf
    so_far = session_time(out, state) or {"wall_s": 0.0, "simulated": False}  # its trials' first start to last end
    recorded = so_far["wall_s"]
    spent = recorded if so_far["simulated"] or started is None else max(recorded, time.monotonic() - started)
    return max(0.0, options.time_budget_s - spent) / trial_seconds(out, state)


def trials_left(out: Path, state: SessionRecord, options: SessionOptions, started: float | None) -> int:
    """Trials the budget still allows: the --max-trials left, no more than the whole trials the --time-budget left
    holds (not the nearest: two trials in turns took 1.6 trials' time on the demo, and a budget is not overrun)."""
    left = options.max_trials - len(state.trials)
    in_time = trials_in_time(out, state, options, started)
    return left if in_time == math.inf else min(left, math.floor(in_time))


def end_cut_short(out: Path, state: SessionRecord, options: SessionOptions, started: float | None) -> str | None:
    """Where the --time-budget, not the trials left, leaves the end too little time to measure the best again (a
    trial took longer than the session's trials before it): the note that says so, else None."""
    in_time = trials_in_time(out, state, options, started)
    if in_time >= CONFIRM_TRIALS or options.max_trials - len(state.trials) < CONFIRM_TRIALS:
        return None
    per = trial_seconds(out, state)
    return (f"the time budget (--time-budget {options.time_budget_s:g} s) left {in_time * per:.0f} s for the end, "
            f"less than the {CONFIRM_TRIALS} trials (about {CONFIRM_TRIALS * per:.0f} s) that measure the best again: "
            "it was not, and the speedup is read from the runs made before")

"""What the budget keeps back for the end of a session: the confirmation of the best, and the speedup's runs of
the baseline beside the best. Every path that runs a trial (the loop, a pair's second move, the best measured
again beside a drifted candidate) leaves them. Torch-free."""

from __future__ import annotations

from advisor.search.state import SessionOptions
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


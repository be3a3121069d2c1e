"""The trial's memory, watched from the advisor's process while the trial runs: a trial whose processes hold
more than the watch allows is stopped, and ends "oom" with a line that says so, before it takes the machine
down (a profiled step of millions of operators once took a trial to 20 GB of a 24 GB machine).

The limit: ADVISOR_TRIAL_MEMORY where set (bytes, or 500M, 8G), else 80 % of the machine's memory; and
whatever the limit, a trial holding a third of the machine is stopped once less than 3 % of it is left.
"""

from __future__ import annotations

import psutil

from advisor.trials.record.trace_budget import size_setting

LIMIT_ENV = "ADVISOR_TRIAL_MEMORY"
SHARE = 0.8
LOW_AVAILABLE = 0.03


def memory_limit(environ: dict[str, str] | None = None) -> int:
    """The most the trial's processes may hold: ADVISOR_TRIAL_MEMORY, else 80 % of the machine's memory."""
    set_to = size_setting(LIMIT_ENV, environ)
    return set_to if set_to is not None else int(SHARE * psutil.virtual_memory().total)


def resident(pid: int) -> int:
    """The resident memory of a process and all its descendants (its DataLoader workers, its ranks)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue  # ended meanwhile
    return total


class MemoryWatch:
    """Reads the trial's memory at each call; says why it must stop, once it must."""

    def __init__(self, pid: int, limit: int | None = None):
        self.pid, self.limit = pid, limit if limit is not None else memory_limit()
        self.peak = 0

    def exceeded(self) -> str | None:
        """None while the trial may go on; else the one line the trial ends with."""
        held = resident(self.pid)
        self.peak = max(self.peak, held)
        machine = psutil.virtual_memory()
        if held > self.limit:
            why = f"the watch's limit of {gib(self.limit)}"
        elif machine.available < LOW_AVAILABLE * machine.total and held > machine.total / 3:
            why = f"what the machine could spare (only {gib(machine.available)} of {gib(machine.total)} left)"
        else:
            return None
        return (f"the trial's processes held {gib(held)} of memory, more than {why}: stopped before the machine "
                f"ran out ({LIMIT_ENV} sets the limit; the profiler's trace is bounded by ADVISOR_TRACE_BUDGET)")


def gib(size: float) -> str:
    """'1.25 GiB'."""
    return f"{size / 2**30:.2f} GiB"

"""How many steps the profiler may record, from the operators a step runs: torch-free.

torch.profiler keeps every event of the recorded steps in the trial's memory until the trace is written, and
the trace's export takes more again. A step of millions of operators (an LBFGS step over an LSTM cell
loop) took a trial to 20 GB. So a trial counts the operators of one unprofiled step before the profiler
records (`advisor.trials.harness.op_count`), and records as many steps as the budget holds; where even one
step would exceed the budget, one step without shapes and memory events (several times smaller); and where
even that would, the first operators of one step, as many as the budget holds (the profiler stops there and
writes its trace; the step runs on unrecorded), with a note.

Bytes per operator (operators as the counting dispatch mode sees them; the profiler records 3 to 4 events
for each, composite operators included), measured on torch 2.14's CPU profiler as the growth of the
process's resident memory once the trace is recorded and written: an LSTMCell loop with SGD, 71 000
operators a step, 8 kB with shapes and memory events and 1.5 kB without; time_sequence_prediction's step
(two double-precision LSTM cells, LBFGS), 265 000 operators a step, 10 kB and 3.5 kB, and cut to 250 time
steps (666 000 operators) 3.8 kB without. Rounded up from the largest. Without shapes and memory events
a trial also asks for the trace alone (`trace_only`: no event list kept beside it for Python), which took a
step of 56 000 operators of that script from 4.2 to 3.2 kB an operator at the peak (the profiler's stop
doubles what the recording held). So a whole step of the real script (1 000 time steps, 2.6 million
operators) needs some 8 GB of trace however little is recorded of each operator: more than a budget
allows, hence the first part of a step. Measured on pytorch/examples' own script (2,648,679 operators a step):
its trial (forked from the zygote) held 1.6 GB resident before the profiler, 1.87 GB one loss evaluation into
the recorded part, and 2.46 GB at the profiler's stop after 262,144 operators (the stop builds its results
beside the recording: 3.3 kB an operator at the peak).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

BYTES_PER_OP = 10 * 1024  # recorded with shapes and memory events
LIGHT_BYTES_PER_OP = 4096  # recorded without them
DEFAULT_BUDGET = 2**30  # at most 1 GiB of trace, and at most a quarter of the memory available
BUDGET_ENV = "ADVISOR_TRACE_BUDGET"  # bytes, or with a unit: 200M, 1G
UNITS = {"k": 2**10, "m": 2**20, "g": 2**30}


@dataclass(frozen=True)
class TracePlan:
    """What the profiler records, decided from one counted step: trial.json's `trace_plan`."""

    ops_per_step: int  # operators dispatched in the counted step (forward, backward, optimizer)
    counted_step: int  # the step whose operators were counted (unprofiled)
    budget_bytes: int
    steps_asked: int
    steps: int  # steps the profiler records
    light: bool  # recorded without shapes and memory events
    estimated_bytes: int  # the trace's estimated memory at that
    reason: str | None  # why fewer steps than asked were recorded (None: all were)
    ops_recorded: int | None = None  # the recorded step's first operators, where not even a light step fits

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


def size_setting(name: str, environ: dict[str, str] | None = None) -> int | None:
    """A size in bytes set in the environment variable `name` ("512M", "2g", "1500000"), or None where it is unset
    or unreadable (the default stands)."""
    text = (environ if environ is not None else os.environ).get(name, "").strip().lower()
    if not text:
        return None
    scale = UNITS.get(text[-1], 1)
    try:
        return max(1, int(float(text[:-1] if scale > 1 else text) * scale))
    except ValueError:
        return None


def budget_bytes(available: int | None, environ: dict[str, str] | None = None) -> int:
    """The trace's memory budget: ADVISOR_TRACE_BUDGET where set, else 1 GiB or a quarter of the memory
    available, whichever is less."""
    set_to = size_setting(BUDGET_ENV, environ)
    if set_to is not None:
        return set_to
    return min(DEFAULT_BUDGET, available // 4) if available else DEFAULT_BUDGET


def plan_trace(ops_per_step: int, counted_step: int, steps_asked: int, budget: int) -> TracePlan:
    """As many of the asked steps as the budget holds at BYTES_PER_OP; one light step where not even one does;
    the first operators of one light step where not even that does."""
    per_step = max(1, ops_per_step) * BYTES_PER_OP
    fits = min(steps_asked, budget // per_step)
    if fits >= steps_asked:
        return TracePlan(ops_per_step, counted_step, budget, steps_asked, steps_asked, False,
                         per_step * steps_asked, None)
    size = f"{ops_per_step:,} operators a step, about {mib(per_step)} of trace each"
    if fits >= 1:
        return TracePlan(ops_per_step, counted_step, budget, steps_asked, fits, False, per_step * fits,
                         f"{size}: {fits} of {steps_asked} steps fit the trace's budget of {mib(budget)}")
    light = max(1, ops_per_step) * LIGHT_BYTES_PER_OP
    if light <= budget:
        return TracePlan(ops_per_step, counted_step, budget, steps_asked, 1, True, light,
                         f"{size}: more than the trace's budget of {mib(budget)}, so one step was recorded without "
                         f"shapes and memory events (about {mib(light)})")
    part = max(1, budget // LIGHT_BYTES_PER_OP)
    return TracePlan(ops_per_step, counted_step, budget, steps_asked, 1, True, part * LIGHT_BYTES_PER_OP,
                     f"{size}, about {mib(light)} even without shapes and memory events: more than the trace's "
                     f"budget of {mib(budget)}, so one step was recorded in part, its first {part:,} operators "
                     f"({100 * part / max(1, ops_per_step):.0f}%, and to the end of a backward pass in flight): the "
                     f"trace's step is that part, the step's time is measured whole", part)


def mib(size: int) -> str:
    """'12 MiB', '1.5 GiB'."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"

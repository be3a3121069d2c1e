"""What bounds a trial's step: the input pipeline, host-to-device copies, CPU/launch overhead, compute,
communication or memory.

Two witnesses: the trace of the profiled steps (`Diagnosis.bound`, from the step-time breakdown) and the
steady-state windows measured after them (`Measurement.wait_share`: the share of time the training
loop spent outside the step, waiting for its next batch). The windows win on the input pipeline: the
profiled steps may have been fed from batches the workers queued earlier, which hides a loader that
cannot keep up, while a loop that waits in the steady state is bound by its loader whatever the trace
says, unless the trace shows the training process blocked staging its pageable copies (the copy bound):
a process that stages the batches itself cannot take them faster however many workers make them. A
trial that ran out of memory is bound by memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.trials.record.measurement import Measurement

BOUND_LABELS = {"input": "input pipeline (DataLoader)", "copy": "host-to-device copies",
                "host": "CPU/launch overhead", "compute": "compute", "communication": "communication",
                "memory": "memory"}
INPUT_WAIT_SHARE = 0.25  # the loop waits this share of the steady state for data: the loader binds
NO_WAIT_SHARE = 0.05  # below this the loader keeps up in the steady state, whatever the profiled steps showed


@dataclass(frozen=True)
class Bound:
    """The bound of one trial (a key of BOUND_LABELS, or None when the figures cannot say) and why."""

    name: str | None
    evidence: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """The bound in words."""
        return BOUND_LABELS.get(self.name or "", "unknown")


def trial_bound(status: str, diagnosis: Any, measurement: Measurement | None) -> Bound:
    """The bound of a trial from its status, the diagnosis of its trace and its steady-state measurement."""
    if status == "oom":
        return Bound("memory", ("the step ran out of memory",))
    wait = measurement.wait_share if measurement is not None and measurement.source == "windows" else None
    traced = getattr(diagnosis, "bound", None) if diagnosis is not None else None
    if traced == "copy":  # the host staging its copies binds before the loader it also waits on
        return Bound("copy", tuple(getattr(diagnosis, "bound_evidence", ()) or ()))
    if wait is not None and wait >= INPUT_WAIT_SHARE:
        return Bound("input", (f"in the steady state the loop waited for its next batch {100 * wait:.0f}% of the "
                               f"time ({measurement.steps} steps over {measurement.seconds:.1f} s)",))
    evidence = tuple(getattr(diagnosis, "bound_evidence", ()) or ())
    if traced == "input" and wait is not None and wait < NO_WAIT_SHARE:
        return Bound(None, (f"the profiled steps waited on the DataLoader but the steady state did not "
                            f"({100 * wait:.0f}% of the time): the bound is unclear",))
    return Bound(traced, evidence)

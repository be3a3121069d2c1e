"""What wraps each call of a step function: each requested knob's `StepChange` (`Knob.on_step`: `amp`'s autocast,
`non_blocking`'s copies, `accumulation_steps`' cycle), and the fp16 GradScaler and gradient accumulation they ask
of one `GradientInterposition` (`advisor.trials.interposition.gradients`). Names no knob: each change is its
module's. Inside the trial only (torch imported lazily).

At the step's first call the model and the training DataLoader exist: each change decides there (where the step
computes, whether the loader yields micro-batches), and what they ask of the gradients builds the one
`GradientInterposition` the trial's calls run under. Each call then runs inside every change's context and the
gradients'. After the steps, a change may say what only they could tell (accumulation in a target that never
steps an optimizer) and what trial.json records of it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from advisor.knobs import KNOBS
from advisor.knobs.in_trial import StepChange, declared_class
from advisor.trials.interposition.gradients import GradientInterposition
from advisor.trials.knobs import Knobs

# Each knob that changes the step, by its `StepChange`, in the registry's order.
CHANGES: dict[str, type[StepChange]] = {k.name: declared_class(k.on_step) for k in KNOBS if k.on_step}


def step_changes(knobs: Knobs, device_type: str) -> dict[str, StepChange]:
    """The changes of the step this trial's knobs ask for, one each (a knob the trial sets)."""
    return {name: change(getattr(knobs, name), device_type) for name, change in CHANGES.items()
            if getattr(knobs, name) is not None}


def step_records(interposition: "StepInterposition | None") -> dict[str, Any]:
    """The trial.json fields the step's changes fill (`StepChange.record_fields`), null where none ran (a loop)."""
    out: dict[str, Any] = {field: None for change in CHANGES.values() for field in change.record_fields}
    if interposition is not None:
        for change in interposition.changes.values():
            out.update(change.record(interposition.gradients))
    return out


class StepInterposition:
    """What wraps each call of the target: the knobs' changes of the step and the gradients they ask for.

    `loader_records` are the DataLoaders the script built (the harness's list): accumulation runs only
    when one of them was built with micro-batches. Without records (None) the caller feeds micro-batches
    itself, as the tests do, and accumulation always runs.
    """

    def __init__(self, knobs: Knobs, device_type: str, loader_records: list | None = None):
        self.device_type = device_type
        self.loader_records = loader_records
        self.changes = step_changes(knobs, device_type)
        self.gradients: GradientInterposition | None = None  # built at the first call
        self.calls = 0

    @property
    def outcomes(self) -> dict[str, str]:
        """Each change's outcome so far, where it has one."""
        return {name: change.outcome for name, change in self.changes.items() if change.outcome is not None}

    def outcomes_after_steps(self) -> dict[str, str]:
        """Outcomes only the steps could tell."""
        after = {name: change.after_steps(self.gradients) for name, change in self.changes.items()}
        return {name: outcome for name, outcome in after.items() if outcome is not None}

    def record(self) -> dict[str, Any]:
        """What trial.json records of the changes (`step_records`)."""
        return step_records(self)

    @contextlib.contextmanager
    def step(self, args: tuple = (), kwargs: dict | None = None) -> Iterator[None]:
        """The context one call of the target (called with `args`, `kwargs`) runs in."""
        import torch

        if self.calls == 0:
            asked: dict[str, Any] = {}
            for change in self.changes.values():
                change.first_call(torch, args, kwargs or {}, self.loader_records)
                asked.update(change.gradients())
            if asked:
                self.gradients = GradientInterposition(**{"device_type": self.device_type, **asked})
        self.calls += 1
        with contextlib.ExitStack() as stack:
            for change in self.changes.values():
                change.enter(torch, stack)
            if self.gradients is not None:
                stack.enter_context(self.gradients.active())
            yield

"""What wraps each call of a step function: autocast, the fp16 GradScaler and gradient accumulation
(`advisor.trials.interposition.gradients`), non_blocking copies. Inside the trial only (torch imported lazily).

- `amp`: the step runs inside `torch.autocast(device_type, dtype)` for each device type the step computes
  on (where the live modules' parameters are, found at the first call; else where its tensor
  arguments are), not the trial's `--device`: a model kept on the CPU of a GPU machine is autocast on
  the CPU. For fp16 a `GradScaler` covers the
  step: a scalar `loss.backward()` becomes `scaler.scale(loss).backward()`, `optimizer.step()` becomes
  `scaler.step(optimizer)`, and `scaler.update()` runs once when the step returns.
- `non_blocking`: inside the step, `Tensor.to(...)` and `Tensor.cuda(...)` from host memory to an
  accelerator get `non_blocking=True` unless the user passed a value (`advisor.knobs.non_blocking.apply`).

Where each runs, and why not elsewhere, is its knob module's (`amp.not_here`, `non_blocking.not_here`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from advisor.trials.harness.trial_facts import cuda_computes_bf16
from advisor.knobs import amp, non_blocking
from advisor.trials.interposition.gradients import GradientInterposition
from advisor.trials.knobs import APPLIED, Knobs, not_applicable


def amp_outcome(knobs: Knobs, device_type: str) -> str | None:
    """Whether the `amp` knob can run on this device (None when not requested)."""
    if knobs.amp is None:
        return None
    why = amp.not_here(knobs.amp, device_type, cuda_computes_bf16)
    return APPLIED if why is None else not_applicable(why)


def step_device_types(args: tuple, kwargs: dict) -> list[str]:
    """The device types a step computes on: where the live modules' parameters are, else where its
    tensor arguments are. Autocast follows these, not the trial's --device: a script may keep its
    model on the CPU on a machine with a GPU. A garbage-collector scan: call it once per trial."""
    import gc

    import torch

    found: set[str] = set()
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.nn.Module):
            found.update(p.device.type for p in obj.parameters(recurse=False))
    if not found:
        pending = [*args, *kwargs.values()]
        while pending:
            value = pending.pop()
            if isinstance(value, torch.Tensor):
                found.add(value.device.type)
            elif isinstance(value, (list, tuple)):
                pending.extend(value)
            elif isinstance(value, dict):
                pending.extend(value.values())
    found.discard("meta")
    return sorted(found)


def non_blocking_outcome(knobs: Knobs, device_type: str) -> str | None:
    """Whether the `non_blocking` knob can run on this device (None when not requested)."""
    if knobs.non_blocking is None:
        return None
    why = non_blocking.not_here(device_type)
    return APPLIED if why is None else not_applicable(why)


class StepInterposition:
    """What wraps each call of the target: autocast, fp16 GradScaler, accumulation, non_blocking copies.

    `loader_records` are the DataLoaders the script built (the harness's list): accumulation runs only
    when one of them was built with micro-batches. Without records (None) the caller feeds micro-batches
    itself, as the tests do, and accumulation always runs.
    """

    def __init__(self, knobs: Knobs, device_type: str, loader_records: list | None = None):
        self.knobs = knobs
        self.device_type = device_type
        self.loader_records = loader_records
        self.outcomes: dict[str, str] = {}
        self.autocast_types: list[str] = []  # decided at the first call, from where the step computes
        amp = amp_outcome(knobs, device_type)
        if amp is not None:
            self.outcomes["amp"] = amp
        non_blocking = non_blocking_outcome(knobs, device_type)
        if non_blocking is not None:
            self.outcomes["non_blocking"] = non_blocking
        self.use_non_blocking = non_blocking == APPLIED and bool(knobs.non_blocking)
        self.use_scaler = False
        self.requested_accumulation = knobs.accumulation_steps if (knobs.accumulation_steps or 1) > 1 else None
        if self.requested_accumulation and loader_records is None:
            self.outcomes["accumulation_steps"] = APPLIED
        self.gradients: GradientInterposition | None = None  # built at the first call
        self.calls = 0

    @property
    def scaling(self) -> GradientInterposition | None:
        """The fp16 loss scaling, when it runs."""
        return self.gradients if self.gradients is not None and self.gradients.scaler is not None else None

    def accumulation_steps(self) -> int | None:
        """k when this trial accumulates gradients (decided by then: the loader is built before the steps)."""
        k = self.requested_accumulation
        if not k or self.loader_records is None:
            return k
        applied = any(r.outcomes.get("accumulation_steps") == APPLIED for r in self.loader_records)
        return k if applied else None

    def accumulation_record(self) -> dict[str, Any] | None:
        """What accumulation did: k, micro-steps run, optimizer steps and zero_grads taken and skipped."""
        if self.gradients is None or self.gradients.accumulation_steps is None:
            return None
        return {"steps": self.gradients.accumulation_steps, "micro_steps": self.gradients.micro_steps,
                **self.gradients.counts}

    def outcomes_after_steps(self) -> dict[str, str]:
        """Outcomes only the steps could tell: accumulation in a target that never steps an optimizer
        (the user's loop steps it after every call, so no step waited for the cycle's end)."""
        record = self.accumulation_record()
        if record and record["micro_steps"] and not record["optimizer_steps"] + record["optimizer_steps_deferred"]:
            return {"accumulation_steps": not_applicable(
                "the target never calls optimizer.step(), so the optimizer cannot wait for the cycle's end")}
        return {}

    def _decide_autocast(self, args: tuple, kwargs: dict) -> None:
        """Autocast each device type the step computes on where the requested dtype runs there."""
        if self.knobs.amp is None:
            return
        types = step_device_types(args, kwargs) or [self.device_type]
        outcomes = {t: amp_outcome(self.knobs, t) for t in types}
        self.autocast_types = [t for t, outcome in outcomes.items() if outcome == APPLIED]
        self.outcomes["amp"] = APPLIED if self.autocast_types else next(iter(outcomes.values()))
        self.use_scaler = self.knobs.amp == "fp16" and bool(self.autocast_types)

    @contextlib.contextmanager
    def step(self, args: tuple = (), kwargs: dict | None = None) -> Iterator[None]:
        """The context one call of the target (called with `args`, `kwargs`) runs in."""
        import torch

        if self.calls == 0:
            self._decide_autocast(args, kwargs or {})
            k = self.accumulation_steps()
            if self.use_scaler or k:
                device = self.autocast_types[0] if self.use_scaler else self.device_type
                self.gradients = GradientInterposition(device, scale=self.use_scaler, accumulation_steps=k)
        self.calls += 1
        with contextlib.ExitStack() as stack:
            if self.autocast_types:
                dtype = torch.bfloat16 if self.knobs.amp == "bf16" else torch.float16
                for device_type in self.autocast_types:
                    stack.enter_context(torch.autocast(device_type=device_type, dtype=dtype))
            if self.gradients is not None:
                stack.enter_context(self.gradients.active())
            if self.use_non_blocking:
                non_blocking.apply(torch, stack)
            yield

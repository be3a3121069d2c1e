"""`amp`'s change of the step (`advisor.knobs.amp`, its `Knob.on_step`): autocast, and for fp16 the GradScaler.
Inside the trial only (torch given).

- With a step function, the step runs inside `torch.autocast(device_type, dtype)` for each device type it computes
  on (where the live modules' parameters are, found at the first call; else where its tensor arguments are), not
  the trial's `--device`: a model kept on the CPU of a GPU machine is autocast on the CPU. For fp16 it asks the
  step's `GradientInterposition` for loss scaling (`advisor.trials.interposition.gradients`): a scalar
  `loss.backward()` becomes `scaler.scale(loss).backward()`, `optimizer.step()` becomes `scaler.step(optimizer)`,
  and `scaler.update()` runs once when the step returns.
- With none, bf16 autocast of the forward of each outermost module call (global module forward hooks), on the
  device types of that module's parameters; backward runs outside autocast, as the AMP docs advise. fp16 needs
  a GradScaler around a step: not applicable there.

Where it runs, and why not elsewhere, is the knob module's (`amp.not_here`, `amp.WITHOUT_STEP`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from advisor.knobs import amp
from advisor.knobs.in_trial import StepChange
from advisor.knobs.knob import APPLIED, not_applicable
from advisor.trials.harness.trial_facts import cuda_computes_bf16


def outcome_on(value: str, device_type: str) -> str:
    """Whether autocast to `value` can run on this device type."""
    why = amp.not_here(value, device_type, cuda_computes_bf16)
    return APPLIED if why is None else not_applicable(why)


def step_device_types(torch: Any, args: tuple, kwargs: dict) -> list[str]:
    """The device types a step computes on: where the live modules' parameters are, else where its
    tensor arguments are. Autocast follows these, not the trial's --device: a script may keep its
    model on the CPU on a machine with a GPU. A garbage-collector scan: call it once per trial."""
    import gc

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


class Autocast(StepChange):
    """Autocast to the knob's dtype around the step (fp16 with loss scaling), or around each outermost forward of a
    loop."""

    def __init__(self, value: str, device_type: str) -> None:
        super().__init__(value, device_type)
        self.outcome = outcome_on(value, device_type)  # the trial's device's, until the first call says where
        self.autocast_types: list[str] = []  # decided at the first call, from where the step computes
        self.on_module: dict[int, list[str]] = {}  # in a loop, per module: the device types autocast covers
        self.depth = 0
        self.contexts: list[Any] = []

    def dtype(self, torch: Any) -> Any:
        """The knob's dtype as torch's."""
        return torch.bfloat16 if self.value == "bf16" else torch.float16

    def first_call(self, torch: Any, args: tuple, kwargs: dict, loaders: list | None) -> None:
        """Autocast each device type the step computes on where the dtype runs there."""
        types = step_device_types(torch, args, kwargs) or [self.device_type]
        outcomes = {t: outcome_on(self.value, t) for t in types}
        self.autocast_types = [t for t, outcome in outcomes.items() if outcome == APPLIED]
        self.outcome = APPLIED if self.autocast_types else next(iter(outcomes.values()))

    def gradients(self) -> dict[str, Any]:
        """fp16 asks for loss scaling, on the first device type it autocasts."""
        if self.value == "fp16" and self.autocast_types:
            return {"device_type": self.autocast_types[0], "scale": True}
        return {}

    def enter(self, torch: Any, stack: contextlib.ExitStack) -> None:
        """One call of the step under autocast on each of its device types."""
        for device_type in self.autocast_types:
            stack.enter_context(torch.autocast(device_type=device_type, dtype=self.dtype(torch)))

    def in_loop(self) -> str | None:
        """bf16 as on the trial's device; fp16 needs a step for its GradScaler."""
        return not_applicable(amp.WITHOUT_STEP) if self.value == "fp16" else self.outcome

    def around_run(self, torch: Any, stack: contextlib.ExitStack) -> None:
        """Autocast the forward of each outermost module call (global forward hooks)."""
        from torch.nn.modules import module as module_hooks

        stack.callback(module_hooks.register_module_forward_pre_hook(self._forward_starts).remove)
        stack.callback(module_hooks.register_module_forward_hook(self._forward_ends, always_call=True).remove)

    def _forward_starts(self, module: Any, args: Any) -> None:
        import torch

        self.depth += 1
        if self.depth > 1:
            return
        key = id(module)
        if key not in self.on_module:
            types = sorted({p.device.type for p in module.parameters()} - {"meta"}) or [self.device_type]
            self.on_module[key] = [t for t in types if outcome_on(self.value, t) == APPLIED]
        for device_type in self.on_module[key]:
            context = torch.autocast(device_type=device_type, dtype=self.dtype(torch))
            context.__enter__()
            self.contexts.append(context)

    def _forward_ends(self, module: Any, args: Any, output: Any) -> None:
        self.depth = max(0, self.depth - 1)
        if self.depth == 0:
            while self.contexts:
                self.contexts.pop().__exit__(None, None, None)

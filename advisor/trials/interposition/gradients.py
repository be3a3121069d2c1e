"""Gradient accumulation and fp16 loss scaling around each call of a step function, by interposition on
`Tensor.backward`, the optimizers' `step` and `zero_grad`, the LR schedulers and the GradScaler.

- `accumulate=k` (gradient accumulation, the `accumulation_steps` knob's change of the step: `Accumulation`;
  None or 1 = off): the effective batch stays the user's
  (or the `batch_size` knob's) while each call of the target sees a micro-batch of batch // k. One call
  of the target is one micro-step; k calls are one accumulation cycle, aligned to the trial's first call.
  * The DataLoader is built with batch_size = batch // k. A batch that k does not divide, a loader
    without a batch size (batch_size=None, or a batch_sampler) or a script that builds no DataLoader
    makes the knob "not applicable" and nothing else changes: accumulation without micro-batches would
    multiply the effective batch by k instead of keeping it.
  * Inside the step, a scalar `loss.backward()` back-propagates `loss / k` (the same `Tensor.backward`
    interposition as fp16 loss scaling; with both, the divided loss is then scaled). Gradients summed
    over the k micro-batches equal the gradient of the mean loss over the full batch.
  * `optimizer.step()` (any `torch.optim.Optimizer`, also when an LR scheduler wrapped it),
    `GradScaler.step/unscale_/update` and `lr_scheduler.step()` take effect on the last micro-step of
    a cycle only; with fp16 our GradScaler steps and updates once per cycle, as the AMP docs advise.
  * `optimizer.zero_grad()` and `module.zero_grad()` take effect only when no gradient of the current
    cycle would be lost: on the first micro-step before its first backward, or after an optimizer step
    that took effect. So both `zero_grad; backward; step` and `backward; step; zero_grad` work.
  * A target that never calls `optimizer.step()` (the user's loop steps after each call) makes the
    knob "not applicable" once the steps have run: the optimizer could not wait for the cycle's end.
  * Not covered: `optimizer.step(closure)` (L-BFGS) runs every call, non-scalar `backward(gradient)` is
    not divided, and gradient clipping runs on every micro-step (on partial sums).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

from advisor.knobs.accumulation_steps import KNOB
from advisor.knobs.in_trial import StepChange, patched_attribute
from advisor.knobs.knob import APPLIED, not_applicable


def subclasses_defining(base: type, name: str) -> list[type]:
    """`base` and every loaded subclass of it that defines `name` in its own body."""
    found, pending, seen = [], [base], set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        pending.extend(cls.__subclasses__())
        if name in vars(cls):
            found.append(cls)
    return found


def optimizer_classes() -> list[type]:
    """Every loaded `torch.optim.Optimizer` subclass that defines its own `step`."""
    import torch

    return subclasses_defining(torch.optim.Optimizer, "step")


def live_optimizers() -> list[Any]:
    """The optimizer instances alive in this process: a garbage-collector scan, so call it rarely."""
    import gc

    import torch

    return [o for o in gc.get_objects() if issubclass(type(o), torch.optim.Optimizer)]


class GradientInterposition:
    """fp16 loss scaling and/or gradient accumulation for each call of the target (one micro-step).

    One `Tensor.backward` interposition serves both: a scalar loss is divided by k (accumulation),
    then scaled (fp16). One optimizer-step interposition serves both: the step is deferred to the last
    micro-step of the cycle (accumulation) and goes through the scaler (fp16). `zero_grad` and the LR
    scheduler are interposed only when accumulating. A step that already scales with its own GradScaler
    is left as it is: tensors from any `GradScaler.scale` are not scaled again, and `optimizer.step`
    called from any `GradScaler.step` reaches the optimizer directly.
    """

    def __init__(self, device_type: str, *, scale: bool = False, accumulate: int | None = None):
        import torch

        self.scaler = torch.amp.GradScaler(device_type) if scale else None
        self.accumulate = accumulate if accumulate and accumulate > 1 else None  # k micro-steps a cycle
        self.micro_steps = 0  # calls so far: where the next call falls in its accumulation cycle
        self.stepped = False  # our path stepped an optimizer in the current call (fp16: update the scaler)
        self.counts = {"optimizer_steps": 0, "optimizer_steps_deferred": 0, "zero_grads": 0, "zero_grads_skipped": 0}
        self._inside_scaler_step = False
        self._first = self._last = True
        self._backward_seen = False
        self._step_taken = False
        self._optimizers: Any = None  # a WeakSet, filled at the first call
        self._classes: dict[str, list[type]] = {}

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Interpose for one call; with fp16, `scaler.update()` runs at its end if an optimizer stepped."""
        import weakref

        import torch

        k = self.accumulate
        position = self.micro_steps % k if k else 0
        self._first, self._last = position == 0, k is None or position == k - 1
        self.micro_steps += 1
        self.stepped = self._step_taken = self._backward_seen = False
        if self._optimizers is None:
            # An LR scheduler replaces `optimizer.step` on the instance with a wrapper that calls the
            # class's step it saw at construction: a class-level patch never sees those calls.
            self._optimizers = weakref.WeakSet(live_optimizers())
            # Walking the class trees costs milliseconds: once per trial (the script's classes exist by now).
            self._classes = {
                "step": optimizer_classes(),
                "scheduler": subclasses_defining(torch.optim.lr_scheduler.LRScheduler, "step"),
                "zero_grad": [*subclasses_defining(torch.optim.Optimizer, "zero_grad"),
                              *subclasses_defining(torch.nn.Module, "zero_grad")],
            }
        scaling = self
        original_backward = torch.Tensor.backward
        original_scale = torch.amp.GradScaler.scale
        original_scaler_step = torch.amp.GradScaler.step

        def backward(tensor, *args, **kwargs):
            if tensor.dim() == 0 and tensor.requires_grad and tensor.is_floating_point():
                users_scaled = getattr(tensor, "_advisor_scaled", False)
                loss = tensor
                if k:
                    tensor = tensor / k
                if scaling.scaler is not None and not users_scaled:
                    tensor = scaling.scaler.scale(tensor)
                tensor._advisor_loss_of = loss  # the loss as the user computed it (loop.capture_losses)
            scaling._backward_seen = True
            return original_backward(tensor, *args, **kwargs)

        def scale(scaler, outputs):
            scaled = original_scale(scaler, outputs)
            if isinstance(scaled, torch.Tensor):
                scaled._advisor_scaled = True
            return scaled

        def scaler_step(scaler, optimizer, *args, **kwargs):
            if not scaling._last:  # the user's own GradScaler, mid-cycle
                scaling.counts["optimizer_steps_deferred"] += 1
                return None
            if scaler is not scaling.scaler:
                scaling.counts["optimizer_steps"] += 1
                scaling._step_taken = True
            previous, scaling._inside_scaler_step = scaling._inside_scaler_step, True
            try:
                return original_scaler_step(scaler, optimizer, *args, **kwargs)
            finally:
                scaling._inside_scaler_step = previous

        with contextlib.ExitStack() as stack:
            patch = stack.enter_context
            patch(patched_attribute(torch.Tensor, "backward", backward))
            patch(patched_attribute(torch.amp.GradScaler, "scale", scale))
            patch(patched_attribute(torch.amp.GradScaler, "step", scaler_step))
            for cls in self._classes["step"]:
                patch(patched_attribute(cls, "step", self._wrap_step(vars(cls)["step"])))
            for optimizer in list(self._optimizers):
                if "step" in vars(optimizer):
                    patch(patched_attribute(optimizer, "step", self._wrap_instance_step(optimizer, vars(optimizer)["step"])))
            if k:
                for name in ("unscale_", "update"):
                    patch(patched_attribute(torch.amp.GradScaler, name, self._last_micro_step_only(getattr(torch.amp.GradScaler, name))))
                for cls in self._classes["scheduler"]:
                    patch(patched_attribute(cls, "step", self._last_micro_step_only(vars(cls)["step"])))
                for cls in self._classes["zero_grad"]:
                    patch(patched_attribute(cls, "zero_grad", self._wrap_zero_grad(vars(cls)["zero_grad"])))
            yield
        if self.stepped and self.scaler is not None:
            self.scaler.update()

    def _step(self, optimizer: Any, call: Callable[[], Any]) -> Any:
        """An optimizer step: deferred to the cycle's last micro-step; through our scaler with fp16."""
        self._optimizers.add(optimizer)
        if not self._last:
            self.counts["optimizer_steps_deferred"] += 1
            return None
        self.stepped = self._step_taken = True
        self.counts["optimizer_steps"] += 1
        if self.scaler is not None:
            return self.scaler.step(optimizer)
        return call()

    def _wrap_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def step(optimizer, *args, **kwargs):
            # GradScaler.step calls optimizer.step itself: that inner call must reach the original.
            if self._inside_scaler_step or "closure" in kwargs or args:
                return original(optimizer, *args, **kwargs)
            return self._step(optimizer, lambda: original(optimizer))

        return step

    def _wrap_instance_step(self, optimizer: Any, original: Callable[..., Any]) -> Callable[..., Any]:
        # wraps: keeps the markers torch checks (`hooked`, `_wrapped_by_lr_sched`)
        @functools.wraps(original)
        def step(*args, **kwargs):
            if self._inside_scaler_step or "closure" in kwargs or args:
                return original(*args, **kwargs)
            return self._step(optimizer, original)

        return step

    def _last_micro_step_only(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def method(owner, *args, **kwargs):
            return original(owner, *args, **kwargs) if self._last else None

        return method

    def _wrap_zero_grad(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def zero_grad(owner, *args, **kwargs):
            # Only when no gradient of the current cycle would be lost.
            if (self._first and not self._backward_seen) or self._step_taken:
                self.counts["zero_grads"] += 1
                return original(owner, *args, **kwargs)
            self.counts["zero_grads_skipped"] += 1
            return None

        return zero_grad


class GradScaling(GradientInterposition):
    """fp16 loss scaling alone: `backward` scaled, `optimizer.step` via the scaler."""

    def __init__(self, device_type: str):
        super().__init__(device_type, scale=True)


class Accumulation(StepChange):
    """The `accumulation_steps` knob's change of the step (its `Knob.on_step`): k calls of the step are one cycle of
    the `GradientInterposition`, where the training DataLoader yields micro-batches (the loader's plan,
    `accumulation_steps.in_loader`, says whether it does); without a step function, not applicable."""

    record_fields = ("accumulation",)

    def __init__(self, value: int, device_type: str) -> None:
        super().__init__(value, device_type)
        self.requested = value if value > 1 else None
        self.steps: int | None = None  # k, once the first call found the micro-batches

    def first_call(self, torch: Any, args: tuple, kwargs: dict, loaders: list | None) -> None:
        """Accumulate where a DataLoader was built with micro-batches (always where the caller feeds the step)."""
        if loaders is None:
            self.steps = self.requested
            self.outcome = APPLIED if self.requested else None
        elif any(r.outcomes.get(KNOB.name) == APPLIED for r in loaders):
            self.steps = self.requested

    def gradients(self) -> dict[str, Any]:
        """k micro-steps a cycle."""
        return {"accumulate": self.steps} if self.steps else {}

    def after_steps(self, gradients: GradientInterposition | None) -> str | None:
        """Not applicable in a target that never steps an optimizer (the user's loop steps it after every call, so
        no step waited for the cycle's end)."""
        record = self.record(gradients)["accumulation"]
        if record and record["micro_steps"] and not record["optimizer_steps"] + record["optimizer_steps_deferred"]:
            return not_applicable(
                "the target never calls optimizer.step(), so the optimizer cannot wait for the cycle's end")
        return None

    def record(self, gradients: GradientInterposition | None) -> dict[str, Any]:
        """What accumulation did: k, micro-steps run, optimizer steps and zero_grads taken and skipped."""
        if gradients is None or gradients.accumulate is None:
            return {"accumulation": None}
        return {"accumulation": {"steps": gradients.accumulate, "micro_steps": gradients.micro_steps,
                                 **gradients.counts}}

    def in_loop(self) -> str | None:
        """Accumulation needs the bounds of a step."""
        if self.requested:
            return not_applicable(
                "gradient accumulation needs the bounds of a step: name the step function (script.py:train_step)")
        return None

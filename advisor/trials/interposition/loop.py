"""A training loop with no step function: its steps end where its optimizer steps, and the knobs reach the
whole run.

Most scripts have their loop inline, in a per-epoch function, or in a `Trainer.run` of an imported module.
With no target, the trial runs the script unchanged and:

- every `optimizer.step()` (torch's global optimizer post-hook: any optimizer, also when an LR
  scheduler wrapped it, also `step(closure)`) or `GradScaler.step(optimizer)` ends a step; where the
  loop steps several optimizers, the first to step is the clock;
- each requested knob's `StepChange` (`Knob.on_step`) says its outcome where there is no step (`in_loop`) and,
  applied, interposes for the whole run (`around_run`): `amp`'s bf16 autocasts the forward of each outermost
  module call, `non_blocking` makes every host-to-accelerator copy of the run non-blocking; fp16 (its GradScaler)
  and gradient accumulation need the bounds of a step: "not applicable" here (name a step function for them);
- the loss of a step is the last scalar that `backward()` ran from (`capture_losses`, in both ways);
- where a step ends, inside the optimizer's profiler range (torch runs its post-hooks there), an empty range
  `STEP_END_RANGE` marks it first, so the analysis charges the optimizer's update up to it only, not the trial's own
  end of the step (the loss read, the profiler's step and, in the last, its stop);
- a closure handed to `optimizer.step(closure)` (Lightning's way, L-BFGS's) runs under the profiler range
  `CLOSURE_RANGE` (`mark_closures`, in both ways), so the analysis charges its forward and backward to
  the closure, and only the rest of the step's span to the optimizer's own update.

Inside the trial only (torch imported lazily).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable

from advisor.knobs.in_trial import patched_attribute
from advisor.trials.interposition.step import step_changes
from advisor.trials.knobs import APPLIED, Knobs


class LoopInterposition:
    """The knobs of a loop trial, applied to the whole run, and the optimizer as the clock of its steps."""

    def __init__(self, knobs: Knobs, device_type: str, step_ended: Callable[[], None]):
        self.step_ended = step_ended
        self.changes = step_changes(knobs, device_type)
        self.outcomes = {name: outcome for name, change in self.changes.items()
                         if (outcome := change.in_loop()) is not None}
        self.clock: Any = None  # a weak reference to the optimizer whose steps end steps
        self.in_scaler = 0
        self.record_function: Any = None  # torch's, once installed

    def install(self) -> Callable[[], None]:
        """Interpose for the rest of the process; returns an undo."""
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        stack = contextlib.ExitStack()
        self.record_function = torch.profiler.record_function
        stack.callback(register_optimizer_step_post_hook(self._optimizer_stepped).remove)
        original_scaler_step = torch.amp.GradScaler.step
        interposition = self

        def scaler_step(scaler, optimizer, *args, **kwargs):
            interposition.in_scaler += 1
            try:
                result = original_scaler_step(scaler, optimizer, *args, **kwargs)
            finally:
                interposition.in_scaler -= 1
            interposition._stepped(optimizer)  # also when the scaler skipped the step (inf gradients)
            return result

        stack.enter_context(patched_attribute(torch.amp.GradScaler, "step", scaler_step))
        for name, change in self.changes.items():
            if self.outcomes.get(name) == APPLIED:
                change.around_run(torch, stack)
        return stack.close

    def _optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.in_scaler:  # inside GradScaler.step the scaler's own return ends the step
            self._stepped(optimizer)

    def _stepped(self, optimizer: Any) -> None:
        if self.clock is None:
            self.clock = weakref.ref(optimizer)
        if self.clock() is optimizer:
            with self.record_function(STEP_END_RANGE):
                pass
            self.step_ended()


CLOSURE_RANGE = "## optimizer closure: forward and backward ##"  # advisor.analysis.launches reads this name
STEP_END_RANGE = "## the trial ends the step here ##"  # and this one


def mark_closures() -> Callable[[], None]:
    """Run every closure handed to an optimizer's `step` under the profiler range `CLOSURE_RANGE` (a global
    optimizer pre-hook may hand back new arguments); returns an undo."""
    import functools

    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    def marked(closure: Callable[[], Any]) -> Callable[[], Any]:
        @functools.wraps(closure)
        def run(*args, **kwargs):
            with torch.profiler.record_function(CLOSURE_RANGE):
                return closure(*args, **kwargs)

        run._advisor_closure = True  # type: ignore[attr-defined]
        return run

    def pre_hook(optimizer: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if args and callable(args[0]) and not getattr(args[0], "_advisor_closure", False):
            return (marked(args[0]), *args[1:]), kwargs
        closure = kwargs.get("closure")
        if callable(closure) and not getattr(closure, "_advisor_closure", False):
            return args, {**kwargs, "closure": marked(closure)}
        return None

    return register_optimizer_step_pre_hook(pre_hook).remove


def capture_losses(seen: Callable[[Any], None], sites: dict[str, Any]) -> Callable[[], None]:
    """Hand every scalar that `backward()` runs from to `seen` (the step's loss, when the step returns none;
    the unscaled one where advisor scaled it), and record in `sites["backward"]` where the user's code
    first called it (file, function, line: where a suggested patch puts autocast); returns an undo."""
    import torch

    from advisor.trials.interposition.loaders import user_frame

    original = torch.Tensor.backward

    def backward(tensor, *args, **kwargs):
        if tensor.dim() == 0 and tensor.is_floating_point():
            seen(getattr(tensor, "_advisor_loss_of", tensor).detach())
            if "backward" not in sites:
                frame = user_frame()
                if frame is not None:
                    code = frame.f_code
                    sites["backward"] = {"file": code.co_filename, "line": frame.f_lineno,
                                         "function": getattr(code, "co_qualname", code.co_name)}
        return original(tensor, *args, **kwargs)

    torch.Tensor.backward = backward

    def undo() -> None:
        torch.Tensor.backward = original

    return undo

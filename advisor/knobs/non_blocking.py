"""`non_blocking`: asynchronous host-to-device copies of the batch.

- **In the trial**: `non_blocking=True` on the step's host-to-device `.to()` / `.cuda()` copies. It is tried
  with [`pin_memory`](#advisor.knobs.pin_memory) as one change: an asynchronous copy needs a pinned source.
- **Proposed when**: host-to-device copies bind (on an accelerator), with pinned memory.
- **Not applicable**: the CPU.
- **The patch writes**: `non_blocking=True` in the step's copies.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Callable

from advisor.knobs.knob import APPLIED, AROUND_STEP, COPIES, FLAG, IN_STEP, STEP, Knob, Written, not_applicable
from advisor.knobs.in_trial import StepChange, patched_attribute
from advisor.knobs.pin_memory import PINNED


def not_here(device_type: str) -> str | None:
    """Why asynchronous copies do nothing on this device type; None where they can."""
    return "no accelerator: there are no host-to-device copies" if device_type == "cpu" else None


def _leaves_host(tensor: Any, target_device: Any) -> bool:
    """True when copying `tensor` to `target_device` leaves host memory for an accelerator."""
    return target_device is not None and tensor.device.type == "cpu" and target_device.type not in ("cpu", "meta")


def copying_to(torch: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """`Tensor.to` whose host-to-accelerator copies default to `non_blocking=True` (the user's value wins)."""
    def to(self, *args, **kwargs):
        if "non_blocking" not in kwargs and not any(isinstance(a, bool) for a in args):
            try:
                device = torch._C._nn._parse_to(*args, **kwargs)[0]
            except (TypeError, RuntimeError):
                device = None
            if _leaves_host(self, device):
                kwargs["non_blocking"] = True
        return original(self, *args, **kwargs)

    return to


def copying_cuda(original: Callable[..., Any]) -> Callable[..., Any]:
    """`Tensor.cuda` whose copies from host memory default to `non_blocking=True`."""
    def cuda(self, *args, **kwargs):
        if "non_blocking" not in kwargs and len(args) < 2 and self.device.type == "cpu":
            kwargs["non_blocking"] = True
        return original(self, *args, **kwargs)

    return cuda


def apply(torch: Any, stack: ExitStack) -> None:
    """Asynchronous copies until `stack` closes: `Tensor.to` and `Tensor.cuda` as above, then exactly what was
    there again (the class's own attribute, or none: the inherited one)."""
    stack.enter_context(patched_attribute(torch.Tensor, "to", copying_to(torch, torch.Tensor.to)))
    stack.enter_context(patched_attribute(torch.Tensor, "cuda", copying_cuda(torch.Tensor.cuda)))


class AsynchronousCopies(StepChange):
    """Its change of the step (`Knob.on_step`): asynchronous copies inside each call of the step, or, with no step
    function, over the whole run; false leaves the copies as they are."""

    def __init__(self, value: bool, device_type: str) -> None:
        super().__init__(value, device_type)
        why = not_here(device_type)
        self.outcome = APPLIED if why is None else not_applicable(why)

    def enter(self, torch: Any, stack: ExitStack) -> None:
        """The step's copies asynchronous, where they can be."""
        if self.outcome == APPLIED and self.value:
            apply(torch, stack)

    def around_run(self, torch: Any, stack: ExitStack) -> None:
        """Every copy of the run asynchronous."""
        self.enter(torch, stack)


# The what-if model's change is pin_memory's: pinned copies, which take both.
KNOB = Knob("non_blocking", FLAG, STEP, AROUND_STEP, "non_blocking copies", numerics=False, whatif=PINNED,
            written=Written(IN_STEP, step_part=COPIES, argument="non_blocking"), lint="non-blocking-copy", copies=True,
            proposed_as="non-blocking", on_step=AsynchronousCopies)

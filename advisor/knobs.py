"""`Knobs`: the settings a trial can change, and how each reaches the user's code by interposition.

Nothing here imports torch at module level: the parent process (the CLI, the session) builds and
records `Knobs` without torch; the functions that apply them run inside the trial subprocess and
import torch lazily.

How each knob is applied (inside the trial only):

- DataLoader knobs (`batch_size`, `num_workers`, `pin_memory`, `persistent_workers`,
  `prefetch_factor`): where the training loader is built (`advisor.loaders`).
- `threads`: `torch.set_num_threads(n)` in the training process before the script runs (and again at
  the first step, over a value the script set itself); DataLoader workers run one thread each as
  torch makes them.
- `amp`: the step runs inside `torch.autocast(device_type, dtype)` for each device type the step computes
  on (where the live modules' parameters are, found at the first call; else where its tensor
  arguments are), not the trial's `--device`: a model kept on the CPU of a GPU machine is autocast on
  the CPU. For fp16 a `GradScaler` covers the
  step: a scalar `loss.backward()` becomes `scaler.scale(loss).backward()`, `optimizer.step()` becomes
  `scaler.step(optimizer)`, and `scaler.update()` runs once when the step returns.
- `non_blocking`: inside the step, `Tensor.to(...)` and `Tensor.cuda(...)` from host memory to an
  accelerator get `non_blocking=True` unless the user passed a value.
- `accumulation_steps=k` (gradient accumulation; None or 1 = off): the effective batch stays the user's
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
import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

AMP_CHOICES = (None, "bf16", "fp16")
DATALOADER_KNOBS = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
APPLIED = "applied"


@dataclass(frozen=True)
class Knobs:
    """Settings for one trial; `None` everywhere means "leave the user's value"."""

    amp: str | None = None
    batch_size: int | None = None
    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    non_blocking: bool | None = None
    accumulation_steps: int | None = None
    threads: int | None = None  # torch intra-op threads of the training process (torch.set_num_threads)

    def __post_init__(self) -> None:
        problem = knobs_problem(self)
        if problem:
            raise ValueError(problem)

    def requested(self) -> dict[str, Any]:
        """The knobs this trial changes (those not None)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        """All fields, JSON-ready."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Knobs":
        """Inverse of `to_dict`; unknown keys are an error naming the key."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown knob {unknown[0]!r} (known: {', '.join(sorted(names))})")
        return cls(**data)

    def label(self) -> str:
        """A short name for folders and output, e.g. `amp-bf16+num_workers-2`, or `baseline`."""
        parts = []
        for key, value in self.requested().items():
            if key == "amp":
                parts.append(f"amp-{value}")
            elif isinstance(value, bool):
                parts.append(key.replace("_", "-") if value else f"no-{key.replace('_', '-')}")
            else:
                parts.append(f"{key.replace('_', '-')}-{value}")
        return "+".join(parts) or "baseline"


def knobs_problem(knobs: Knobs) -> str | None:
    """Why these values are invalid (one line), or None."""
    if knobs.amp not in AMP_CHOICES:
        return f"amp must be one of bf16, fp16 or None, not {knobs.amp!r}"
    for name in ("batch_size", "prefetch_factor", "accumulation_steps", "threads"):
        value = getattr(knobs, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            return f"{name} must be a positive integer, not {value!r}"
    if knobs.num_workers is not None and (
        not isinstance(knobs.num_workers, int) or isinstance(knobs.num_workers, bool) or knobs.num_workers < 0
    ):
        return f"num_workers must be an integer >= 0, not {knobs.num_workers!r}"
    for name in ("pin_memory", "persistent_workers", "non_blocking"):
        value = getattr(knobs, name)
        if value is not None and not isinstance(value, bool):
            return f"{name} must be true or false, not {value!r}"
    return None


def not_applicable(why: str) -> str:
    """The outcome text for a knob that could not be applied."""
    return f"not applicable: {why}"


# --------------------------------------------------------------------------------------------------
# Inside the step: autocast, GradScaler, non_blocking copies


def amp_outcome(knobs: Knobs, device_type: str) -> str | None:
    """Whether the `amp` knob can run on this device (None when not requested)."""
    if knobs.amp is None:
        return None
    if knobs.amp == "fp16" and device_type == "cpu":
        return not_applicable("fp16 autocast needs a CUDA device; on the CPU use bf16")
    if knobs.amp == "bf16" and device_type == "cuda":
        import torch

        if not torch.cuda.is_bf16_supported():
            return not_applicable("this GPU does not support bf16")
    return APPLIED


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
    if device_type == "cpu":
        return not_applicable("no accelerator: there are no host-to-device copies")
    return APPLIED


def is_host_to_accelerator(tensor: Any, target_device: Any) -> bool:
    """True when copying `tensor` to `target_device` leaves host memory for an accelerator."""
    if target_device is None:
        return False
    return tensor.device.type == "cpu" and target_device.type not in ("cpu", "meta")


def non_blocking_to(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap `Tensor.to` so host-to-accelerator copies default to `non_blocking=True`."""
    import torch

    def to(self, *args, **kwargs):
        if "non_blocking" not in kwargs and not any(isinstance(a, bool) for a in args):
            try:
                device = torch._C._nn._parse_to(*args, **kwargs)[0]
            except (TypeError, RuntimeError):
                device = None
            if is_host_to_accelerator(self, device):
                kwargs["non_blocking"] = True
        return original(self, *args, **kwargs)

    return to


def non_blocking_cuda(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap `Tensor.cuda` so copies from host memory default to `non_blocking=True`."""

    def cuda(self, *args, **kwargs):
        if "non_blocking" not in kwargs and len(args) < 2 and self.device.type == "cpu":
            kwargs["non_blocking"] = True
        return original(self, *args, **kwargs)

    return cuda


@contextlib.contextmanager
def patched_attribute(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Set `owner.name = value` for the block, then restore exactly what was there (or inherited)."""
    had_own = name in vars(owner)
    previous = vars(owner).get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if had_own:
            setattr(owner, name, previous)
        else:
            delattr(owner, name)


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

    def __init__(self, device_type: str, *, scale: bool = False, accumulation_steps: int | None = None):
        import torch

        self.scaler = torch.amp.GradScaler(device_type) if scale else None
        self.accumulation_steps = accumulation_steps if accumulation_steps and accumulation_steps > 1 else None
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

        k = self.accumulation_steps
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
                tensor._advisor_loss_of = loss  # the loss as the user computed it (advisor.loop.capture_losses)
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
                stack.enter_context(patched_attribute(torch.Tensor, "to", non_blocking_to(torch.Tensor.to)))
                stack.enter_context(
                    patched_attribute(torch.Tensor, "cuda", non_blocking_cuda(torch.Tensor.cuda))
                )
            yield

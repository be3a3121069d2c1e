"""`Knobs`: the settings a trial can change, and how each reaches the user's code by interposition.

Nothing here imports torch at module level: the parent process (the CLI, the session) builds and
records `Knobs` without torch; the functions that apply them run inside the trial subprocess and
import torch lazily.

How each knob is applied (inside the trial only):

- DataLoader knobs (`batch_size`, `num_workers`, `pin_memory`, `persistent_workers`,
  `prefetch_factor`): `torch.utils.data.DataLoader.__init__` is wrapped; the user's arguments are bound
  to the signature, the values the user wrote (or the defaults they relied on) are recorded, the
  requested ones are overridden, and the original `__init__` runs with the result.
- `amp`: the step runs inside `torch.autocast(device_type, dtype)`. For fp16 a `GradScaler` covers the
  step: a scalar `loss.backward()` becomes `scaler.scale(loss).backward()`, `optimizer.step()` becomes
  `scaler.step(optimizer)`, and `scaler.update()` runs once when the step returns.
- `non_blocking`: inside the step, `Tensor.to(...)` and `Tensor.cuda(...)` from host memory to an
  accelerator get `non_blocking=True` unless the user passed a value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
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
    for name in ("batch_size", "prefetch_factor"):
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
# DataLoader construction


@dataclass
class LoaderRecord:
    """One DataLoader the script built: what the user wrote and what it was built with."""

    user: dict[str, Any]
    effective: dict[str, Any]
    outcomes: dict[str, str]


def plan_loader_arguments(
    user: dict[str, Any], knobs: Knobs, *, accelerator: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """Pure: the DataLoader arguments to build with, and each requested knob's outcome.

    `user` holds the bound values of batch_size, batch_sampler, num_workers, pin_memory,
    persistent_workers and prefetch_factor. Overrides that DataLoader would reject (prefetch_factor or
    persistent_workers without workers, batch_size with a batch_sampler) are skipped with a reason.
    """
    effective = {k: user.get(k) for k in DATALOADER_KNOBS}
    outcomes: dict[str, str] = {}
    if knobs.batch_size is not None:
        if user.get("batch_sampler") is not None:
            outcomes["batch_size"] = not_applicable("the DataLoader uses a batch_sampler")
        elif user.get("batch_size") is None:
            outcomes["batch_size"] = not_applicable("the DataLoader does not batch (batch_size=None)")
        else:
            effective["batch_size"] = knobs.batch_size
            outcomes["batch_size"] = APPLIED
    if knobs.num_workers is not None:
        effective["num_workers"] = knobs.num_workers
        outcomes["num_workers"] = APPLIED
    workers = effective["num_workers"] or 0
    if workers == 0:
        # DataLoader raises for these without worker processes; the user's own values were valid for
        # their worker count, so fewer workers means dropping them.
        effective["persistent_workers"] = False
        effective["prefetch_factor"] = None
    if knobs.persistent_workers is not None:
        if workers == 0 and knobs.persistent_workers:
            outcomes["persistent_workers"] = not_applicable("the DataLoader has no worker processes")
        else:
            effective["persistent_workers"] = knobs.persistent_workers
            outcomes["persistent_workers"] = APPLIED
    if knobs.prefetch_factor is not None:
        if workers == 0:
            outcomes["prefetch_factor"] = not_applicable("the DataLoader has no worker processes")
        else:
            effective["prefetch_factor"] = knobs.prefetch_factor
            outcomes["prefetch_factor"] = APPLIED
    if knobs.pin_memory is not None:
        if not accelerator:
            outcomes["pin_memory"] = not_applicable("no accelerator: batches stay in host memory")
        else:
            effective["pin_memory"] = knobs.pin_memory
            outcomes["pin_memory"] = APPLIED
    return effective, outcomes


def install_dataloader_knobs(knobs: Knobs, *, accelerator: bool, records: list[LoaderRecord]) -> Callable[[], None]:
    """Wrap `DataLoader.__init__` so every loader the script builds gets the knobs; returns an undo."""
    import torch.utils.data

    cls = torch.utils.data.DataLoader
    original = cls.__init__
    signature = inspect.signature(original)

    def __init__(self, *args, **kwargs):  # noqa: N807 - it replaces __init__
        if getattr(self, "_advisor_building", False):  # a subclass calling super().__init__ again
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        user = {k: values.get(k) for k in (*DATALOADER_KNOBS, "batch_sampler")}
        effective, outcomes = plan_loader_arguments(user, knobs, accelerator=accelerator)
        for key in DATALOADER_KNOBS:
            values[key] = effective[key]
        records.append(
            LoaderRecord(user={k: user[k] for k in DATALOADER_KNOBS}, effective=effective, outcomes=outcomes)
        )
        self._advisor_building = True
        try:
            return original(*bound.args, **bound.kwargs)
        finally:
            self._advisor_building = False

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__.__signature__ = signature  # type: ignore[attr-defined]
    cls.__init__ = __init__

    def undo() -> None:
        cls.__init__ = original

    return undo


def dataloader_outcomes(knobs: Knobs, records: list[LoaderRecord]) -> dict[str, str]:
    """Per requested DataLoader knob: its outcome over all loaders the script built."""
    outcomes = {}
    for key in DATALOADER_KNOBS:
        if getattr(knobs, key) is None:
            continue
        seen = [r.outcomes[key] for r in records if key in r.outcomes]
        if not records:
            outcomes[key] = not_applicable("the script built no DataLoader before the steps ended")
        elif APPLIED in seen:
            outcomes[key] = APPLIED
        else:
            outcomes[key] = seen[0]
    return outcomes


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


def optimizer_classes() -> list[type]:
    """Every loaded `torch.optim.Optimizer` subclass that defines its own `step`."""
    import torch

    found, pending = [], [torch.optim.Optimizer]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if "step" in vars(cls):
            found.append(cls)
    return found


class GradScaling:
    """fp16 loss scaling by interposition: `backward` scaled, `optimizer.step` via the scaler.

    A step that already scales with its own GradScaler is left as it is: tensors from any
    `GradScaler.scale` are not scaled again, and `optimizer.step` called from any `GradScaler.step`
    reaches the optimizer directly.
    """

    def __init__(self, device_type: str):
        import torch

        self.scaler = torch.amp.GradScaler(device_type)
        self.stepped = False
        self._inside_scaler_step = False

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Interpose for one step; `scaler.update()` runs once at the end if an optimizer stepped."""
        import torch

        scaling = self
        original_backward = torch.Tensor.backward
        original_scale = torch.amp.GradScaler.scale
        original_scaler_step = torch.amp.GradScaler.step

        def backward(tensor, *args, **kwargs):
            if (tensor.dim() == 0 and tensor.requires_grad and tensor.is_floating_point()
                    and not getattr(tensor, "_advisor_scaled", False)):
                tensor = scaling.scaler.scale(tensor)
            return original_backward(tensor, *args, **kwargs)

        def scale(scaler, outputs):
            scaled = original_scale(scaler, outputs)
            if isinstance(scaled, torch.Tensor):
                scaled._advisor_scaled = True
            return scaled

        def scaler_step(scaler, optimizer, *args, **kwargs):
            previous, scaling._inside_scaler_step = scaling._inside_scaler_step, True
            try:
                return original_scaler_step(scaler, optimizer, *args, **kwargs)
            finally:
                scaling._inside_scaler_step = previous

        with contextlib.ExitStack() as stack:
            stack.enter_context(patched_attribute(torch.Tensor, "backward", backward))
            stack.enter_context(patched_attribute(torch.amp.GradScaler, "scale", scale))
            stack.enter_context(patched_attribute(torch.amp.GradScaler, "step", scaler_step))
            for cls in optimizer_classes():
                stack.enter_context(patched_attribute(cls, "step", self._wrap_step(vars(cls)["step"])))
            self.stepped = False
            yield
        if self.stepped:
            self.scaler.update()

    def _wrap_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        scaling = self

        def step(optimizer, *args, **kwargs):
            # GradScaler.step calls optimizer.step itself: that inner call must reach the original.
            if scaling._inside_scaler_step or "closure" in kwargs or args:
                return original(optimizer, *args, **kwargs)
            result = scaling.scaler.step(optimizer)
            scaling.stepped = True
            return result

        return step


class StepInterposition:
    """What wraps each call of the target: autocast, fp16 GradScaler, non_blocking copies."""

    def __init__(self, knobs: Knobs, device_type: str):
        self.knobs = knobs
        self.device_type = device_type
        self.outcomes: dict[str, str] = {}
        amp = amp_outcome(knobs, device_type)
        if amp is not None:
            self.outcomes["amp"] = amp
        non_blocking = non_blocking_outcome(knobs, device_type)
        if non_blocking is not None:
            self.outcomes["non_blocking"] = non_blocking
        self.use_amp = amp == APPLIED
        self.use_non_blocking = non_blocking == APPLIED and bool(knobs.non_blocking)
        self.scaling = GradScaling(device_type) if self.use_amp and knobs.amp == "fp16" else None

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """The context one call of the target runs in."""
        import torch

        with contextlib.ExitStack() as stack:
            if self.use_amp:
                dtype = torch.bfloat16 if self.knobs.amp == "bf16" else torch.float16
                stack.enter_context(torch.autocast(device_type=self.device_type, dtype=dtype))
            if self.scaling is not None:
                stack.enter_context(self.scaling.active())
            if self.use_non_blocking:
                stack.enter_context(patched_attribute(torch.Tensor, "to", non_blocking_to(torch.Tensor.to)))
                stack.enter_context(
                    patched_attribute(torch.Tensor, "cuda", non_blocking_cuda(torch.Tensor.cuda))
                )
            yield

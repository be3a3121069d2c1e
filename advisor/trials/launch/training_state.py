"""The model and optimizer a notebook's step trains, put back as they were before each in-process trial.

A subprocess trial starts from the script's own start; an in-process trial runs the user's live objects,
which would otherwise go on learning from one trial to the next (the loss of a later trial then measures
the training the earlier ones did, not the change it tries). `TrainingState.capture` finds the modules,
optimizers and learning-rate schedulers the step reaches (its closure and the globals it names, the
object of a bound method, and their attributes one level down), and copies their state dicts and the RNG
states to the CPU; `restore` loads them back. Torch is imported when used.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable


def _cpu_copy(value: Any) -> Any:
    """A copy of a state dict (nested dicts, lists, tensors) with every tensor copied to the CPU."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _cpu_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu_copy(v) for v in value)
    return value


def _stateful(value: Any) -> bool:
    import torch

    scheduler = getattr(torch.optim.lr_scheduler, "LRScheduler", None) or torch.optim.lr_scheduler._LRScheduler
    return isinstance(value, (torch.nn.Module, torch.optim.Optimizer, scheduler))


def reachable_objects(train_step: Callable) -> list[Any]:
    """The modules, optimizers and schedulers the step can reach: closure cells and the globals it names,
    the object of a bound method (or a callable object itself), and one level of their attributes."""
    fn = inspect.unwrap(train_step)
    roots: list[Any] = []
    owner = getattr(fn, "__self__", None)
    if owner is not None:
        roots.append(owner)
        fn = fn.__func__
    elif not inspect.isfunction(fn) and not inspect.ismethod(fn):
        roots.append(fn)  # a callable object: its attributes hold the model
        fn = getattr(type(fn), "__call__", None)
    if inspect.isfunction(fn):
        found = inspect.getclosurevars(fn)
        roots += list(found.nonlocals.values()) + list(found.globals.values())
    objects: dict[int, Any] = {}
    for root in roots:
        for value in [root, *(vars(root).values() if hasattr(root, "__dict__") and not inspect.ismodule(root)
                              and not inspect.isclass(root) and not _stateful(root) else ())]:
            if _stateful(value):
                objects.setdefault(id(value), value)
    return list(objects.values())


@dataclass
class TrainingState:
    """What the step trains, as it was when captured: state dicts and RNG states, on the CPU."""

    objects: list[Any] = field(default_factory=list)
    states: list[Any] = field(default_factory=list)
    rng: Any = None
    cuda_rng: Any = None

    @classmethod
    def capture(cls, train_step: Callable) -> "TrainingState":
        """The state of every module, optimizer and scheduler the step reaches, and of torch's RNGs."""
        import torch

        objects = reachable_objects(train_step)
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        return cls(objects, [_cpu_copy(o.state_dict()) for o in objects], torch.get_rng_state(),
                   torch.cuda.get_rng_state_all() if cuda else None)

    def describe(self) -> str:
        """What is restored before each trial, in a few words."""
        if not self.objects:
            return ("no model or optimizer found in the step's closure, globals or object: each in-process "
                    "trial goes on from where the one before left the model")
        names = sorted({type(o).__name__ for o in self.objects})
        return f"each in-process trial starts from the same state of {', '.join(names)} and the same RNG state"

    def restore(self) -> None:
        """Load the captured states back into the same objects (their parameters stay where they are)."""
        import torch

        for obj, state in zip(self.objects, self.states):
            obj.load_state_dict(_cpu_copy(state))
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)

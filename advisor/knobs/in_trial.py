"""What a knob's module uses inside the trial: patching an attribute and putting it back, the training
DataLoader's arguments as a trial plans them (`Knob.in_loader`), a DataLoader's workers queue, how a knob changes
the model (`ModelChange`, `Knob.on_model`), the training Dataset and the step's copies (`DataChange`,
`Knob.on_data`) or each call of the step (`StepChange`, `Knob.on_step`), and what the trial saw the script do
itself (`ScriptSeen`, read by `Knob.own_at_end`). Stdlib only: torch is given by the trial.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from importlib import import_module
from typing import TYPE_CHECKING, Any, Iterator

from advisor.knobs.knob import APPLIED, not_applicable

if TYPE_CHECKING:
    from advisor.knobs.knob import Knob


def declared_class(declared: Any) -> Any:
    """A knob's trial-side class (`Knob.on_model`, `Knob.on_data`, `Knob.on_step`): given in its module, or imported,
    inside the trial, from where its module names it ("package.module:Class", in the trial's code this package may
    not import)."""
    if not isinstance(declared, str):
        return declared
    module, _, name = declared.partition(":")
    return getattr(import_module(module), name)


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


def forwards_back(replaced: list[tuple[Any, bool, Any]]) -> None:
    """Give each module its own `forward` back: `(module, had its own, that forward)`, the one it had, or none (its
    class's again)."""
    for module, had_own, forward in replaced:
        if had_own:
            module.forward = forward
        else:
            module.__dict__.pop("forward", None)


def workers_queue(*sources: dict[str, Any]) -> tuple[int, int]:
    """(worker processes, batches each prefetches) a DataLoader runs with: each from the first of `sources` that sets
    it (its effective arguments, the knobs, the user's values), else DataLoader's own (none; 2 a worker)."""
    def first(name: str, default: int) -> int:
        return int(next((s[name] for s in sources if s.get(name) is not None), default) or default)

    return first("num_workers", 0), first("prefetch_factor", 2)


@dataclass
class LoaderArguments:
    """The training DataLoader's arguments as a trial plans them (`Knob.in_loader`): those the script gave (batch_size,
    batch_sampler and each DataLoader knob's), those it will be built with (each DataLoader knob's, changed by the
    knobs in turn), and whether its batches go to an accelerator."""

    user: dict[str, Any]
    effective: dict[str, Any]
    accelerator: bool

    @property
    def workers(self) -> int:
        """The worker processes it will be built with."""
        return self.effective.get("num_workers") or 0

    def plan(self, knobs: Any, planned: Any) -> dict[str, str]:
        """Each of the `planned` knobs' outcome at its value in `knobs`, planned in turn (`Knob.in_loader`), where it
        asked for something."""
        outcomes = {}
        for knob in planned:
            outcome = knob.in_loader(knob, getattr(knobs, knob.name), self)
            if outcome is not None:
                outcomes[knob.name] = outcome
        return outcomes

    def unbatched(self) -> str | None:
        """Why the loader's batch cannot be changed (a batch_sampler of the script's, or no batching), or None."""
        if self.user.get("batch_sampler") is not None:
            return not_applicable("the DataLoader uses a batch_sampler")
        if self.effective.get("batch_size") is None:
            return not_applicable("the DataLoader does not batch (batch_size=None)")
        return None


def as_given(knob: Knob, value: Any, loader: LoaderArguments) -> str | None:
    """A DataLoader argument the knob's value replaces as it is."""
    if value is None:
        return None
    loader.effective[knob.name] = value
    return APPLIED


def with_workers(knob: Knob, value: Any, loader: LoaderArguments) -> str | None:
    """A DataLoader argument torch takes only with worker processes: without them, the value it takes then in place
    of the script's (valid for its own worker count), and a requested one not applicable."""
    if loader.workers == 0:
        loader.effective[knob.name] = knob.without_workers
    if value is None:
        return None
    if loader.workers == 0 and value != knob.without_workers:
        return not_applicable("the DataLoader has no worker processes")
    loader.effective[knob.name] = value
    return APPLIED


class ModelChange:
    """What a knob applied at the model's first call does to the trial's models (`Knob.on_model`, one per trial),
    inside the trial, torch given: `advisor.trials.interposition.model` calls it at each model's first call, at
    each call of a model, when a step raises, and after the steps. The defaults change nothing."""

    # Applied after the model's own rewrites (attention, checkpointed blocks), which a compile must trace.
    after_rewrites = False
    # The fields of trial.json its `record` fills (null where it did not run).
    record_fields: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.outcome: str | None = None  # APPLIED, or not applicable and why; None until a model was called
        self.user: Any = None  # the script's own value before it changed it (the patch's "from X to Y")

    def apply(self, torch: Any, module: Any, args: tuple) -> None:
        """Change a model (a module with parameters) at its first call; set `outcome`."""

    def call(self, torch: Any, module: Any, args: tuple) -> tuple | None:
        """The arguments a call of a model changed by it runs with (None: as given)."""
        return None

    def failed(self, exc: BaseException) -> None:
        """A step raised: where the error is this change's own, its outcome says so."""

    def record(self) -> dict[str, Any]:
        """What its `record_fields` of trial.json hold after the steps."""
        return {}

    def undo(self, torch: Any) -> None:
        """Take the change back (an in-process trial's model is the user's)."""


@dataclass
class ScriptSeen:
    """What a trial saw the script do itself, by its end: what a knob's `own_at_end` reads its setting from
    (`advisor.trials.interposition.own_settings` gathers it)."""

    knobs: Any  # the trial's own knobs (`Knobs`): what the advisor applied
    # Autocasts the advisor's code did not enter, open while a module with parameters ran with gradients on (a
    # training forward), each (dtype, owner) once, in the order seen: {dtype: "torch.bfloat16", owner: None (the
    # script's code) or the installed package that entered it ("accelerate"), site: "train.py:84" or None}.
    autocasts: list[dict[str, Any]] = field(default_factory=list)
    optimizers: list[dict[str, Any]] = field(default_factory=list)  # trial.json's `optimizers`: those built
    backwards_per_step: list[int] = field(default_factory=list)  # scalar backward passes per optimizer step


# One setting the script made itself: its knob value, a phrase for people ("bf16 autocast"), where the script sets
# it (`file.py:LINE`) or None.
Own = tuple[Any, str, "str | None"]


class DataChange:
    """What a knob applied in the training Dataset and the step's copies does (`Knob.on_data`, one per trial), inside
    the trial, torch given: `advisor.trials.interposition.loaders` calls it where the training DataLoader is built,
    as any DataLoader's iteration starts and as it hands out each batch, and after the steps. The defaults change
    nothing."""

    # The fields of trial.json its `record` fills.
    record_fields: tuple[str, ...] = ()

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type

    def install(self, torch: Any) -> None:
        """Interpose for the rest of the trial's process (the step's copies)."""

    def at_training_loader(self, dataset: Any, site: str | None) -> str | None:
        """Change the training DataLoader's Dataset: its outcome (None: it asked for nothing of this loader)."""
        return None

    def batches_of(self, dataset: Any) -> Any:
        """What it does to the batches of a DataLoader over `dataset` (None: nothing), as its iteration starts."""
        return None

    def batch(self, batch: Any, how: Any) -> Any:
        """A batch as the DataLoader hands it out, changed as `batches_of` said."""
        return batch

    def outcome(self, loader_outcome: str | None) -> str | None:
        """Its outcome once the steps ran, from the training DataLoader's (`loader_outcome`)."""
        return loader_outcome

    def record(self) -> dict[str, Any]:
        """What its `record_fields` of trial.json hold after the steps."""
        return {}


class StepChange:
    """What a knob applied around each call of the step function does (`Knob.on_step`, one per trial, for a value the
    trial sets), inside the trial, torch given: `advisor.trials.interposition.step` calls it at the step's first call,
    around each call and after the steps; where the script has no step function,
    `advisor.trials.interposition.loop` asks its outcome there and has it interpose for the whole run. The defaults
    change nothing."""

    # The fields of trial.json its `record` fills (null where it did not run).
    record_fields: tuple[str, ...] = ()

    def __init__(self, value: Any, device_type: str) -> None:
        self.value = value
        self.device_type = device_type
        self.outcome: str | None = None  # APPLIED, or not applicable and why; None while it has none of its own

    def first_call(self, torch: Any, args: tuple, kwargs: dict, loaders: list | None) -> None:
        """Decide at the step's first call, made with `args` and `kwargs`: the model and the training DataLoader
        exist by then (`loaders`: the DataLoaders' records, with their outcomes; None where the caller feeds the
        step itself)."""

    def gradients(self) -> dict[str, Any]:
        """What it asks of the step's gradients: `GradientInterposition`'s arguments (loss scaling, accumulation)."""
        return {}

    def enter(self, torch: Any, stack: contextlib.ExitStack) -> None:
        """Enter what one call of the step runs in, until `stack` closes."""

    def after_steps(self, gradients: Any) -> str | None:
        """Its outcome where only the steps could tell (None: as it was); `gradients`: the step's
        `GradientInterposition`, or None where none ran."""
        return None

    def record(self, gradients: Any) -> dict[str, Any]:
        """What its `record_fields` of trial.json hold after the steps."""
        return {}

    def in_loop(self) -> str | None:
        """Its outcome where the script has no step function (the whole run is the place)."""
        return self.outcome

    def around_run(self, torch: Any, stack: contextlib.ExitStack) -> None:
        """With no step function, and applied there: interpose for the whole run, until `stack` closes."""

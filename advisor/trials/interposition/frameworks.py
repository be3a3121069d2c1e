"""Knobs applied in a framework's own terms, where the framework owns the setting. Inside the trial only.

transformers' `Trainer` builds its training DataLoader from `TrainingArguments`, and accelerate rebuilds it
with a `batch_sampler` (a `DataLoaderShard`), which no `batch_size` given to a DataLoader can change. So for
a script that builds `TrainingArguments` (or a subclass), the DataLoader knobs go into its fields instead,
as the user would set them: `per_device_train_batch_size` (with `gradient_accumulation_steps` for
micro-batches that keep the effective batch), `dataloader_num_workers`, `dataloader_pin_memory`,
`dataloader_persistent_workers`, `dataloader_prefetch_factor`. The fields are set in `__post_init__`
(every dataclass subclass's `__init__` calls it), once transformers' `training_args` module is imported
(an import hook: transformers is never imported for a script that does not use it). The script's own values
are recorded, under the knobs' names, for the patch's "from X to Y".

The other knobs (autocast, compile, fused optimizers, TF32) reach a framework's loop by the same
interposition as any script's (`advisor.trials.interposition.loop`, `model_knobs`, `optimizers`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any, Callable

from advisor.knobs import KNOBS, PLANNED_AT_LOADER, TRAINING_ARGUMENTS
from advisor.knobs.in_trial import LoaderArguments
from advisor.trials.knobs import APPLIED, Knobs


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls `callback(module)` once the module named `name` has been executed."""

    def __init__(self, name: str, callback: Callable[[Any], None]):
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        """The module's own spec, its loader made to call back after executing it."""
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        original, callback = spec.loader.exec_module, self.callback

        def exec_module(module: Any) -> None:
            original(module)
            callback(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


class TrainerSettings:
    """The DataLoader knobs as `TrainingArguments` fields; what the script set; each knob's outcome."""

    def __init__(self, knobs: Knobs, *, accelerator: bool):
        self.knobs = knobs
        self.accelerator = accelerator
        self.user: dict[str, Any] = {}  # knob -> the script's value of its field
        self.outcomes: dict[str, str] = {}
        self.site: str | None = None  # where the script builds its TrainingArguments
        self.built = 0

    def install(self) -> None:
        """Set the fields when transformers' TrainingArguments is defined (now, or when imported)."""
        module = sys.modules.get("transformers.training_args")
        if module is not None:
            self._wrap(module)
        else:
            sys.meta_path.insert(0, AfterImport("transformers.training_args", self._wrap))

    def taken(self) -> set[str]:
        """The knobs set through TrainingArguments (the DataLoader interposition leaves them alone)."""
        return set(self.outcomes) if self.built else set()

    def _wrap(self, module: Any) -> None:
        cls = getattr(module, "TrainingArguments", None)
        if cls is None or getattr(cls.__post_init__, "_advisor", False):
            return
        original, settings = cls.__post_init__, self

        def __post_init__(arguments: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
            settings.apply(arguments)
            return original(arguments, *args, **kwargs)

        __post_init__._advisor = True  # type: ignore[attr-defined]
        cls.__post_init__ = __post_init__

    def apply(self, arguments: Any) -> None:
        """Record the script's fields and set the requested knobs on them (the first TrainingArguments built)."""
        from advisor.trials.interposition.loaders import user_site

        self.built += 1
        if self.built > 1:
            return
        self.site = user_site()
        self.user = {knob: getattr(arguments, field, None) for knob, field in TRAINING_ARGUMENTS.items()}
        # A knob the Trainer counts itself (its micro-batches: gradient_accumulation_steps) multiplies its count.
        counted = [k for k in KNOBS if k.written and k.written.trainer_count]
        self.user.update({k.name: getattr(arguments, k.written.trainer_count, 1) for k in counted})
        # The loader's arguments planned as for a DataLoader the script builds (`Knob.in_loader`), on the fields: those
        # the Trainer has a field for, and the micro-batches it counts. A loader knob it has no field for is left to the
        # DataLoader it builds (the loader interposition).
        loader = LoaderArguments(self.user, {k: self.user.get(k) for k in TRAINING_ARGUMENTS}, self.accelerator)
        self.outcomes.update(loader.plan(self.knobs, [k for k in PLANNED_AT_LOADER
                                                      if k.name in TRAINING_ARGUMENTS or k in counted]))
        for name, field in TRAINING_ARGUMENTS.items():  # the Trainer hands these to its DataLoader
            if loader.effective[name] != self.user.get(name):
                setattr(arguments, field, loader.effective[name])
        for knob in counted:
            if self.outcomes.get(knob.name) == APPLIED:
                setattr(arguments, knob.written.trainer_count,
                        getattr(self.knobs, knob.name) * max(1, int(self.user[knob.name] or 1)))

    def record(self) -> dict[str, Any] | None:
        """What the trial learnt: the framework, where it is configured, the script's values."""
        if not self.built:
            return None
        return {"framework": "transformers", "site": self.site, "user": self.user}

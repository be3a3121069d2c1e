"""The `uint8_copies` knob: the DataLoader hands out 8-bit images, and the float conversion and the
normalization run where the step moves the batch to its device (right after the host-to-device copy on a
GPU: a quarter of the bytes; in the training process on the CPU: the workers' conversion moves out of
them). Inside the trial only (torch imported lazily).

Which Dataset code it changes is read on the running Dataset: a torchvision pipeline it holds
(`advisor.trials.interposition.uint8_transforms`), else its own `__getitem__`, read on a few of its items
(`advisor.trials.interposition.uint8_probe`: the float image traced back to its 8-bit source, the conversion
and the statements that change the image's values left out, the normalization fitted per channel and held
only to float rounding). Anything that is not a scale and offset of the 8-bit image (a random jitter, a
clamp) is not applicable, with the reason and the number; the data the model sees never changes. The
rewritten `__getitem__` returns the 8-bit image, the batch is marked as it leaves the loader (after pinning),
and the step's `.to(...)` of a marked batch returns it converted: `(x.float() / 255 - mean) / std` in the
dtype the Dataset computed in, so the same numbers reach the model (on the CPU it is converted as it leaves
the loader, where it enters the step).
"""

from __future__ import annotations

from typing import Any, Callable

from advisor.knobs.in_trial import DataChange
from advisor.trials.interposition.uint8_plan import BytePlan
from advisor.trials.knobs import APPLIED, not_applicable

MARK = "_advisor_uint8"  # the attribute a batch's 8-bit image tensor carries: its BytePlan


def rewrite_dataset(dataset: Any, site: str | None = None) -> tuple[BytePlan | None, str]:
    """For the trial: the training Dataset hands out 8-bit images (its torchvision transform or its class's
    `__getitem__` replaced; the process ends with the trial); returns the plan (None when not applicable)
    and the knob's outcome. `site`: where the DataLoader was built (the patch looks for the pipeline there)."""
    from advisor.trials.interposition.uint8_probe import probe_plan
    from advisor.trials.interposition.uint8_transforms import rewrite_pipeline

    if not hasattr(type(dataset), "__getitem__") or hasattr(dataset, "__iter__") and not hasattr(dataset, "__len__"):
        return None, not_applicable("the training DataLoader's dataset is not indexed by __getitem__")
    pipeline = rewrite_pipeline(dataset, site)
    if pipeline is not None:
        return pipeline
    plan = probe_plan(dataset)  # read from the Dataset's own items, whatever the spelling
    if isinstance(plan, str):
        return None, not_applicable(plan)
    type(dataset).__getitem__ = plan.function
    _REWRITTEN[type(dataset)] = plan
    return plan, APPLIED


_REWRITTEN: dict[type, BytePlan] = {}  # the Dataset classes whose __getitem__ this trial rebuilt


def plan_of(dataset: Any) -> BytePlan | None:
    """The plan that makes `dataset` hand out 8-bit images, if the trial applied one to it: the training
    loader's, or another loader's over the same Dataset (a validation loader, random_split's other Subset),
    whose batches are then converted where they are moved too."""
    from advisor.trials.interposition.uint8_transforms import pipeline_plan_of, wrapped_dataset

    found = pipeline_plan_of(dataset)
    if found is not None:
        return found
    return next((plan for cls, plan in _REWRITTEN.items() if isinstance(wrapped_dataset(dataset), cls)), None)


def mark(batch: Any, plan: BytePlan) -> None:
    """Tag the batch's 8-bit image tensor (as the step receives it, after pinning) with its plan."""
    import torch

    image = batch if plan.index is None else batch[plan.index] if isinstance(batch, (list, tuple)) else None
    if isinstance(image, torch.Tensor) and image.dtype == torch.uint8:
        setattr(image, MARK, plan)


class ByteCopies:
    """The step's `.to(...)` of a marked batch returns it converted to float and normalized."""

    def __init__(self, requested: bool):
        self.requested = requested
        self.converted = 0

    def to(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap `Tensor.to`: the copy first (8-bit bytes), then the conversion on its device."""
        interposition = self

        def to(tensor, *args, **kwargs):
            plan = getattr(tensor, MARK, None)
            if plan is None:
                return original(tensor, *args, **kwargs)
            interposition.converted += 1
            moved = original(tensor, *args, **kwargs)
            if moved.dtype == tensor.dtype:
                return plan.convert(moved)  # the 8-bit bytes were copied; the conversion runs where they went
            return original(plan.convert(tensor), *args, **kwargs)  # the call changes the dtype itself

        return to

    def at_loader(self, batch: Any, plan: BytePlan) -> Any:
        """The batch with its 8-bit image converted (on the CPU, as it leaves the loader for the step)."""
        import torch

        image = batch if plan.index is None else batch[plan.index] if isinstance(batch, (list, tuple)) else None
        if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8:
            return batch
        self.converted += 1
        if plan.index is None:
            return plan.convert(image)
        items = list(batch)
        items[plan.index] = plan.convert(image)
        return type(batch)(items) if isinstance(batch, tuple) and not hasattr(batch, "_fields") else items

    def outcome(self, loader_outcome: str | None) -> str | None:
        """The knob's outcome once the steps ran: the Dataset's (from the loader), or why the batch never
        reached the conversion."""
        if not self.requested:
            return None
        if loader_outcome is None:
            return not_applicable("no training DataLoader was built")
        if loader_outcome == APPLIED and not self.converted:
            return not_applicable("the step never moved the batch with .to(...), where the conversion runs")
        return loader_outcome


class EightBitImages(DataChange):
    """The `uint8_copies` knob's change (`Knob.on_data`): the training Dataset rewritten to hand out 8-bit images
    (`rewrite_dataset`, once: the first training DataLoader it applies to), every loader's batches over a Dataset made
    so marked for the step's copy (on the CPU converted as they leave the loader), the step's `.to(...)` converting
    them (`ByteCopies`); records the plan the patch writes (`uint8_plan`)."""

    record_fields = ("uint8_plan",)

    def __init__(self, device_type: str) -> None:
        super().__init__(device_type)
        self.copies = ByteCopies(True)
        self.plan: BytePlan | None = None

    def install(self, torch: Any) -> None:
        torch.Tensor.to = self.copies.to(torch.Tensor.to)  # for the rest of the trial's process

    def at_training_loader(self, dataset: Any, site: str | None) -> str | None:
        if self.plan is not None:  # another training loader's Dataset is 8-bit already
            return None
        self.plan, outcome = rewrite_dataset(dataset, site)
        return outcome

    def batches_of(self, dataset: Any) -> BytePlan | None:
        return plan_of(dataset)  # any loader over a Dataset made 8-bit (its workers copy it as they start)

    def batch(self, batch: Any, how: BytePlan) -> Any:
        if self.device_type == "cpu":  # where the batch enters the step: the workers still hand over a quarter
            return self.copies.at_loader(batch, how)
        mark(batch, how)
        return batch

    def outcome(self, loader_outcome: str | None) -> str | None:
        return self.copies.outcome(loader_outcome)

    def record(self) -> dict[str, Any]:
        return {"uint8_plan": self.plan.to_dict() if self.plan is not None else None}


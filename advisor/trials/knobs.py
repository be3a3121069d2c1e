"""`Knobs`: the settings a trial can change. A value of the parent side: the CLI, the session and the
notebook build and record them without torch.

How each reaches the user's code, inside the trial only (by interposition: the script is not edited):

- DataLoader knobs (`batch_size`, `num_workers`, `pin_memory`, `persistent_workers`, `prefetch_factor`):
  where the training loader is built (`advisor.trials.interposition.loaders`).
- `amp`, `non_blocking`: around each call of the step (`advisor.trials.interposition.step`), or, with no step
  function, around each outermost module call and for the whole run (`advisor.trials.interposition.loop`).
- `accumulation_steps` and fp16 loss scaling: `advisor.trials.interposition.gradients`.
- `threads`: `torch.set_num_threads(n)` when the steps start (`advisor.trials.harness.driver`), over a value the
  script set itself; DataLoader workers run one thread each as torch makes them.
- `channels_last`, `compile`, `tf32`, `cudnn_benchmark`, `sdpa`, `checkpointing`: at the model's first call
  (`advisor.trials.interposition.model`; sdpa's rewrite: `advisor.trials.interposition.attention`; the
  repeated blocks: `advisor.trials.interposition.checkpointing`); `fused_optimizer`: where the optimizer
  is built (`advisor.trials.interposition.optimizers`).
- `uint8_copies`: the training Dataset's `__getitem__` and the step's `.to(...)` of the batch
  (`advisor.trials.interposition.uint8_copies`).
- DDP knobs (`ddp_bucket_cap_mb`, `ddp_gradient_as_bucket_view`, `ddp_static_graph`,
  `ddp_find_unused_parameters`): where DistributedDataParallel wraps the model, on every rank alike
  (`advisor.trials.interposition.ddp_arguments`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

AMP_CHOICES = (None, "bf16", "fp16")
DATALOADER_KNOBS = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
MODEL_KNOBS = ("channels_last", "compile", "fused_optimizer", "tf32", "cudnn_benchmark", "sdpa")
MEMORY_KNOBS = ("checkpointing",)  # a model knob that buys memory, not speed: proposed where memory binds
DDP_KNOBS = ("ddp_bucket_cap_mb", "ddp_gradient_as_bucket_view", "ddp_static_graph", "ddp_find_unused_parameters")
APPLIED = "applied"


# knob -> the field of transformers' TrainingArguments that sets it (advisor.trials.interposition.frameworks applies it there,
# advisor.code.patch.frameworks writes it there)
TRAINING_ARGUMENTS = {
    "batch_size": "per_device_train_batch_size",
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
}


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
    channels_last: bool | None = None  # model and 4-D inputs in torch.channels_last (models with 2-D convolutions)
    compile: bool | None = None  # torch.compile of the model's forward
    fused_optimizer: bool | None = None  # torch.optim optimizers built with fused=True (else foreach=True)
    tf32: bool | None = None  # fp32 matmuls and convolutions as TF32 on Tensor Cores (CUDA, Ampere and later)
    cudnn_benchmark: bool | None = None  # cuDNN picks the fastest convolution algorithm per shape (CUDA)
    sdpa: bool | None = None  # attention written by hand as F.scaled_dot_product_attention (its forward rewritten)
    uint8_copies: bool | None = None  # the loader hands out 8-bit images; float and normalize where they are moved
    checkpointing: bool | None = None  # the model's repeated blocks under activation checkpointing (non-reentrant)
    ddp_bucket_cap_mb: int | None = None  # DistributedDataParallel's own arguments, on every rank
    ddp_gradient_as_bucket_view: bool | None = None
    ddp_static_graph: bool | None = None
    ddp_find_unused_parameters: bool | None = None

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
    for name in ("batch_size", "prefetch_factor", "accumulation_steps", "threads", "ddp_bucket_cap_mb"):
        value = getattr(knobs, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            return f"{name} must be a positive integer, not {value!r}"
    if knobs.num_workers is not None and (
        not isinstance(knobs.num_workers, int) or isinstance(knobs.num_workers, bool) or knobs.num_workers < 0
    ):
        return f"num_workers must be an integer >= 0, not {knobs.num_workers!r}"
    for name in ("pin_memory", "persistent_workers", "non_blocking", "ddp_gradient_as_bucket_view", "ddp_static_graph",
                 "ddp_find_unused_parameters", "uint8_copies", *MODEL_KNOBS, *MEMORY_KNOBS):
        value = getattr(knobs, name)
        if value is not None and not isinstance(value, bool):
            return f"{name} must be true or false, not {value!r}"
    return None


def not_applicable(why: str) -> str:
    """The outcome text for a knob that could not be applied."""
    return f"not applicable: {why}"

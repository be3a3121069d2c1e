"""`channels_last`: the model and its 4-D inputs in `torch.channels_last` (models with 2-D convolutions).

- **In the trial**: at the model's first call, its parameters and every 4-D input in `torch.channels_last`.
- **Proposed when**: convolutions take the step: ≥ 20% of a CPU step; on a GPU, layout conversions (≥ 5% of the
  kernel time) or convolutions, norms and pools on NCHW inputs, read from the trace's strides (≥ 20%). AMP with
  `channels_last` is the pair that pays most together on convolutions (bf16 kernels want NHWC).
- **The script's own**: the model's convolutions in channels_last at its first call.
- **Not applicable**: a model without 2-D convolutions.
- **The patch writes**: the model in channels_last just before the optimizer is built from it, the batch
  in channels_last where the step moves it to the device: each input the trial found 4-D at the model's first
  call (its record's `channels_last_inputs`: both images of a siamese model, never its 1-D targets).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from advisor.knobs.graph import StepGraph, TrialSettings, layout_share, relayout
from advisor.knobs.knob import APPLIED, AT_FIRST_CALL, FLAG, MODEL, ON_MODEL, Knob, WhatIf, Written, not_applicable
from advisor.knobs.in_trial import ModelChange


def _convolutions(torch: Any, module: Any) -> list[Any]:
    """The model's 2-D convolutions: the layers channels_last changes."""
    return [m for m in module.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))]


def not_for(torch: Any, module: Any) -> str | None:
    """Why channels_last changes nothing in this model (it changes only 2-D convolutions); None where it does."""
    if _convolutions(torch, module):
        return None
    return f"the model ({type(module).__name__}) has no 2-D convolutions: channels_last changes only them"


def own(torch: Any, module: Any) -> str | None:
    """The script's own: the model's first convolution in channels_last (and not also contiguous: a 1×1 one is
    both) at its first call."""
    conv = next(iter(_convolutions(torch, module)), None)
    if conv is not None and conv.weight.is_contiguous(memory_format=torch.channels_last) \
            and not conv.weight.is_contiguous():
        return "channels_last"
    return None


def apply(torch: Any, module: Any) -> bool:
    """The model's parameters in channels_last, in place (the optimizer keeps the same Parameter objects); returns
    whether the script had made them so itself (its first convolution's weights were)."""
    conv = _convolutions(torch, module)[0]
    own = conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
    module.to(memory_format=torch.channels_last)
    return own


def undo(torch: Any, module: Any) -> None:
    """The model's parameters back in the default layout."""
    module.to(memory_format=torch.contiguous_format)


def image_positions(torch: Any, args: tuple) -> list[int]:
    """The positions of a call's 4-D floating-point inputs: those the trial makes channels_last, and the patch
    writes it for (trial.json's `channels_last_inputs`)."""
    return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.dim() == 4 and a.is_floating_point()]


def inputs(torch: Any, value: Any) -> Any:
    """4-D floating-point tensors (also inside tuples, lists and dicts) in channels_last, as a user writes
    `x.to(device, memory_format=torch.channels_last)`."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 4 and value.is_floating_point():
            return value.contiguous(memory_format=torch.channels_last)
        return value
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(inputs(torch, v) for v in value)
    if isinstance(value, dict):
        return {k: inputs(torch, v) for k, v in value.items()}
    return value


class ChannelsLast(ModelChange):
    """In the trial: each model with 2-D convolutions in channels_last at its first call, and every 4-D input of its
    calls; the positions of those of its first call recorded (`channels_last_inputs`)."""

    record_fields = ("channels_last_inputs",)

    def __init__(self) -> None:
        super().__init__()
        self.layouts: list[Any] = []  # the models moved
        self.positions: list[int] | None = None

    def apply(self, torch: Any, module: Any, args: tuple) -> None:
        why = not_for(torch, module)
        if why is not None:
            self.outcome = self.outcome or not_applicable(why)  # another model may have convolutions
            return
        self.user = apply(torch, module)
        self.layouts.append(module)
        self.outcome = APPLIED

    def call(self, torch: Any, module: Any, args: tuple) -> tuple | None:
        if not any(m is module for m in self.layouts):
            return None
        if self.positions is None:
            self.positions = image_positions(torch, args)
        return inputs(torch, args)

    def record(self) -> dict[str, Any]:
        return {"channels_last_inputs": self.positions}

    def undo(self, torch: Any) -> None:
        for module in self.layouts:
            undo(torch, module)
        self.layouts = []


def setting(trial: TrialSettings) -> bool:
    """Whether the trial's model ran in channels_last."""
    return trial.flag("channels_last")


def transform(g: StepGraph, value: Any, p: float, params: dict[str, float]) -> StepGraph:
    """On a GPU, the share p of the layout conversion kernels removed; on a CPU, of the layout-sensitive time."""
    if bool(value) == g.channels_last:
        return g
    if g.platform == "cpu":
        # The layout-sensitive time (the convolutions and the normalisations and pools around them; on a
        # CPU there are no conversion kernels of their own): the share p of it saved, or given back.
        share = layout_share(g, p)
        return dataclasses.replace(relayout(g, 0.0, share) if value else relayout(g, share, 0.0),
                                   channels_last=bool(value))
    # On a GPU, the share p of the layout-sensitive kernels: the conversions, and the convolutions, norms and pools
    # the trace shows on NCHW inputs (NHWC kernels replace them). Turning it off brings back kernels the trace
    # cannot show: no change predicted.
    if not value:
        return dataclasses.replace(g, channels_last=False)
    return dataclasses.replace(g, channels_last=True, device_s=g.device_s - (g.layout_s + g.nchw_s) * p,
                               layout_s=g.layout_s * (1 - p), nchw_s=g.nchw_s * (1 - p))


# The share of the layout-sensitive time it saves: on a GPU of the conversions and the kernels on NCHW inputs (0.3
# at batch 32, 0.5-0.6 at 128-512 on the H200 conv surface, fp32 and bf16 alike); on a CPU of the operators' time.
WHAT_IF = WhatIf("channels_last", "channels_last", setting, transform, "channels_last", prior=0.5,
                 bounds=(0.0, 1.0), prior_cpu=0.25)


LINE = "{model} = {model}.to(memory_format=torch.channels_last)  # NHWC: faster convolutions"
WRITTEN = Written(
    ON_MODEL, lines=(LINE,), manual="after building the model: model = model.to(memory_format=torch.channels_last)",
    batch_keyword=("memory_format", "torch.channels_last"), batch_record="channels_last_inputs",
    batch_manual="the batch the model takes is not made channels_last here (the model's first convolution converts "
                 "it); to skip that copy: x = x.to(device, memory_format=torch.channels_last)",
    lightning_model=LINE)


KNOB = Knob("channels_last", FLAG, MODEL, AT_FIRST_CALL, "channels_last", in_process=True, advice="channels-last",
            spread=(0.15, 0.30), whatif=WHAT_IF, written=WRITTEN, own_at_first_call=own,
            layout=True, on_model=ChannelsLast)

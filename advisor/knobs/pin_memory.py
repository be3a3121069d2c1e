"""`pin_memory`: the training DataLoader's batches in pinned (page-locked) memory.

- **In the trial**: the DataLoader with `pin_memory=True`, and `non_blocking=True` on the step's
  host-to-device `.to()` / `.cuda()` copies; tried as one change.
- **Proposed when**: host-to-device copies bind (on an accelerator).
- **Not applicable**: the CPU.
- **The patch writes**: `pin_memory=True` in the DataLoader, `non_blocking=True` in the step's copies.
"""

from __future__ import annotations

from typing import Any

from advisor.knobs.graph import StepGraph, TrialSettings, faster_copies
from advisor.knobs.knob import AT_LOADER, FLAG, IN_LOADER, LOADER, Knob, WhatIf, Written, not_applicable
from advisor.knobs.in_trial import LoaderArguments, as_given
from advisor.knobs.offer import ROUND_GAIN, Best, Offer


def setting(trial: TrialSettings) -> bool:
    """Whether the trial's copies were pinned: its loader pinned its batches, and the step copied them
    asynchronously."""
    return bool(trial.value("pin_memory", False)) and bool(trial.knobs.get("non_blocking"))


def transform(g: StepGraph, value: Any, p: float, params: dict[str, float]) -> StepGraph:
    """The exposed copy time divided by p (faster DMA from pinned memory), or multiplied by it (turned off)."""
    if bool(value) == g.pinned:
        return g
    return faster_copies(g, p, bool(value), pinned=bool(value))


# One change of the model's, "pinned", for this knob and non_blocking: a copy is pinned and asynchronous only with
# both. The parameter: pinned copies run this much faster than pageable ones.
PINNED = WhatIf("pinned", "pinned", setting, transform, "copies", prior=2.0, bounds=(0.5, 8.0))


def offer(best: Best) -> Offer | None:
    """Pinned host memory and non_blocking copies, as one change (either alone does little), on an accelerator."""
    knobs, space = best.knobs, best.space
    if (not best.accelerator or not space.holds({"pin_memory": True, "non_blocking": True})
            or (knobs.pin_memory and knobs.non_blocking)):
        return None
    wanted = [k for k in ("pin_memory", "non_blocking") if space.permits({k})]  # --only/--skip may keep one
    if not wanted:
        return None
    found = [best.advice[i] for i in ("pin-memory", "non-blocking")
             if i in best.advice and i.replace("-", "_") in wanted]
    gain = sum(r.predicted_gain for r in found) if found else (0.05 if best.bound == "copy" else ROUND_GAIN)
    change, slug = (("pin_memory + non_blocking copies", "pinned-copies") if len(wanted) == 2 else
                    (f"{wanted[0]} alone", wanted[0].replace("_", "-")))
    return Offer({k: True for k in wanted}, change, slug, gain, "copy", predicted=bool(found))


def in_loader(knob: Knob, value: Any, loader: LoaderArguments) -> str | None:
    """The loader's pin_memory, where its batches go to an accelerator."""
    if value is not None and not loader.accelerator:
        return not_applicable("no accelerator: batches stay in host memory")
    return as_given(knob, value, loader)


KNOB = Knob("pin_memory", FLAG, LOADER, AT_LOADER, "pinned memory", training_argument="dataloader_pin_memory",
            numerics=False, proposed_as="pin-memory", spread=(0.30, None), whatif=PINNED,
            written=Written(IN_LOADER, position=7), offer=offer,
            together=("non_blocking", "pin_memory + non_blocking copies"), lint="dataloader-pin-memory", copies=True,
            in_loader=in_loader)

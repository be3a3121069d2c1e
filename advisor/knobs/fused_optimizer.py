"""`fused_optimizer`: torch.optim optimizers built with `fused=True` (else `foreach=True`).

- **In the trial**: torch.optim optimizers built with `fused=True` (Adam, AdamW, SGD, Adagrad), else
  `foreach=True` (`advisor.trials.interposition.optimizers`).
- **Proposed when**: the optimizer's step is ≥ 5% of the step.
- **The script's own**: an optimizer the script builds with `fused=True`.
- **Not applicable**: no torch.optim optimizer built in the trial (a notebook's, built before it).
- **The patch writes**: `fused=True` in the optimizer's constructor.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from advisor.knobs.graph import StepGraph, TrialSettings, host_cut, undone
from advisor.knobs.knob import AT_OPTIMIZER, FLAG, IN_OPTIMIZER, MODEL, Knob, WhatIf, Written
from advisor.knobs.in_trial import Own, ScriptSeen


def setting(trial: TrialSettings) -> bool:
    """Whether the trial's optimizer was fused: the knob, else the script's own."""
    return trial.flag("fused_optimizer")


def transform(g: StepGraph, value: Any, p: float, params: dict[str, float]) -> StepGraph:
    """The share p of the optimizer's host time removed, or given back when turned off."""
    if bool(value) == g.fused:
        return g
    saved = g.optimizer_s * p if value else -g.optimizer_s * undone(p)
    return dataclasses.replace(host_cut(g, saved), fused=bool(value), optimizer_s=g.optimizer_s - saved)


WHAT_IF = WhatIf("fused_optimizer", "fused", setting, transform, "fused", prior=0.9, bounds=(0.0, 1.0))


def own(seen: ScriptSeen) -> Own | None:
    """The script's own: a torch.optim optimizer it built with `fused=True`."""
    fused = next((o for o in seen.optimizers if o["user"].get("fused")), None)
    return (True, f"fused {fused['class']}", fused.get("site")) if fused is not None else None


KNOB = Knob("fused_optimizer", FLAG, MODEL, AT_OPTIMIZER, "the fused optimizer",
            advice="fused-optimizer", spread=(0.05, 0.05), whatif=WHAT_IF,
            written=Written(IN_OPTIMIZER, manual="build the optimizer with fused=True",
                            trainer_keywords=(("optim", "adamw_torch_fused"),)), own_at_end=own,
            not_in_notebook="the notebook built its optimizer before the trial: build it with fused=True to measure it",
            on_optimizer="advisor.trials.interposition.optimizers:FusedOptimizers")

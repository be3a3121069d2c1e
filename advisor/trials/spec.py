"""What one trial runs (`TrialSpec`): the script and its step, the knobs, where its record goes, how its steps are
scheduled and measured, and where it runs. Torch-free, frozen: the launchers (`advisor.trials.launch.runner`,
the Ray job) take one in place of two dozen arguments, and the search builds one per trial from its options."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from advisor.trials.knobs import Knobs


@dataclass(frozen=True)
class TrialSpec:
    """One trial to run. `target`: `script.py` or `script.py:train_step`; `knobs`: None for the script's own
    settings; `step`: the step as a function of a module the script imports (`pkg.module:Class.method`);
    `loader`: the training loader's site and ordinal (an earlier trial's `training_loader`), the only loader
    the DataLoader knobs reach; `windows` of at least `window_s` seconds after the `steps` profiled ones (after
    `wait` and `warmup`); `against` (`advisor.trials.record.adaptive.Against` as a dict): windows until they
    settle the comparison with the best; `turns` (`advisor.trials.record.turns.Turns` as a dict): windows in
    turns with another trial; `nproc_per_node` > 1: ranks under torchrun (`torchrun_args`: rendezvous options);
    `ray_address`: the job of `nnodes` × `nproc_per_node` ranks on that Ray cluster."""

    target: str
    knobs: Knobs | None
    out_dir: str | os.PathLike
    name: str | None = None
    steps: int = 5
    wait: int = 2
    warmup: int = 1
    device: str = "auto"
    script_args: Sequence[str] = ()
    timeout_s: float = 600.0
    memory_limit: int | None = None
    profile: bool = True
    python: str | None = None
    env: Mapping[str, str] | None = None
    windows: int = 0
    window_s: float = 1.0
    step: str | None = None
    loader: Mapping[str, Any] | None = None
    nproc_per_node: int = 1
    torchrun_args: Sequence[str] = ()
    ray_address: str | None = None
    nnodes: int = 1
    against: Mapping[str, Any] | None = None
    turns: Mapping[str, Any] | None = None

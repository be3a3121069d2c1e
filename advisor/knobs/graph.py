"""The step graph the what-if model transforms, the settings it reads from a trial, and the arithmetic that
several knobs' transformations share.

`StepGraph` is one step as the model (`advisor.analysis.whatif`, which builds it from a trace and its trial)
sees it; each knob it transforms declares its transformation in its own module (`Knob.whatif`), on this
graph. Here is what more than one of them use: a cut of the host's work (the fused optimizer, compile), the
layout-sensitive time of a CPU step (channels_last, and compile beside it), the copies made faster (pinned
memory, 8-bit images), a removed share given back. Stdlib only, pure functions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# On a CPU, compiled graphs keep only this share of channels_last's saving (the recorded conv surface:
# channels_last gained 44-60% without compile, 8-16% with it) ...
COMPILED_LAYOUT = 0.25
# ... and it saves at most this share of the layout-sensitive time (the conv surface: 31%): a share calibrated
# near 1 on a trace where that time was small made undoing it explode (a live session predicted -87% for compile
# beside channels_last, and measured -32%).
CPU_LAYOUT_MAX = 0.6


@dataclass(frozen=True)
class StepGraph:
    """One step as the what-if model sees it, in seconds of the trial's steady state."""

    batch: int
    workers: int
    cores: int
    step_s: float  # the steady-state step: batch / samples/s
    produce_s: float  # one loader process's time for one batch, with `workers` workers beside it
    host_s: float  # the training thread's own work in the call (operators, launches; not its waits)
    device_s: float  # device busy: kernels, copies, memsets
    idle_s: float  # the rest of the call: the device waits on the host
    matmul_s: float = 0.0  # kernel time of matmul/convolution operators off the Tensor Cores (AMP moves them)
    matmul_tc_s: float = 0.0  # ... and on them already (TF32, or 16 bits): AMP halves their bytes at most
    amp_ratio: float = 2.0  # the device's 16-bit matrix throughput over its fp32 (the AMP prior)
    copy_s: float = 0.0  # host-to-device copies, and the host's waits on them, with no kernel beside them
    layout_s: float = 0.0  # NCHW↔NHWC conversion kernels
    batch_bytes: float = 0.0  # on a GPU: the bytes the step copies to the device (0: not known, none on a CPU)
    handoff_s_per_byte: float = 0.0  # with workers: what taking a batch from one costs the training thread, a byte
    nchw_s: float = 0.0  # on a GPU: kernels of convolutions, norms and pools on NCHW inputs (their layout's choice)
    conv_s: float = 0.0  # on a CPU: the convolution operators' time (channels_last acts on it)
    optimizer_s: float = 0.0  # the optimizer's step on the host
    amp: bool = False
    pinned: bool = False
    uint8: bool = False
    channels_last: bool = False
    compiled: bool = False
    fused: bool = False
    platform: str = "gpu"
    threads: int = 0  # on a CPU: the torch threads the step's operators run on (0: not known)

    @property
    def ops_s(self) -> float:
        """On a CPU, the operators' time in the call: the device side less the optimizer's host work."""
        return max(0.0, self.device_s - self.host_s)

    @property
    def cpu_s(self) -> float:
        """The call's own CPU time: the host's work, and on a CPU its operators' on each of their threads."""
        if self.platform != "cpu":
            return self.host_s
        return self.host_s + self.ops_s * max(1, min(self.threads, self.cores))

    @property
    def call_s(self) -> float:
        """The training thread's call, on the critical path (the longer of its host and device sides)."""
        return max(self.host_s, self.device_s + self.idle_s)

    @property
    def handoff_s(self) -> float:
        """The training thread's time to take a batch from a worker process (its tensors rebuilt from shared
        memory, their fresh pages touched by the copy): none without workers."""
        return self.batch_bytes * self.handoff_s_per_byte if self.workers > 0 else 0.0

    def steady_step_s(self) -> float:
        """The step time the graph gives: the loader's side or the call (`advisor.analysis.whatif`)."""
        if self.workers <= 0:
            return self.produce_s + self.call_s
        cores = max(1, self.cores)
        # The workers' batches and the call's own threads share the cores: where together they ask for more
        # CPU time than the cores give, the step waits for it (a worker count that pays on 16 cores loses on 2).
        return max(self.call_s + self.handoff_s, self.produce_s / min(self.workers, cores),
                   (self.produce_s + self.cpu_s + self.handoff_s) / cores)

    @property
    def samples_per_s(self) -> float:
        """Samples per second the graph gives."""
        return self.batch / self.steady_step_s()


@dataclass(frozen=True)
class TrialSettings:
    """The settings a trial ran with, as its trial.json holds them: the knobs over the script's own settings
    (its autocast, compiled model, fused optimizer), and the values its loader was built with."""

    record: dict  # the trial.json
    knobs: dict
    user: dict  # the script's own values (its arguments' defaults)
    own: dict  # the script's own settings the trial read before any knob changed them
    effective: dict  # the training loader's arguments as it was built

    @classmethod
    def of(cls, trial: dict) -> TrialSettings:
        """The settings of a trial record."""
        own = {k: (v or {}).get("value") for k, v in (trial.get("own_settings") or {}).items() if isinstance(v, dict)}
        loaders = trial.get("dataloaders") or []
        effective = (loaders[0].get("effective") if loaders else None) or {}
        return cls(trial, trial.get("knobs") or {}, trial.get("user_values") or {}, own, effective)

    def value(self, name: str, default: Any) -> Any:
        """A value: the loader's as built, else the knob's, else the script's, else `default`."""
        for v in (self.effective.get(name), self.knobs.get(name), self.user.get(name)):
            if v is not None:
                return v
        return default

    def flag(self, name: str) -> bool:
        """A flag: the knob's, else the script's own setting, else its value; off where none is set."""
        found = (v for v in (self.knobs.get(name), self.own.get(name), self.user.get(name)) if v is not None)
        return bool(next(found, False))


def host_cut(g: StepGraph, saved_host: float) -> StepGraph:
    """The graph with `saved_host` seconds less host work (negative: more): the exposed part of it (the
    share of host work the device idled through) leaves the call's idle time too, or joins it."""
    saved_host = min(saved_host, g.host_s)
    exposed = saved_host * min(1.0, g.idle_s / g.host_s) if g.host_s > 0 else 0.0
    return dataclasses.replace(g, host_s=g.host_s - saved_host, idle_s=max(0.0, g.idle_s - exposed))


def cpu_layout_s(g: StepGraph) -> float:
    """On a CPU, the time channels_last acts on: the device's, less the matrix products that are not
    convolutions and the copies; none without convolutions."""
    if g.conv_s <= 0:
        return 0.0
    return max(0.0, g.device_s - g.copy_s - max(0.0, g.matmul_s + g.matmul_tc_s - g.conv_s))


def layout_share(g: StepGraph, p: float) -> float:
    """On a CPU, the share of the layout-sensitive time channels_last saves: p, at most CPU_LAYOUT_MAX, or as
    much of it as compiled graphs keep (`COMPILED_LAYOUT`)."""
    p = min(p, CPU_LAYOUT_MAX)
    return p * COMPILED_LAYOUT if g.compiled else p


def relayout(g: StepGraph, saved_before: float, saved_after: float) -> StepGraph:
    """On a CPU, the graph whose layout-sensitive time had the share `saved_before` of it saved and now has
    `saved_after` (both `layout_share`s: at most CPU_LAYOUT_MAX)."""
    acted = cpu_layout_s(g)
    if acted <= 0:
        return g
    ratio = (1 - saved_after) / (1 - saved_before)
    return dataclasses.replace(g, device_s=g.device_s + acted * (ratio - 1), conv_s=g.conv_s * ratio)


def faster_copies(g: StepGraph, ratio: float, on: bool, **changes: Any) -> StepGraph:
    """The graph whose exposed copy time is divided by `ratio` (turned `on`), or multiplied by it (turned off):
    the copies stay before the forward. `changes`: the graph's other fields that change with it."""
    factor = 1 / ratio if on else ratio
    saved = g.copy_s * (1 - factor)
    return dataclasses.replace(g, device_s=max(0.0, g.device_s - saved), copy_s=g.copy_s * factor, **changes)


def undone(p: float) -> float:
    """What a transformation that removed the share p of a time adds back to what is left when undone:
    p / (1 - p) (p bounded short of 1, where nothing would be left to tell the time before)."""
    p = min(p, 0.9)
    return p / (1 - p)

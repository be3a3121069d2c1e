"""What a change of one knob will do to the step: a what-if model built from one trace and its trial.

The step is laid out as a small graph of what runs where (after Daydream, USENIX ATC 2020):

    loader ──► training thread: [wait for the batch] ─► [host work: operators, launches]
                                                          │ launches
                                                          ▼
                                   device stream: [copies] ─► [kernels: matmul/conv | other | layout]

Its figures (`StepGraph`) come from the trace's breakdown (each moment of the profiled step counted once)
scaled to the trial's steady state (its samples/s and the share of time it waited for data). The step's
critical path is the loader's side or the training thread's call, whichever is longer:

    no workers:  step = produce(0) + call            (the training thread loads the batch itself)
    W workers:   step = max(call, produce(W) / W,    (W batches in flight)
                            (produce(W) + cpu) / cores)  (the workers and the call share the cores)
    call = max(host, device + idle)                  (idle: moments the device waits on the host)
    cpu = the call's own CPU time: the host's work; on a CPU, its operators' time on each of its threads

Each knob is a transformation of the graph (`transform`), with one parameter (`PRIORS`) that a
session calibrates from what it measured (`calibrate`). docs/architecture/predictions.md states each one's
assumptions. Pure functions; never imports torch.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any

# γ of the batch (device and loader time per step grow as (B'/B)^γ), one per precision and per loader
# (`family_of`): a batch measured in fp32 does not stand for 16 bits (a working set and units of their own: on
# the recorded CPU conv surface 32→64 lost 25% in fp32, nothing in bf16), nor one measured with the training
# thread loading its own batches for worker processes (on the recorded H100 steady surface 32→64 gained 30%
# with no workers, 5% less on average with them).
BATCH_FAMILIES = ("batch", "batch_16", "batch_inline", "batch_16_inline")
# Each transformation's parameter before the session measured anything, and the range calibration may
# move it in.
PRIORS: dict[str, float] = {
    "workers": 0.05,  # α: a worker's batch takes (1 + α·W) of one process alone
    **dict.fromkeys(BATCH_FAMILIES, 1.0),  # γ: time per sample constant
    "amp": 0.0,       # r: matmul/convolution kernels off the Tensor Cores run r× faster in 16 bits (0: the
                      # device's ratio of 16-bit matrix to fp32 throughput, `amp_ratio`)
    "copies": 2.0,    # pinned copies run this much faster than pageable ones
    "uint8": 0.03,    # u: 8-bit images: the share of a worker's batch time that converting to float and passing
                      # four times the bytes between processes took (with workers; the copy itself moves a
                      # quarter of the bytes: `UINT8_BYTES`)
    "channels_last": 1.0,  # share of the layout conversions channels_last removes
    "fused": 0.9,     # share of the optimizer's host time a fused kernel removes
    "compile": 0.5,   # share of the host work and of the non-matmul kernel time compile removes
    "threads": 1.0,   # β: on a CPU, the step's operators take (T/T')^β as long on T' threads as on T (1: they
                      # split perfectly; the CPU time they take stays the same)
}
# On a CPU, where the CPU is the device: channels_last acts on the layout-sensitive time (the convolutions
# and the normalisations and pools around them; there are no layout conversion kernels to remove), p the
# share of it saved; compile is expected to cost a little before it is measured (every steady state of a
# compiled step measured on a CPU in the repo was slower: the conv classifier's by 7-42%, the char transformer's
# by 4%, the live CNN of issue 71 by 13-29%): it adds a fifth to the host work and non-matrix operators.
PRIORS_CPU: dict[str, float] = {"channels_last": 0.25, "compile": -0.2}
# ... and compiled graphs keep only this share of channels_last's saving on a CPU (the recorded conv surface:
# channels_last gained 44-60% without compile, 8-16% with it).
COMPILED_LAYOUT = 0.25
# ... and at most this share of the layout-sensitive time (the conv surface: 31%): a share calibrated near 1 on
# a trace where that time was small made undoing it explode (a live session predicted -87% for compile beside
# channels_last, and measured -32%).
CPU_LAYOUT_MAX = 0.6
RANGES: dict[str, tuple[float, float]] = {
    "workers": (0.0, 1.0), **dict.fromkeys(BATCH_FAMILIES, (0.3, 1.5)), "amp": (0.3, 20.0), "copies": (0.5, 8.0),
    "uint8": (-0.3, 0.5), "channels_last": (0.0, 1.0), "fused": (0.0, 1.0), "compile": (-0.5, 0.9),
    "threads": (0.2, 1.5),
}
UINT8_BYTES = 4.0  # a float32 image over its 8-bit one
KNOB_OF = {"num_workers": "workers", "batch_size": "batch", "amp": "amp", "pinned": "copies", "pin_memory": "copies",
           "non_blocking": "copies", "uint8_copies": "uint8", "channels_last": "channels_last",
           "fused_optimizer": "fused", "compile": "compile", "threads": "threads"}


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

    def steady_step_s(self) -> float:
        """The step time the graph gives: the loader's side or the call, as described in the module."""
        if self.workers <= 0:
            return self.produce_s + self.call_s
        cores = max(1, self.cores)
        # The workers' batches and the call's own threads share the cores: where together they ask for more
        # CPU time than the cores give, the step waits for it (a worker count that pays on 16 cores loses on 2).
        return max(self.call_s, self.produce_s / min(self.workers, cores), (self.produce_s + self.cpu_s) / cores)

    @property
    def samples_per_s(self) -> float:
        """Samples per second the graph gives."""
        return self.batch / self.steady_step_s()


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def steady_figures(trial: dict) -> tuple[float | None, float | None]:
    """(samples/s, share of the time spent waiting for data) of a trial's steady state, from its summary
    (its measurement windows where it has them), else its recorded steps."""
    summary = trial.get("summary") or {}
    steady = summary.get("steady") or {}
    rate = _number(steady.get("samples_per_s")) or _number(summary.get("samples_per_s"))
    wait = _number(steady.get("wait_share"))
    # A data-parallel job steps at its slowest rank's pace: the loader that binds it is the rank that waits most
    # (the job's own summary is rank 0's, which waits in the all-reduce for it instead).
    waits = [w for r in trial.get("ranks") or [] if isinstance(r, dict)
             if (w := _number(((r.get("summary") or {}).get("steady") or {}).get("wait_share"))) is not None]
    if waits:
        wait = max(waits)
    if wait is None:
        steps = [s for s in trial.get("steps") or [] if s.get("recorded")] or trial.get("steps") or []
        walls = [(s.get("wall_s"), s.get("call_s")) for s in steps]
        walls = [(w, c) for w, c in walls if _number(w) and _number(c)]
        if walls:
            wait = sum(max(0.0, w - c) for w, c in walls) / sum(w for w, _ in walls)
    return rate, wait


def knob_values(trial: dict) -> dict[str, Any]:
    """The settings a trial ran with that the model transforms: the knobs over the script's own settings
    (its autocast, compiled model, fused optimizer) and its loader's values."""
    knobs, user = trial.get("knobs") or {}, trial.get("user_values") or {}
    own = {k: (v or {}).get("value") for k, v in (trial.get("own_settings") or {}).items() if isinstance(v, dict)}
    loaders = trial.get("dataloaders") or []
    effective = (loaders[0].get("effective") if loaders else None) or {}

    def value(name: str, default: Any) -> Any:
        for v in (effective.get(name), knobs.get(name), user.get(name)):
            if v is not None:
                return v
        return default

    def flag(name: str) -> bool:
        return bool(next((v for v in (knobs.get(name), own.get(name), user.get(name)) if v is not None), False))
    summary = trial.get("summary") or {}
    return {"amp": flag("amp"), "channels_last": flag("channels_last"), "compile": flag("compile"),
            "fused_optimizer": flag("fused_optimizer"),
            "batch_size": int(value("batch_size", summary.get("batch_size") or 1)),
            "num_workers": int(value("num_workers", 0) or 0),
            "pinned": bool(value("pin_memory", False)) and bool(knobs.get("non_blocking")),
            "uint8_copies": bool(knobs.get("uint8_copies")),
            "threads": int(value("threads", ((trial.get("device_facts") or {}).get("cpu") or {}).get("torch_threads")
                                 or 0) or 0)}


def step_graph(diagnosis: Any, batch: int | None = None) -> StepGraph | None:
    """The what-if graph of a diagnosed trace with its trial record; None without a steady-state figure.
    A trace without a trial record is its own steady state when told its `batch`."""
    trial = diagnosis.trial or {}
    rate, wait = steady_figures(trial)
    if not rate and batch and diagnosis.step_time_us:
        trial = {**trial, "summary": {"batch_size": batch}}
        rate = batch / (diagnosis.step_time_us * 1e-6)
    if not rate:
        return None
    v = knob_values(trial)
    batch = v["batch_size"]
    step = batch / rate
    b = diagnosis.breakdown_us
    traced = diagnosis.step_time_us or 0.0
    if wait is None:
        wait = diagnosis.dataloader_share
    call = step * (1.0 - wait)
    busy_us = max(traced - b.get("dataloader", 0.0), 1e-9)
    scale = call / busy_us  # the profiled call's figures, stretched to the steady call
    device_us = b.get("kernel", 0.0) + b.get("memcpy", 0.0) + b.get("memset", 0.0)
    extra = diagnosis.extra or {}
    optimizer = ((extra.get("optimizer") or {}).get("us_per_step") or 0.0) * scale
    if diagnosis.platform == "cpu":
        # The CPU is the device: its operators' time grows with the batch, except the optimizer's step
        # (per parameter, not per sample), which is the host's own work, exposed.
        matmul = (extra.get("cpu_eligible_share") or 0.0) * traced * scale
        conv = (extra.get("cpu_conv_share") or 0.0) * traced * scale
        optimizer = min(optimizer, call)
        host, device, idle = optimizer, call - optimizer, optimizer
        matmul, matmul_tc = (0.0, matmul) if v["amp"] else (matmul, 0.0)
    else:
        device = min(device_us * scale, call)
        idle = call - device
        host = min(call, (extra.get("host_busy_us_per_step") or 0.0) * scale)
        conv = 0.0
        matmul = (diagnosis.eligible_share or 0.0) * diagnosis.kernel_us * scale
        matmul_tc = max(0.0, (diagnosis.eligible_op_share or 0.0) * diagnosis.kernel_us * scale - matmul)
    cores = ((trial.get("device_facts") or {}).get("cpu") or {}).get("logical_cores") or 1
    workers = v["num_workers"]
    # No workers: the training thread loads each batch in the time it waited. W workers: they deliver a
    # batch per step, so each takes W steps for one (an upper bound where the loader does not bind).
    produce = step * wait if workers == 0 else step * min(workers, cores)
    copies = diagnosis.copies
    return StepGraph(batch=batch, workers=workers, cores=int(cores), step_s=step, produce_s=produce,
                     host_s=host, device_s=device, idle_s=idle, matmul_s=matmul, matmul_tc_s=matmul_tc,
                     amp_ratio=amp_ratio(trial, diagnosis.platform),
                     copy_s=min(device, copies.exposed_us * scale), layout_s=(diagnosis.layout_share or 0.0)
                     * diagnosis.kernel_us * scale, conv_s=conv, optimizer_s=optimizer, amp=v["amp"],
                     pinned=v["pinned"], uint8=v["uint8_copies"], channels_last=v["channels_last"],
                     compiled=v["compile"], fused=v["fused_optimizer"], platform=diagnosis.platform,
                     threads=v["threads"])


def amp_ratio(trial: dict, platform: str) -> float:
    """The AMP prior for a device: peak 16-bit Tensor Core over fp32 throughput (about 8× on Volta and
    Turing, 16× from Ampere on); on a CPU with bf16 instructions (AMX, AVX-512 BF16) twice the fp32 rate,
    without them none (autocast converts, the math stays fp32)."""
    facts = trial.get("device_facts") or {}
    if platform == "cpu":
        return 2.0 if (facts.get("cpu") or {}).get("bf16_instructions") else 1.0
    cc = str((facts.get("gpu") or {}).get("compute_capability") or "8.0")
    major = int(cc.split(".")[0]) if cc.split(".")[0].isdigit() else 8
    return 16.0 if major >= 8 else (8.0 if major >= 7 else 1.0)


def _host_cut(g: StepGraph, saved_host: float) -> StepGraph:
    """The graph with `saved_host` seconds less host work (negative: more): the exposed part of it (the
    share of host work the device idled through) leaves the call's idle time too, or joins it."""
    saved_host = min(saved_host, g.host_s)
    exposed = saved_host * min(1.0, g.idle_s / g.host_s) if g.host_s > 0 else 0.0
    return dataclasses.replace(g, host_s=g.host_s - saved_host, idle_s=max(0.0, g.idle_s - exposed))


def _cpu_layout_s(g: StepGraph) -> float:
    """On a CPU, the time channels_last acts on: the device's, less the matrix products that are not
    convolutions and the copies; none without convolutions."""
    if g.conv_s <= 0:
        return 0.0
    return max(0.0, g.device_s - g.copy_s - max(0.0, g.matmul_s + g.matmul_tc_s - g.conv_s))


def _layout_share(g: StepGraph, p: float) -> float:
    """On a CPU, the share of the layout-sensitive time channels_last saves: p, at most CPU_LAYOUT_MAX, or as
    much of it as compiled graphs keep (`COMPILED_LAYOUT`)."""
    p = min(p, CPU_LAYOUT_MAX)
    return p * COMPILED_LAYOUT if g.compiled else p


def _relayout(g: StepGraph, saved_before: float, saved_after: float) -> StepGraph:
    """On a CPU, the graph whose layout-sensitive time had the share `saved_before` of it saved and now has
    `saved_after` (both `_layout_share`s: at most CPU_LAYOUT_MAX)."""
    acted = _cpu_layout_s(g)
    if acted <= 0:
        return g
    ratio = (1 - saved_after) / (1 - saved_before)
    return dataclasses.replace(g, device_s=g.device_s + acted * (ratio - 1), conv_s=g.conv_s * ratio)


def _undone(p: float) -> float:
    """What a transformation that removed the share p of a time adds back to what is left when undone:
    p / (1 - p) (p bounded short of 1, where nothing would be left to tell the time before)."""
    p = min(p, 0.9)
    return p / (1 - p)


def transform(g: StepGraph, knob: str, value: Any, p: float, params: dict[str, float] | None = None) -> StepGraph:
    """The graph after setting one knob (a `KNOB_OF` key, or "pinned" for pin_memory with non_blocking)
    to `value`, with the transformation's parameter `p` (see PRIORS), and the others' `params` where two
    knobs interact (compile and channels_last on a CPU)."""
    if knob == "threads":
        if g.platform != "cpu" or not g.threads or int(value) == g.threads:
            return g  # on a GPU the host's work is one Python thread: torch's threads do not move it
        k = (g.threads / max(1, int(value))) ** p  # the operators' time (not the optimizer's host work) grows
        return dataclasses.replace(g, threads=int(value), device_s=g.host_s + g.ops_s * k, matmul_s=g.matmul_s * k,
                                   matmul_tc_s=g.matmul_tc_s * k, conv_s=g.conv_s * k)
    if knob == "num_workers":
        a = p
        alone = g.produce_s / (1 + a * g.workers)
        return dataclasses.replace(g, workers=int(value), produce_s=alone * (1 + a * int(value)))
    if knob == "batch_size":
        k = (int(value) / g.batch) ** p
        # Per step: the loader's batch, the kernels and copies grow with it; launches and Python do not.
        return dataclasses.replace(g, batch=int(value), produce_s=g.produce_s * k, device_s=g.device_s * k,
                                   matmul_s=g.matmul_s * k, matmul_tc_s=g.matmul_tc_s * k, copy_s=g.copy_s * k,
                                   layout_s=g.layout_s * k, conv_s=g.conv_s * k)
    if knob == "amp":
        if bool(value) == g.amp:
            return g
        r = p if p > 0 else g.amp_ratio
        if value:  # off the Tensor Cores onto them; those on them already move half the bytes
            saved = g.matmul_s * (1 - 1 / r) + g.matmul_tc_s * (1 - 1 / min(2.0, r))
            moved = dict(matmul_s=0.0, matmul_tc_s=g.matmul_s / r + g.matmul_tc_s / min(2.0, r))
        else:  # back to fp32: the matrix kernels leave the Tensor Cores
            saved = -(g.matmul_tc_s * (r - 1))
            moved = dict(matmul_s=g.matmul_tc_s * r + g.matmul_s, matmul_tc_s=0.0)
        before = g.matmul_s + g.matmul_tc_s  # the convolutions among them move alike
        conv = g.conv_s * (moved["matmul_s"] + moved["matmul_tc_s"]) / before if before > 0 else g.conv_s
        return dataclasses.replace(g, amp=bool(value), device_s=max(0.0, g.device_s - saved), conv_s=conv, **moved)
    if knob in ("pinned", "pin_memory", "non_blocking", "uint8_copies"):
        flag = "uint8" if knob == "uint8_copies" else "pinned"
        if bool(value) == getattr(g, flag):
            return g
        # The exposed copy time divided by p (faster DMA), or by UINT8_BYTES (fewer bytes); it stays before the
        # forward. 8-bit images also spare the workers the float conversion and three quarters of the bytes
        # they pass back: the share u of their batch time (none without workers).
        ratio = UINT8_BYTES if flag == "uint8" else p
        factor = 1 / ratio if value else ratio
        saved = g.copy_s * (1 - factor)
        produce = g.produce_s
        if flag == "uint8" and g.workers > 0:
            produce *= (1 - p) if value else 1 + _undone(p)
        return dataclasses.replace(g, device_s=max(0.0, g.device_s - saved), copy_s=g.copy_s * factor,
                                   produce_s=produce, **{flag: bool(value)})
    if knob == "channels_last":
        if bool(value) == g.channels_last:
            return g
        if g.platform == "cpu":
            # The layout-sensitive time (the convolutions and the normalisations and pools around them; on a
            # CPU there are no conversion kernels of their own): the share p of it saved, or given back.
            share = _layout_share(g, p)
            return dataclasses.replace(_relayout(g, 0.0, share) if value else _relayout(g, share, 0.0),
                                       channels_last=bool(value))
        # On a GPU turning it off brings back conversion kernels the trace cannot show: no change predicted.
        saved = g.layout_s * p if value else 0.0
        return dataclasses.replace(g, channels_last=bool(value), device_s=g.device_s - saved,
                                   layout_s=g.layout_s - saved)
    if knob == "fused_optimizer":
        if bool(value) == g.fused:
            return g
        saved = g.optimizer_s * p if value else -g.optimizer_s * _undone(p)
        return dataclasses.replace(_host_cut(g, saved), fused=bool(value), optimizer_s=g.optimizer_s - saved)
    if knob == "compile":
        if bool(value) == g.compiled:
            return g
        # The share p of the host work and of the kernels that are neither matrix products nor copies (the
        # ones compile fuses) is removed, or given back when turned off.
        share = p if value else -_undone(p)
        other = max(0.0, g.device_s - g.matmul_s - g.matmul_tc_s - g.copy_s)
        after = dataclasses.replace(_host_cut(g, g.host_s * share), compiled=bool(value),
                                    device_s=g.device_s - other * share)
        if g.platform == "cpu" and g.channels_last:  # channels_last's saving, as much as compile leaves of it
            layout_p = (params or priors(g))["channels_last"]
            after = _relayout(after, _layout_share(g, layout_p), _layout_share(after, layout_p))
        return after
    raise ValueError(f"no transformation for the knob {knob!r}")


def family_of(g: StepGraph, knob: str) -> str:
    """The parameter (a PRIORS key) of the transformation that sets `knob` on the graph `g`: the batch's by
    the graph's precision and loader (see BATCH_FAMILIES)."""
    family = KNOB_OF.get(knob, "copies")
    if family != "batch":
        return family
    return ("batch_16" if g.amp else "batch") + ("_inline" if g.workers == 0 else "")


def priors(g: StepGraph) -> dict[str, float]:
    """The transformations' parameters before anything was measured, for the graph's platform."""
    return {**PRIORS, **PRIORS_CPU} if g.platform == "cpu" else dict(PRIORS)


def predict(g: StepGraph, changes: dict[str, Any], params: dict[str, float] | None = None) -> float:
    """The relative change of samples/s that setting `changes` (knob → value) gives, by the graph."""
    params = {**priors(g), **(params or {})}
    after = g
    for knob, value in changes.items():
        after = transform(after, knob, value, params[family_of(after, knob)], params)
    return after.samples_per_s / g.samples_per_s - 1


def fit(g: StepGraph, changes: dict[str, Any], measured: float, family: str,
        params: dict[str, float] | None = None) -> float | None:
    """The parameter of `family` (a PRIORS key) that makes the graph predict the measured change, or None
    where the change does not depend on it (the part it transforms is not on the critical path)."""
    lo, hi = RANGES[family]
    grid = [lo + (hi - lo) * i / 60 for i in range(61)]
    base = {**priors(g), **(params or {})}
    errors = [(abs(predict(g, changes, {**base, family: x}) - measured), x) for x in grid]
    values = [e for e, _ in errors]
    if max(values) - min(values) < 0.02:  # the parameter barely moves the prediction: nothing to learn
        return None
    best = min(errors)[1]
    step = (hi - lo) / 60  # then finer, between the coarse grid's neighbours of the best
    fine = [max(lo, min(hi, best + step * (i / 20 - 1))) for i in range(41)]
    return min((abs(predict(g, changes, {**base, family: x}) - measured), x) for x in fine)[1]


def calibrate(observations: list[tuple[StepGraph, dict[str, Any], float]],
              params: dict[str, float] | None = None) -> dict[str, float]:
    """Parameters corrected by measured changes of this script on this device: each observation (the
    base's graph, the change, the measured relative change of samples/s) of a single knob gives its
    family's parameter (`family_of`: the batch's per precision and loader); the median of those stands."""
    found: dict[str, list[float]] = {}
    for g, changes, measured in observations:
        families = {family_of(g, k) for k in changes}
        if len(families) != 1:
            continue  # a pair of knobs cannot say which of them did what
        family = families.pop()
        x = fit(g, changes, measured, family, params)
        if x is not None:
            found.setdefault(family, []).append(x)
    return {**(params or {}), **{f: statistics.median(xs) for f, xs in found.items()}}

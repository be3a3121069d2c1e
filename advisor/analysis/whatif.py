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

Each knob is a transformation of the graph, with one parameter (`PRIORS`) that a session calibrates from what
it measured (`calibrate`): its module declares both (`advisor.knobs.<knob>`, its `Knob.whatif`), with how a
trial's record reads its setting; `transform` finds it through the registry. The graph (`StepGraph`) and the
arithmetic several transformations share are in `advisor.knobs.graph`. docs/architecture/predictions.md states
each one's assumptions. Pure functions; never imports torch.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from functools import lru_cache
from typing import Any

from advisor.knobs import TRANSFORMATIONS, WHAT_IFS
from advisor.knobs.graph import StepGraph, TrialSettings

# Each transformation's parameter before the session measured anything (and on a CPU, where it differs), and the
# range calibration may move it in, as each knob's module declares them (`Knob.whatif`).
PRIORS: dict[str, float] = {f: w.prior_of(f) for w in TRANSFORMATIONS for f in w.parameters()}
PRIORS_CPU: dict[str, float] = {f: w.prior_cpu for w in TRANSFORMATIONS if w.prior_cpu is not None
                                 for f in w.parameters()}
RANGES: dict[str, tuple[float, float]] = {f: w.bounds_of(f) for w in TRANSFORMATIONS for f in w.parameters()}
KNOB_OF = {name: w.family for name, w in WHAT_IFS.items()}  # the knobs the model transforms, and the model's changes

__all__ = ["KNOB_OF", "PRIORS", "PRIORS_CPU", "RANGES", "StepGraph", "amp_ratio", "calibrate", "family_of", "fit",
           "graph_settings", "predict", "priors", "steady_figures", "step_graph", "transform"]


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


def graph_settings(trial: dict) -> dict[str, Any]:
    """The settings a trial ran with that the model transforms, by the graph's field: each knob's as its module
    reads it (the knobs over the script's own settings, its loader's values)."""
    settings = TrialSettings.of(trial)
    return {w.field: w.read(settings) for w in TRANSFORMATIONS}


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
    settings = graph_settings(trial)
    batch = settings["batch"]
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
        # No kernel names which precision an operator ran in: in 16 bits (AMP) the eligible ones did.
        matmul, matmul_tc = (0.0, matmul) if settings["amp"] else (matmul, 0.0)
    else:
        device = min(device_us * scale, call)
        idle = call - device
        host = min(call, (extra.get("host_busy_us_per_step") or 0.0) * scale)
        conv = 0.0
        matmul = (diagnosis.eligible_share or 0.0) * diagnosis.kernel_us * scale
        matmul_tc = max(0.0, (diagnosis.eligible_op_share or 0.0) * diagnosis.kernel_us * scale - matmul)
    cores = ((trial.get("device_facts") or {}).get("cpu") or {}).get("logical_cores") or 1
    workers = settings["workers"]
    # No workers: the training thread loads each batch in the time it waited. W workers: they deliver a
    # batch per step, so each takes W steps for one (an upper bound where the loader does not bind).
    produce = step * wait if workers == 0 else step * min(workers, cores)
    copies = diagnosis.copies
    return StepGraph(**settings, cores=int(cores), step_s=step, produce_s=produce, host_s=host, device_s=device,
                     idle_s=idle, matmul_s=matmul, matmul_tc_s=matmul_tc, amp_ratio=amp_ratio(trial, diagnosis.platform),
                     copy_s=min(device, copies.exposed_us * scale), layout_s=(diagnosis.layout_share or 0.0)
                     * diagnosis.kernel_us * scale, nchw_s=extra.get("nchw_share", 0.0) * diagnosis.kernel_us * scale,
                     batch_bytes=(copies.bytes or 0.0) if diagnosis.platform != "cpu" else 0.0,
                     conv_s=conv, optimizer_s=optimizer, platform=diagnosis.platform)


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


def transform(g: StepGraph, knob: str, value: Any, p: float, params: dict[str, float] | None = None) -> StepGraph:
    """The graph after setting one knob (a `KNOB_OF` key: a knob, or the model's name for a change several make,
    "pinned" for pin_memory with non_blocking) to `value`, by the transformation its module declares, with its
    parameter `p` (see PRIORS), and the others' `params` where two knobs interact (compile and channels_last on a
    CPU)."""
    what_if = WHAT_IFS.get(knob)
    if what_if is None:
        raise ValueError(f"no transformation for the knob {knob!r}")
    return what_if.transform(g, value, p, params or priors(g))


def family_of(g: StepGraph, knob: str) -> str:
    """The parameter (a PRIORS key) of the transformation that sets `knob` on the graph `g` (the batch's, by the
    graph's precision and loader)."""
    return WHAT_IFS[knob].family_of(g)


def priors(g: StepGraph) -> dict[str, float]:
    """The transformations' parameters before anything was measured, for the graph's platform."""
    return {**PRIORS, **PRIORS_CPU} if g.platform == "cpu" else dict(PRIORS)


def predict(g: StepGraph, changes: dict[str, Any], params: dict[str, float] | None = None) -> float:
    """The relative change of samples/s that setting `changes` (knob → value) gives, by the graph."""
    params = {**priors(g), **(params or {})}
    # A knob's second parameter that is the machine's (the workers' hand-off) is set on the graph before the change.
    g = dataclasses.replace(g, **{w.then_field: params.get(w.then, w.then_prior) for w in TRANSFORMATIONS
                                  if w.then_field})
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


RESIDUAL = 0.05  # a miss the first parameter leaves beyond this is taught to the knob's second


# A session calibrates again before each decision, on its observations so far and without each trial in turn: one
# observation's fit is the same every time (a pure function of it), so it is made once.
@lru_cache(maxsize=4096)
def taught(g: StepGraph, changes: tuple[tuple[str, Any], ...], measured: float,
           params: tuple[tuple[str, float], ...]) -> tuple[tuple[str, float], ...]:
    """What one observation (the base's graph, the change as (knob, value) pairs, the measured relative change)
    teaches: its family's parameter, and where that leaves a miss, the knob's second; none for a pair of knobs."""
    change, given = dict(changes), dict(params)
    families = {family_of(g, k) for k in change}
    if len(families) != 1:
        return ()  # a pair of knobs cannot say which of them did what
    family = families.pop()
    out = []
    x = fit(g, change, measured, family, given)
    if x is not None:
        out.append((family, x))
    # A miss the first parameter cannot reproduce teaches the knob's second (the workers' hand-off), with the first
    # as fitted.
    then = next((WHAT_IFS[k].then for k in change if WHAT_IFS[k].then), None)
    first = {**given, **({family: x} if x is not None else {})}
    if then and abs(predict(g, change, first) - measured) > RESIDUAL:
        y = fit(g, change, measured, then, first)
        if y is not None:
            out.append((then, y))
    return tuple(out)


def calibrate(observations: list[tuple[StepGraph, dict[str, Any], float]],
              params: dict[str, float] | None = None) -> dict[str, float]:
    """Parameters corrected by measured changes of this script on this device: each observation (the
    base's graph, the change, the measured relative change of samples/s) of a single knob gives its
    family's parameter (`family_of`: the batch's per precision and loader); the median of those stands."""
    found: dict[str, list[float]] = {}
    given = tuple(sorted((params or {}).items()))
    for g, changes, measured in observations:
        for family, x in taught(g, tuple(changes.items()), measured, given):
            found.setdefault(family, []).append(x)
    return {**(params or {}), **{f: statistics.median(xs) for f, xs in found.items()}}

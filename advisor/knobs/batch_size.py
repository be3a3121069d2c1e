"""`batch_size`: the training DataLoader's batch size.

- **In the trial**: the training DataLoader's batch size.
- **Proposed when**: launches bind (a larger batch), only with evidence (low utilization and measured
  headroom, or a launch-bound step). It grows only while a memory model (peak memory against batch size,
  fitted from the trials) predicts it fits under 85% of device memory; after an out-of-memory it bisects.
  As the last resort of an out-of-memory baseline, a smaller batch, said plainly.
- **Not applicable**: `--keep-effective-batch`; a script with no batch argument (measured in steps/s).
- **The patch writes**: where the batch size is set, with a note to scale the learning rate.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from advisor.knobs import checkpointing
from advisor.knobs.graph import StepGraph, TrialSettings
from advisor.knobs.knob import APPLIED, AT_LOADER, COUNT, IN_LOADER, LOADER, NEEDS_A_VALUE, Knob, WhatIf, Written
from advisor.knobs.in_trial import LoaderArguments
from advisor.knobs.offer import ROUND_GAIN, Best, Offer


def setting(trial: TrialSettings) -> int:
    """The batch the trial's loader was built with, else the one its summary names."""
    return int(trial.value("batch_size", (trial.record.get("summary") or {}).get("batch_size") or 1))


def after_moves(moves: dict[str, Any], knobs: Any, user: dict[str, Any], measured: int | None) -> int | None:
    """The batch a step runs at once `moves` are made on a setting (`knobs`, None: none beside the moves): the moved
    batch, else the setting's, else the script's own (`user`), else the one a trial measured."""
    return moves.get("batch_size") or (knobs.batch_size if knobs is not None else None) or user.get("batch_size") \
        or measured


def transform(g: StepGraph, value: Any, p: float, params: dict[str, float]) -> StepGraph:
    """Per step, the loader's batch, the kernels and the copies × (B'/B)^γ (γ = p); launches and Python fixed."""
    k = (int(value) / g.batch) ** p
    return dataclasses.replace(g, batch=int(value), produce_s=g.produce_s * k, device_s=g.device_s * k,
                               matmul_s=g.matmul_s * k, matmul_tc_s=g.matmul_tc_s * k, copy_s=g.copy_s * k,
                               layout_s=g.layout_s * k, nchw_s=g.nchw_s * k, conv_s=g.conv_s * k,
                               batch_bytes=g.batch_bytes * int(value) / g.batch)


def family(g: StepGraph) -> str:
    """γ of the graph's precision and loader."""
    return ("batch_16" if g.amp else "batch") + ("_inline" if g.workers == 0 else "")


# γ (1: time per sample constant), one per precision and per loader: a batch measured in fp32 does not stand for
# 16 bits (a working set and units of their own: on the recorded CPU conv surface 32→64 lost 25% in fp32, nothing
# in bf16), nor one measured with the training thread loading its own batches for worker processes (on the
# recorded H100 steady surface 32→64 gained 30% with no workers, 5% less on average with them).
WHAT_IF = WhatIf("batch_size", "batch", setting, transform, "batch", prior=1.0, bounds=(0.3, 1.5),
                 families=("batch", "batch_16", "batch_inline", "batch_16_inline"), family_for=family)


def in_loader(knob: Knob, value: Any, loader: LoaderArguments) -> str | None:
    """The loader's batch_size, where the script's loader batches by it (not by a batch_sampler of its own)."""
    if value is None:
        return None
    why = loader.unbatched()
    if why is None:
        loader.effective[knob.name] = value
    return why or APPLIED


def fit_memory(points: list[tuple[int, float]]) -> Callable[[int], float]:
    """Peak memory against batch size, from the trials run so far.

    With two or more batch sizes, a least-squares line; with one, memory proportional to the batch,
    which over-estimates (the fixed part scales too) and so errs on the safe side.
    """
    sizes = sorted({b for b, _ in points})
    if len(sizes) >= 2:
        n = len(points)
        mx = sum(b for b, _ in points) / n
        my = sum(m for _, m in points) / n
        sxx = sum((b - mx) ** 2 for b, _ in points)
        slope = max(sum((b - mx) * (m - my) for b, m in points) / sxx, 0.0)
        return lambda b: my + slope * (b - mx)
    b0, m0 = points[0]
    return lambda b: m0 * b / b0


def next_batch_size(current: int, points: list[tuple[int, float]], capacity: float | None, safety: float,
                    failed: int | None, sizes: tuple[int, ...] | None = None) -> int | None:
    """The next batch size to try: double (or the next size `sizes` holds), capped by the memory model;
    bisect below a size that failed."""
    if failed is not None:
        size = (current + failed) // 2
        if sizes is not None:
            size = max((s for s in sizes if current < s < failed), default=0)
        return size if size > current * 1.1 else None
    if sizes is not None:
        larger = [s for s in sorted(sizes) if s > current]
        if not larger:
            return None
        size = larger[0]
        if capacity and points and fit_memory(points)(size) > safety * capacity:
            return None
        return size
    size = current * 2
    if capacity and points:
        predict = fit_memory(points)
        limit = safety * capacity
        while size > current and predict(size) > limit:
            size = current + (size - current) // 2
        if size <= current * 1.1:
            return None
    return size


def training_notes(user_values: dict[str, Any], final: dict[str, Any], keep_effective_batch: bool) -> list[str]:
    """What the session's batch, changed from the script's own, means for training, in words (none where it
    was not changed)."""
    user, kept = user_values.get("batch_size"), final.get("batch_size")
    if not user or not kept or kept == user:
        return ["--keep-effective-batch: the batch size was left as written"] if keep_effective_batch else []
    factor = kept / user
    return [f"The batch grew from {user} to {kept} (×{factor:g}): scale the learning rate by about ×{factor:g} "
            "(linear scaling rule, with a few hundred warm-up steps) and check convergence; or run with "
            "--keep-effective-batch to leave the batch as it is."]


def offer(best: Best) -> Offer | None:
    """A larger batch, while the memory model says it fits: advised for a launch-bound step, else a measured
    experiment in the round over the knobs. Where the size the search wants does not fit, activation checkpointing
    with it (`checkpointing.pair`). Not where the effective batch is kept, the batch was made to fit (an
    out-of-memory baseline, micro-batches), or the script's loader takes a batch_sampler."""
    trials, options = best.learned.trials, best.options
    if options.keep_effective_batch or not trials:
        return None
    if trials[0]["status"] == "oom" or best.knobs.accumulation_steps:
        return None  # memory-bound already: the batch was made to fit, not to grow
    user = best.learned.user

    def loader_batch(knobs: dict[str, Any], measured: int | None) -> int | None:
        """The DataLoader's batch a trial ran at, the knob's value: a step of a script that accumulates gradients
        itself holds several (one of 4 batches of 32 measured 128, and batch 128→256 was proposed from 32)."""
        return after_moves(knobs, None, user, measured)

    current = after_moves({}, best.knobs, user, best.batch) if best.batch else None
    if not current or best.learned.loader.get("batch_sampler"):
        return None  # a loader built with the script's batch_sampler takes no batch_size: nothing to try
    # Against a CPU --memory-limit, the memory the cap counts (the data segment beyond torch's own).
    points = [(loader_batch(t.get("knobs") or {}, t["batch_size"]),
               t.get("peak_capped_bytes") or t["peak_memory_bytes"])
              for t in trials if t["status"] == "ok" and t.get("batch_size") and t.get("peak_memory_bytes")]
    # The batch size a trial asked for: one that ran out of memory in its first step measured none.
    failed = [t["knobs"]["batch_size"] for t in trials
              if t["status"] == "oom" and (t.get("knobs") or {}).get("batch_size")]
    failed_above = min((b for b in failed if b > current), default=None)
    # A trial the script ended before it had its steps: the script runs so many samples, and a batch above those
    # over the steps a trial needs runs out sooner still (an MLP of 4096 samples, 3 epochs: batch 2048 ran 6 steps
    # of 8, and 4096 was tried next).
    most = min((samples // ended["needed"] for t in trials if (ended := t.get("script_ended")) and (samples := (
        ended["steps"] * (loader_batch(t.get("knobs") or {}, t.get("batch_size")) or 0)))), default=None)
    capacity = trials[0].get("capacity_bytes")
    rec = best.advice.get(KNOB.proposed_as)
    gain = rec.predicted_gain if rec is not None else (0.1 if best.bound == "host" else ROUND_GAIN)
    sizes, safety = best.space.values("batch_size"), options.memory_safety
    # The size the search wants, whether or not it fits: where it does not, checkpointing buys it.
    wanted = next_batch_size(current, points, None, safety, None, sizes)
    pair = checkpointing.pair(best, wanted, lambda b: not capacity or not points or
                              fit_memory(points)(b) <= safety * capacity, failed_above, gain)
    if pair is not None:
        return pair
    def next_size(size: int) -> int | None:
        """The ladder's next size above `size`: under the memory's, and the script's steps' ceilings."""
        larger = next_batch_size(size, points, capacity, safety, failed_above, sizes)
        if larger is not None and most is not None and larger > most:
            larger = next_batch_size(size, points, capacity, safety, most + 1, sizes)
        return larger

    size = next_size(current)
    # A size whose trial failed otherwise than out of memory (a crash, a setting that cannot run) gives way to
    # the next one of the same direction, and so does one that read within the noise (a step of the ladder too
    # small for the noise to show; the next is twice as large): the row says so.
    passed = {**best.learned.within_noise(best.knobs, "batch_size"),
              **{b: f"failed ({why})" for b, why in best.learned.failed(best.knobs, "batch_size").items()}}
    why = None
    while size is not None and size in passed:
        why = f"in place of batch {size}, which {passed[size]}: the next size"
        size = next_size(size)
    if size is None:
        return None
    return Offer({"batch_size": size}, f"batch {current}→{size}", f"batch-{size}", gain, "host",
                 predicted=rec is not None, why=why)


def recover(best: Best) -> tuple[Offer, ...]:
    """After an out-of-memory baseline, the last resort: the user's batch halved, quartered or an eighth (a smaller
    effective batch, said plainly)."""
    batch = best.learned.user.get("batch_size")
    return tuple(Offer({"batch_size": batch // f}, f"batch {batch}→{batch // f} (smaller effective batch)",
                       f"batch-{batch // f}", 0.0, "memory", predicted=False, recommendation="oom-smaller-batch")
                 for f in (2, 4, 8) if batch and batch // f >= 1)


KNOB = Knob("batch_size", COUNT, LOADER, AT_LOADER, "the batch size", alone=NEEDS_A_VALUE,
            training_argument="per_device_train_batch_size", proposed_as="larger-batch", spread=(0.10, 0.10),
            whatif=WHAT_IF, written=Written(IN_LOADER, position=1, excluded_by="batch_sampler"),
            moved=lambda v: f"batch →{v}", offer=offer, order=1,
            recover=recover, recovers_at=4, in_loader=in_loader)

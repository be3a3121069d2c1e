"""Which change to try next (whether it is kept: `advisor.search.decision`): the search follows the bound.

What a change is worth depends on what bounds the step when it is tried: more DataLoader workers help
only while the loader binds, pinned non_blocking copies only once the copies do, AMP only once the
device computes. So each proposal names the bound it addresses, and those that address the best
trial's bound are tried first:

    input    → more workers (the ladder 2, 4, 8, … up to the cores), measuring each size: a size that
               did not help does not stop the ladder while the loader still binds; on the CPU, fewer
               torch threads beside the workers (threads + workers within the cores); 8-bit images
               from the loader, so that the float conversion leaves the workers
    copy     → pin_memory and non_blocking, as one change (on an accelerator); 8-bit images from the
               loader, converted and normalized where the step moves them (a quarter of the bytes)
    host     → a larger batch (fewer, larger kernels per sample)
    compute  → AMP (bf16 where the device computes it, else fp16 with a GradScaler), channels_last
               where convolutions take the step, scaled_dot_product_attention where attention written by
               hand does, torch.compile, TF32 where AMP did not pay (Ampere and
               later), cuDNN autotuning for convolutions of fixed shapes; AMP with channels_last is the
               pair that pays most together, and the pairing below finds it
    host     → torch.compile (fused kernels), a fused optimizer where its step takes time
    communication → DistributedDataParallel's arguments (bucket size, bucket views), with several ranks
    memory   → the out-of-memory recovery plan (`recovery_plan`); activation checkpointing with the
               larger batch that does not fit without it (`advisor.search.checkpoint_proposals`)

Changes for other bounds follow, so that a full round over the knobs is tried before the session
ends. A knob a trial found not applicable (channels_last on a model without convolutions, a compile
that failed) is not proposed again. No setting is measured twice (except to settle an inconclusive gain); a change reverted while one
bound held is tried again only once the bound has moved (and the base it would be applied to has
changed with it). Candidate values come from a `SearchSpace`: free for live trials, or those a
recorded surface holds. Pure functions over the session record.

The moves of AMP, pinned copies, threads, compile, 8-bit images and DDP's arguments are their knobs' own
(`Knob.offer`, `advisor.knobs.offer`): this module asks each for its move from the best and ranks them with the
ladders it keeps itself (the workers, the batch) and the knobs a finding's advice turns on.

Every proposal is made by `advisor.search.proposal.on_best`: the best of now with its moves applied.
What the session learned of each move (reverted under a bound, within its noise, failed) is
`advisor.search.history`'s.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable

from advisor.analysis.worth import ceiling
from advisor.knobs import ADVISED, COMPANIONS, OFFERING, SWITCHED_KNOBS, Knob, companions_of, with_companions
from advisor.knobs.offer import ROUND_GAIN, Best
from advisor.trials.knobs import Knobs
from advisor.search.bounds import Bound
from advisor.search.checkpoint_proposals import checkpoint_pair, recovery_move
from advisor.search.expected import rank
from advisor.search.history import failed_settings, reverted_under, within_noise
from advisor.search.proposal import Proposal, on_best, own_moves
from advisor.search.predictions import reprice
from advisor.trials.replay.surface import SETTINGS, SurfacePoint


@dataclass(frozen=True)
class SearchSpace:
    """The values the search may give each knob: None = free (live trials), else those a surface holds."""

    workers: tuple[int, ...] | None = None
    batch_sizes: tuple[int, ...] | None = None
    amp: tuple[str, ...] | None = None
    pinned_copies: bool = True  # whether pin_memory + non_blocking can be tried at all
    model_knobs: tuple[str, ...] | None = None  # channels_last, compile, ...: None = all (a surface holds none)
    only: frozenset[str] | None = None  # the user's --only: None = every knob (advisor.search.space)
    skip: frozenset[str] = frozenset()  # the user's --skip

    def allows(self, knob: str) -> bool:
        """Whether the search may turn this model knob."""
        return (self.model_knobs is None or knob in self.model_knobs) and self.permits({knob})

    def permits(self, knobs: set[str]) -> bool:
        """Whether the user lets the search turn all of these knobs (--only, --skip)."""
        return not knobs & self.skip and (self.only is None or knobs <= self.only)


def surface_space(points: list[SurfacePoint]) -> SearchSpace:
    """The values the search may try on a recorded surface (`advisor.trials.replay.surface`): those it holds;
    a model knob, 8-bit copies or the threads only where the surface holds both sides of it."""
    column = {name: {p.settings[i] for p in points} for i, name in enumerate(SETTINGS)}
    pin, blocking = SETTINGS.index("pin_memory"), SETTINGS.index("non_blocking")
    return SearchSpace(
        workers=tuple(sorted(w for w in column["num_workers"] if isinstance(w, int))),
        batch_sizes=tuple(sorted(b for b in column["batch_size"] if isinstance(b, int))),
        amp=tuple(sorted(a for a in column["amp"] if a)),
        pinned_copies=any(p.settings[pin] and p.settings[blocking] for p in points),
        model_knobs=tuple(k for k in SWITCHED_KNOBS if len(column[k]) > 1),
        skip=frozenset() if len(column["threads"]) > 1 else frozenset({"threads"}),
    )


def knobs_key(knobs: dict[str, Any] | Knobs) -> str:
    """A canonical text of a knob setting (trials with equal keys measured the same thing)."""
    data = knobs.to_dict() if isinstance(knobs, Knobs) else dict(knobs)
    return json.dumps(data, sort_keys=True)


def effective(knobs: Knobs, user_values: dict[str, Any], name: str) -> Any:
    """The value a knob has in a trial: the override, else what the user wrote."""
    value = getattr(knobs, name)
    return user_values.get(name) if value is None else value


def worker_ladder(cores: int) -> tuple[int, ...]:
    """Worker counts to try: 2, 4, 8, … below the cap, then the cap; the cap leaves two cores to the
    training process on machines with more than four, and is never below 2 (a loader that waits on
    files or sleeps gains from workers even without a core of their own: measured, like any size)."""
    cap = max(2, cores if cores <= 4 else cores - 2)
    ladder, w = [], 2
    while w < cap:
        ladder.append(w)
        w *= 2
    return tuple(ladder + [cap])


# --- what to try next ------------------------------------------------------------------------------------

def propose(diagnosis: Any, bound: Bound, best: Any, state: dict[str, Any], options: Any,
            space: SearchSpace, retry_reverted: bool = False) -> list[Proposal]:
    """Candidate trials from the best trial: those that address its bound first, then the rest (a full
    round over the knobs), each by predicted gain (the what-if model's, `advisor.search.predictions`); never
    a setting already measured. `retry_reverted`: also changes reverted under this bound (as the second move of a pair, they are tried from another base)."""
    recs = {r.id: r for r in diagnosis.recommendations} if diagnosis is not None else {}
    facts = state.get("device") or {}
    accelerator = facts.get("type") == "cuda"
    # Each rank of a data-parallel trial on this node gets its share of the cores.
    cores = max(1, ((facts.get("cpu") or {}).get("logical_cores") or 1) // max(1, options.nproc_per_node))
    user = state.get("user_values") or {}
    here = Best(best.knobs, recs, bound.name, facts, cores, effective(best.knobs, user, "num_workers") or 0,
                best.knobs.threads or user.get("threads"), space, options.nproc_per_node)
    found = [
        workers_proposal(recs.get("more-workers"), bound, best.knobs, state, space, cores, accelerator),
        # The top of the ladder beside its next step: where a larger batch or pinned copies change what workers
        # are worth, the step between may read nothing (the model and the expected improvement choose).
        workers_proposal(recs.get("more-workers"), bound, best.knobs, state, space, cores, accelerator, top=True),
        batch_proposal(recs.get("larger-batch"), bound, best, state, options, space),
        # The moves a knob's module offers on its own (AMP, pinned copies, threads, compile, 8-bit images, DDP's
        # arguments), and those a finding's advice turns on (channels_last, a fused optimizer, TF32,
        # cudnn.benchmark, sdpa: each knob's module names the advice).
        *(offered(k, here) for k in OFFERING),
        *(model_knob_proposal(recs, k, best.knobs, state, space) for k in ADVISED),
    ]
    tried = {knobs_key(t["knobs"]) for t in state["trials"]}
    refused = not_applicable_knobs(state)
    best_sps = next((t.get("samples_per_s") for t in state["trials"] if t.get("name") == best.name), None)
    out = []
    for p in found:
        if p is None or knobs_key(p.knobs) in tried or turned(best.knobs, p.knobs) & refused:
            continue
        if own_moves(p.move_dict, best.knobs, user):
            continue  # the script has it already: never proposed, never credited
        if p.recoverable is not None and ceiling(p.recoverable) < options.min_gain:
            continue  # all the trace lets it take back is less than the least gain the session keeps (--min-gain)
        if not space.permits(turned(best.knobs, p.knobs)):
            continue  # outside what the user lets the search turn (--only, --skip)
        if (not retry_reverted and p.recommendation != "more-workers"
                and reverted_under(state, p, bound.name, best_sps)):
            continue  # it did not help while this bound held; it is tried again once the bound moves
        out.append(dataclasses.replace(p, helps_now=bound.name is not None and p.bound == bound.name))
    # The what-if model's figure where it can simulate the change (the rules' otherwise), with its kind's
    # spread: one scale, the expected improvement over the best (`advisor.search.expected`).
    return rank(reprice(out, state, best.name, best.knobs), state)


def turned(before: Knobs | dict[str, Any], after: Knobs | dict[str, Any]) -> set[str]:
    """The knobs a change turns (a companion, persistent_workers with num_workers, is not counted)."""
    a = before.to_dict() if isinstance(before, Knobs) else before
    b = after.to_dict() if isinstance(after, Knobs) else after
    return {k for k, v in b.items() if v != a.get(k)} - COMPANIONS


def not_applicable_knobs(state: dict[str, Any]) -> set[str]:
    """The knobs an earlier trial of the session found not applicable to this script or device."""
    return {k for t in state["trials"] for k, v in (t.get("outcomes") or {}).items()
            if str(v).startswith("not applicable")}


def offered(knob: Knob, best: Best) -> Proposal | None:
    """The move a knob's module offers from the best of now (`Knob.offer`), as a proposal on the best."""
    offer = knob.offer(best)
    if offer is None:
        return None
    return on_best(best.knobs, offer.moves, offer.recommendation or knob.proposed_as, offer.change, offer.slug,
                   offer.gain, offer.bound, predicted=offer.predicted)


def workers_proposal(rec: Any, bound: Bound, knobs: Knobs, state: dict[str, Any], space: SearchSpace,
                     cores: int, accelerator: bool = False, top: bool = False) -> Proposal | None:
    """More DataLoader workers while the loader binds: the next size up the ladder (`top`: its largest, where
    that is not the next), past the sizes that were tried from this setting under this bound and did not help.
    On the CPU the step's torch threads make room for them (threads + workers within the cores): workers and
    threads fighting over the cores is slower than either alone."""
    if rec is None and bound.name != "input":
        return None
    user = state["user_values"]
    current = effective(knobs, user, "num_workers") or 0
    # What a workers change moves with it (the threads that make room for them on a CPU) is not its base.
    moved = ("num_workers", *companions_of({"num_workers"}), "threads")
    base = {k: v for k, v in knobs.to_dict().items() if k not in moved}
    past = [t["knobs"].get("num_workers") or 0 for t in state["trials"]
            if t.get("recommendation") == "more-workers" and t.get("tried_under") == bound.name
            and {k: v for k, v in t["knobs"].items() if k not in moved} == base]
    floor = max([current, *past])
    ladder = space.workers if space.workers is not None else worker_ladder(cores)
    above = [w for w in sorted(ladder) if w > floor]
    if not above or (top and len(above) < 2):
        return None
    target = above[-1] if top else above[0]
    errored = failed_settings(state, knobs, "num_workers")
    why = f"in place of workers {floor}, which failed ({errored[floor]}): the next count" if floor in errored else None
    gain = rec.predicted_gain if rec is not None else 0.5
    moves: dict[str, Any] = with_companions({"num_workers": target})
    threads = knobs.threads or state["user_values"].get("threads")
    change = f"workers {current}→{target}"
    if (not accelerator and threads and threads + target > cores and max(1, cores - target) < threads
            and space.permits({"threads"})):
        moves["threads"] = max(1, cores - target)
        change += f", threads {threads}→{moves['threads']}"
    return on_best(knobs, moves, "more-workers", change, f"workers-{target}", gain, "input", why=why,
                   predicted=rec is not None, recoverable=rec.recoverable if rec is not None else None)


def model_knob_proposal(recs: dict[str, Any], knob: Knob, knobs: Knobs, state: dict[str, Any],
                        space: SearchSpace) -> Proposal | None:
    """A knob one rule advises and names the bound of: a knob whose module names that advice (channels_last for
    convolutions, a fused optimizer for its step's time, TF32 for fp32 matmuls off the Tensor Cores, cudnn.benchmark
    for convolutions of fixed shapes, sdpa for attention written by hand). A knob that does less of what another
    does (TF32 of what AMP does) waits for that one: not beside it, nor before its advised change was tried."""
    rec = recs.get(knob.advice)
    if rec is None or getattr(knobs, knob.name) or not space.allows(knob.name):
        return None
    if knob.after and (getattr(knobs, knob.after) or (recs.get(knob.after) is not None and not any(
            t.get("recommendation") == knob.after for t in state["trials"]))):
        return None
    return on_best(knobs, {knob.name: True}, rec.id, knob.title, knob.name.replace("_", "-"), rec.predicted_gain,
                   rec.bound)


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


def batch_proposal(rec: Any, bound: Bound, best: Any, state: dict[str, Any], options: Any,
                   space: SearchSpace) -> Proposal | None:
    """A larger batch, while the memory model says it fits: advised for a launch-bound step, else a
    measured experiment in the round over the knobs."""
    if options.keep_effective_batch:
        return None
    if state["trials"][0]["status"] == "oom" or best.knobs.accumulation_steps:
        return None  # memory-bound already: the batch was made to fit, not to grow
    current = best.batch_size
    if not current or (state.get("training_loader") or {}).get("batch_sampler"):
        return None  # a loader built with the script's batch_sampler takes no batch_size: nothing to try
    # Against a CPU --memory-limit, the memory the cap counts (the data segment beyond torch's own).
    points = [(t["batch_size"], t.get("peak_capped_bytes") or t["peak_memory_bytes"]) for t in state["trials"]
              if t["status"] == "ok" and t.get("batch_size") and t.get("peak_memory_bytes")]
    # The batch size a trial asked for: one that ran out of memory in its first step measured none.
    failed = [t["knobs"]["batch_size"] for t in state["trials"]
              if t["status"] == "oom" and (t.get("knobs") or {}).get("batch_size")]
    failed_above = min((b for b in failed if b > current), default=None)
    capacity = state["trials"][0].get("capacity_bytes")
    gain = rec.predicted_gain if rec is not None else (0.1 if bound.name == "host" else ROUND_GAIN)
    # The size the search wants, whether or not it fits: where it does not, checkpointing buys it.
    wanted = next_batch_size(current, points, None, options.memory_safety, None, space.batch_sizes)
    pair = checkpoint_pair(best, state, space, wanted, lambda b: not capacity or not points or
                           fit_memory(points)(b) <= options.memory_safety * capacity, failed_above, gain)
    if pair is not None:
        return pair
    size = next_batch_size(current, points, capacity, options.memory_safety, failed_above, space.batch_sizes)
    # A size whose trial failed otherwise than out of memory (a crash, a setting that cannot run) gives way to
    # the next one of the same direction, and so does one that read within the noise (a step of the ladder too
    # small for the noise to show; the next is twice as large): the row says so.
    passed = {**within_noise(state, best.knobs, "batch_size"),
              **{b: f"failed ({why})" for b, why in failed_settings(state, best.knobs, "batch_size").items()}}
    why = None
    while size is not None and size in passed:
        why = f"in place of batch {size}, which {passed[size]}: the next size"
        size = next_batch_size(size, points, capacity, options.memory_safety, failed_above, space.batch_sizes)
    if size is None:
        return None
    return on_best(best.knobs, {"batch_size": size}, "larger-batch", f"batch {current}→{size}", f"batch-{size}",
                   gain, "host", why=why, predicted=rec is not None)


# --- out of memory --------------------------------------------------------------------------------------

def recovery_plan(state: dict[str, Any]) -> list[Proposal]:
    """Configurations to try after the baseline ran out of memory, closest to the user's first."""
    facts = state.get("device") or {}
    batch = (state.get("user_values") or {}).get("batch_size")
    if facts.get("type") == "cuda":
        dtype = "bf16" if (facts.get("gpu") or {}).get("bf16_supported") else "fp16"
    else:  # CPU autocast is bf16 only, and only worth it where the CPU computes bf16
        dtype = "bf16" if ((facts.get("cpu") or {}).get("bf16_instructions")) else None
    plan, baseline = [], Knobs()  # each made on the baseline: the best while nothing fits
    if dtype:
        plan.append(on_best(baseline, {"amp": dtype}, "oom-amp", f"AMP {dtype}", f"amp-{dtype}", 0.0, "memory",
                            predicted=False))
    checkpointing = recovery_move(state, baseline)  # the batch as written, in one step
    if checkpointing is not None:
        plan.append(checkpointing)
    for k in (2, 4, 8):
        if batch and batch % k == 0:
            plan.append(on_best(baseline, {"accumulation_steps": k}, "oom-accumulation",
                                f"micro-batches {batch // k}×{k}", f"accumulate-{k}", 0.0, "memory",
                                predicted=False))
    for f in (2, 4, 8):
        if batch and batch // f >= 1:
            plan.append(on_best(baseline, {"batch_size": batch // f}, "oom-smaller-batch",
                                f"batch {batch}→{batch // f} (smaller effective batch)", f"batch-{batch // f}", 0.0,
                                "memory", predicted=False))
    user = state.get("user_values") or {}
    return [p for p in plan if not own_moves(p.move_dict, baseline, user)]

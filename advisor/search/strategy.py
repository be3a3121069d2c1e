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
    memory   → the out-of-memory recovery plan (`recovery_plan`: each knob's `Knob.recover`); activation
               checkpointing with the larger batch that does not fit without it (`advisor.knobs.checkpointing`)

Changes for other bounds follow, so that a full round over the knobs is tried before the session
ends. A knob a trial found not applicable (channels_last on a model without convolutions, a compile
that failed) is not proposed again. No setting is measured twice (except to settle an inconclusive gain); a change reverted while one
bound held is tried again only once the bound has moved (and the base it would be applied to has
changed with it). Candidate values come from a `SearchSpace`: free for live trials, or those a
recorded surface holds. Pure functions over the session record.

Every knob's moves are its own module's (`Knob.offer`, `advisor.knobs.offer`): the ladders of workers and batch
(which read the steps the session took, `Best.learned`), AMP, pinned copies, threads, compile, 8-bit images and
DDP's arguments. This module asks each for its moves from the best and ranks them with the knobs a finding's
advice turns on.

Every proposal is made by `advisor.search.proposal.on_best`: the best of now with its moves applied.
What the session learned of each move (reverted under a bound, within its noise, failed) is
`advisor.search.history`'s.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from advisor.search.record import SessionRecord
from advisor.analysis.worth import ceiling
from advisor.knobs import ADVISED, COMPANIONS, OFFERING, RECOVERING, SWITCHED_KNOBS, Knob
from advisor.knobs.offer import Best, Learned, Offer
from advisor.trials.knobs import Knobs
from advisor.search.bounds import Bound
from advisor.search.expected import rank
from advisor.search.history import reverted_under
from advisor.search.proposal import Proposal, on_best, own_moves
from advisor.search.predictions import reprice
from advisor.trials.replay.surface import SETTINGS, SurfacePoint


@dataclass(frozen=True)
class SearchSpace:
    """The values the search may give each knob: free (live trials), or those a recorded surface holds."""

    held: dict[str, tuple[Any, ...]] | None = None  # knob → the values it may take (a knob not named: any)
    points: tuple[dict[str, Any], ...] | None = None  # the settings a recorded surface holds, each by knob
    model_knobs: tuple[str, ...] | None = None  # channels_last, compile, ...: None = all (a surface holds none)
    only: frozenset[str] | None = None  # the user's --only: None = every knob (advisor.search.space)
    skip: frozenset[str] = frozenset()  # the user's --skip, and what a surface holds at one value only

    def values(self, knob: str) -> tuple[Any, ...] | None:
        """The values the search may give this knob (None: any)."""
        return None if self.held is None else self.held.get(knob)

    def holds(self, moves: dict[str, Any]) -> bool:
        """Whether these values may be tried together: a surface holds a setting with all of them (of the knobs it
        tells settings apart by); else each is one its knob may take."""
        if self.points is not None:
            return any(all(p[k] == v for k, v in moves.items() if k in p) for p in self.points)
        return all(self.values(k) is None or v in self.values(k) for k, v in moves.items())

    def allows(self, knob: str) -> bool:
        """Whether the search may turn this model knob."""
        return (self.model_knobs is None or knob in self.model_knobs) and self.permits({knob})

    def permits(self, knobs: set[str]) -> bool:
        """Whether the user lets the search turn all of these knobs (--only, --skip)."""
        return not knobs & self.skip and (self.only is None or knobs <= self.only)


def surface_space(points: list[SurfacePoint]) -> SearchSpace:
    """The values the search may try on a recorded surface (`advisor.trials.replay.surface`): those it holds, and
    together only as its settings hold them; a knob it holds at one value only is not turned."""
    settings = tuple(dict(zip(SETTINGS, p.settings)) for p in points)
    column = {name: {s[name] for s in settings} for name in SETTINGS}
    held = {name: tuple(sorted((v for v in values if v is not None), key=lambda v: (type(v).__name__, v)))
            for name, values in column.items()}
    return SearchSpace(held=held, points=settings, model_knobs=tuple(k for k in SWITCHED_KNOBS if len(column[k]) > 1),
                       skip=frozenset(name for name, values in column.items() if len(values) <= 1))


def knobs_key(knobs: dict[str, Any] | Knobs) -> str:
    """A canonical text of a knob setting (trials with equal keys measured the same thing)."""
    data = knobs.to_dict() if isinstance(knobs, Knobs) else dict(knobs)
    return json.dumps(data, sort_keys=True)


# --- what to try next ------------------------------------------------------------------------------------

def propose(diagnosis: Any, bound: Bound, best: Any, state: SessionRecord, options: Any,
            space: SearchSpace, retry_reverted: bool = False) -> list[Proposal]:
    """Candidate trials from the best trial: those that address its bound first, then the rest (a full
    round over the knobs), each by predicted gain (the what-if model's, `advisor.search.predictions`); never
    a setting already measured. `retry_reverted`: also changes reverted under this bound (as the second move of a pair, they are tried from another base)."""
    recs = {r.id: r for r in diagnosis.recommendations} if diagnosis is not None else {}
    facts = state.device or {}
    # Each rank of a data-parallel trial on this node gets its share of the cores.
    cores = max(1, ((facts.get("cpu") or {}).get("logical_cores") or 1) // max(1, options.nproc_per_node))
    user = state.user_values or {}
    learned = Learned(tuple(state.trials), user, state.get("training_loader") or {})
    here = Best.of(best.knobs, recs, bound.name, facts, cores, space, options.nproc_per_node, learned, best, options)
    found = [
        # The moves a knob's module offers (the ladders of workers and batch first, then AMP, pinned copies,
        # threads, compile, 8-bit images, DDP's arguments), and those a finding's advice turns on (channels_last, a
        # fused optimizer, TF32, cudnn.benchmark, sdpa: each knob's module names the advice).
        *(p for k in OFFERING for p in offered(k, here)),
        *(model_knob_proposal(recs, k, best.knobs, state, space) for k in ADVISED),
    ]
    tried = {knobs_key(t.knobs) for t in state.trials}
    refused = not_applicable_knobs(state)
    best_sps = next((t.samples_per_s for t in state.trials if t.name == best.name), None)
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


def not_applicable_knobs(state: SessionRecord) -> set[str]:
    """The knobs an earlier trial of the session found not applicable to this script or device."""
    return {k for t in state.trials for k, v in (t.get("outcomes") or {}).items()
            if str(v).startswith("not applicable")}


def offered(knob: Knob, best: Best) -> list[Proposal]:
    """The moves a knob's module offers from the best of now (`Knob.offer`), as proposals on the best."""
    return proposals_of(knob, best, knob.offer(best))


def proposals_of(knob: Knob, best: Best, made: Offer | tuple[Offer | None, ...] | None) -> list[Proposal]:
    """A knob's offers (one, several or none) as proposals on the best they were made from."""
    offers = made if isinstance(made, tuple) else (made,)
    return [on_best(best.knobs, o.moves, o.recommendation or knob.proposed_as, o.change, o.slug, o.gain, o.bound,
                    why=o.why, predicted=o.predicted, recoverable=o.recoverable) for o in offers if o is not None]


def model_knob_proposal(recs: dict[str, Any], knob: Knob, knobs: Knobs, state: SessionRecord,
                        space: SearchSpace) -> Proposal | None:
    """A knob one rule advises and names the bound of: a knob whose module names that advice (channels_last for
    convolutions, a fused optimizer for its step's time, TF32 for fp32 matmuls off the Tensor Cores, cudnn.benchmark
    for convolutions of fixed shapes, sdpa for attention written by hand). A knob that does less of what another
    does (TF32 of what AMP does) waits for that one: not beside it, nor before its advised change was tried."""
    rec = recs.get(knob.advice)
    if rec is None or getattr(knobs, knob.name) or not space.allows(knob.name):
        return None
    if knob.after and (getattr(knobs, knob.after) or (recs.get(knob.after) is not None and not any(
            t.recommendation == knob.after for t in state.trials))):
        return None
    return on_best(knobs, {knob.name: True}, rec.id, knob.title, knob.name.replace("_", "-"), rec.predicted_gain,
                   rec.bound)


# --- out of memory --------------------------------------------------------------------------------------

def recovery_plan(state: SessionRecord) -> list[Proposal]:
    """Configurations to try after the baseline ran out of memory, closest to the user's first: each knob's
    recovery moves (`Knob.recover`: AMP, checkpointing, micro-batches, a smaller batch), made on the baseline (the
    best while nothing fits), less those the script holds already."""
    user = state.user_values or {}
    baseline = Knobs()
    here = Best.of(baseline, {}, "memory", state.device or {}, 1, SearchSpace(), 1,
                   Learned(tuple(state.trials), user, state.get("training_loader") or {}))
    plan = [p for k in RECOVERING for p in proposals_of(k, here, k.recover(here))]
    return [p for p in plan if not own_moves(p.move_dict, baseline, user)]

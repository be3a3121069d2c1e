"""Diagnosis → ranked Recommendations. Each rule is a pure function that returns a Recommendation or None.

A rule speaks only when the trace supports it: each recommendation carries the figures that triggered it
(its evidence), the bound it addresses (a key of `advisor.analysis.bound.BOUNDS`) and a predicted gain, the
share of step time it is expected to save, used for ranking. A recommendation helps now when its bound is
the diagnosis's bound. One that addresses another bound does not claim its gain now: it helps once the
current bound is fixed, and its predicted gain is the time it should save then, as a share of today's
step (once the current bound's time is gone the step is shorter, so its share then is larger; how much
shorter no trace says). Predicted gains are deliberately rough; the optimization session measures the
real effect.

Rules live in one module per family: `loader` (DataLoader workers), `precision` (AMP, TF32, channels_last, cuDNN autotuning, SDPA),
`copies` (pinned memory, non_blocking, fewer bytes), `launch` (batch size, CUDA graphs, fused optimizer),
`memory` (growth, activation checkpointing), `distributed` (DDP buckets, no_sync accumulation); the
job-wide rules for several ranks (a straggler) are in `advisor.analysis.job`; each is listed in `RULES` (or `MEMORY_RULES`). Their
thresholds are shares of the average step unless said otherwise.
"""

from __future__ import annotations

import dataclasses

from advisor.analysis.bound import BOUNDS
from advisor.analysis.worth import EVIDENCE, prior_spread, worth
from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.rules.copies import fewer_copy_bytes, non_blocking, pin_memory, prefetch_to_device
from advisor.analysis.rules.distributed import ddp_buckets, no_sync_accumulation
from advisor.analysis.rules.launch import cuda_graphs, fused_optimizer, larger_batch
from advisor.analysis.rules.loader import more_workers
from advisor.analysis.rules.memory import activation_checkpointing, memory_growth
from advisor.analysis.rules.precision import amp, channels_last, cudnn_benchmark, sdpa, tf32
from advisor.analysis.rules.recommendation import Recommendation

__all__ = ["Recommendation", "recommend", "ranked", "RULES", "MEMORY_RULES"]

MIN_GAIN = 0.005  # below half a percent of the step, a change is not worth the user's attention

# One module per recommendation family (loader, precision, copies, launch, memory); a rule is listed here.
RULES = (more_workers, amp, pin_memory, non_blocking, larger_batch, cuda_graphs, fused_optimizer, fewer_copy_bytes,
         prefetch_to_device, channels_last, tf32, cudnn_benchmark, sdpa, ddp_buckets, no_sync_accumulation)
MEMORY_RULES = (memory_growth, activation_checkpointing)  # whether the run fits at all; no speed gain


def recommend(d: Diagnosis) -> tuple[Recommendation, ...]:
    """All recommendations the diagnosis supports, by what each is worth a trial (`ranked`).

    A degenerate trace (`Diagnosis.extra["degenerate"]`, bound None unless memory binds) gets no speed
    advice: its figures cannot carry any.
    """
    found = [r for rule in MEMORY_RULES if (r := rule(d)) is not None]
    if d.bound is not None and not d.extra.get("degenerate"):
        found += [r for rule in RULES if (r := rule(d)) is not None]
    out = []
    for r in found:
        if d.bound is None or r.bound == d.bound:
            out.append(r)
        else:
            out.append(dataclasses.replace(r, helps_now=False, helps_once=BOUNDS[d.bound]))
    out = [r for r in out if r.bound == "memory" or r.predicted_gain >= MIN_GAIN]
    return ranked(out, d.platform)


def ranked(recommendations: list[Recommendation], platform: str) -> tuple[Recommendation, ...]:
    """Recommendations with what each is worth a trial (`advisor.analysis.worth`: its predicted gain, its kind's
    spread on this platform, wider where it addresses the bound, never wider than the share its evidence can
    take back), the most first; memory advice first where memory binds (whether the run fits at all)."""
    out = [dataclasses.replace(r, worth=worth(r.predicted_gain, prior_spread(r.id, platform != "cpu")
                                               * (EVIDENCE if r.helps_now else 1.0), r.recoverable))
           for r in recommendations]
    return tuple(sorted(out, key=lambda r: (not (r.bound == "memory" and r.helps_now), -r.worth)))

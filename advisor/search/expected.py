"""Expected improvement: one scale on which every candidate trial is ranked, a first move, a pair or a re-measure.

A candidate carries a predicted gain μ (the what-if model's, else the rules' figure: a relative change of
samples/s) and an uncertainty σ: the prior spread of that kind of change on this kind of device, narrowed by
how far the session's own predictions of that kind were from what it measured. Its value is the expected
improvement over the best, E[max(0, X)] for X ~ N(μ, σ²) = μ·Φ(μ/σ) + σ·φ(μ/σ): a change the model prices at
+0 % is still worth a trial where its spread is wide (AMP under fp32 matrix products, pinned copies beside
a loader that binds), and a re-measure of a move read within its noise is worth only what it can still
change (its gain, with the standard error of one more measurement). Bayesian optimisation's acquisition
function, on the what-if model as the surrogate. Pure functions over the session record.
"""

from __future__ import annotations

import math
from typing import Any

from advisor.search.proposal import Proposal
from advisor.search.state import samples_gain

# σ of a first move's relative change of samples/s before the session measured any of its kind: what one such
# change moved on the recorded surfaces (H100 and CPU truth surfaces, the pair surfaces), roughly. Wide where
# one change can double the step (workers, pinned copies beside a fed loader, AMP off the Tensor Cores), narrow
# where it moves a few percent.
SPREAD_GPU = {"more-workers": 0.30, "pin-memory": 0.30, "amp": 0.25, "larger-batch": 0.10, "fewer-copy-bytes": 0.10,
              "channels-last": 0.15, "compile": 0.20, "cuda-graphs": 0.15, "fused-optimizer": 0.05, "tf32": 0.10,
              "cudnn-benchmark": 0.05, "sdpa": 0.15, "ddp-buckets": 0.10, "fewer-threads": 0.10}
SPREAD_CPU = {"more-workers": 0.30, "amp": 0.20, "larger-batch": 0.10, "fewer-copy-bytes": 0.10,
              "channels-last": 0.30, "compile": 0.30, "fused-optimizer": 0.05, "sdpa": 0.15, "fewer-threads": 0.10}
DEFAULT_SPREAD = 0.10
EVIDENCE = 1.5  # a change that addresses the bound the trace shows: the trace says there is room, its spread wider


def expected_improvement(mu: float, sigma: float) -> float:
    """E[max(0, X)] for X ~ N(mu, sigma²); mu itself (at least 0) where sigma is 0."""
    if sigma <= 0:
        return max(0.0, mu)
    z = mu / sigma
    return mu * 0.5 * (1 + math.erf(z / math.sqrt(2))) + sigma * math.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def kinds(recommendation: str | None) -> list[str]:
    """The kinds of change a recommendation makes: one, or each of a pair's ("amp+pin-memory")."""
    return [k for k in str(recommendation or "").split("+") if k]


def prior_spread(recommendation: str | None, accelerator: bool) -> float:
    """σ of a change of this kind before anything was measured (a pair's: the root sum of its moves')."""
    table = SPREAD_GPU if accelerator else SPREAD_CPU
    return math.sqrt(sum(table.get(k, DEFAULT_SPREAD) ** 2 for k in kinds(recommendation)) or DEFAULT_SPREAD ** 2)


def spread(recommendation: str | None, state: dict[str, Any]) -> float:
    """σ of a change of this kind in this session: the prior, narrowed (or widened) by the session's own
    predictions of its kinds, each measured row's error counting as one more draw beside the prior."""
    accelerator = (state.get("device") or {}).get("type") == "cuda"
    sigma = prior_spread(recommendation, accelerator)
    mine = set(kinds(recommendation))
    errors = [abs(t["predicted_samples_gain"] - t["gain"]) for t in state.get("trials") or []
              if t.get("predicted_samples_gain") is not None and t.get("gain") is not None
              and set(kinds(t.get("recommendation"))) == mine]
    if not errors:
        return sigma
    return math.sqrt((sigma ** 2 + sum(e * e for e in errors)) / (1 + len(errors)))


def value(proposal: Proposal, state: dict[str, Any]) -> float:
    """The expected improvement of a proposal over the best (its predicted gain, its kind's spread; wider where
    it addresses the bound the trace shows)."""
    sigma = spread(proposal.recommendation, state) * (EVIDENCE if proposal.helps_now else 1.0)
    # The share of the step saved as the change of samples/s it gives (×1000 at most: a share held below 1).
    return expected_improvement(samples_gain(min(proposal.predicted_gain, 1 - 1e-3)), sigma)


def rank(proposals: list[Proposal], state: dict[str, Any]) -> list[Proposal]:
    """Proposals by expected improvement, the largest first (ties: those that address the bound)."""
    return sorted(proposals, key=lambda p: (-round(value(p, state), 6), not p.helps_now, -p.predicted_gain))


def remeasure_value(gain: float, noise: float) -> float:
    """What measuring a move read within its noise once more can still change: the expected improvement of its
    gain as read, with one more measurement's standard error (`noise` is two of the difference's)."""
    return expected_improvement(gain, noise / 2)


def measured_kinds(state: dict[str, Any]) -> set[str]:
    """The kinds of change some trial of the session measured, as a first move or in a pair."""
    return {k for t in state.get("trials") or [] if t.get("status") == "ok" for k in kinds(t.get("recommendation"))}


def untried(proposals: list[Proposal], state: dict[str, Any], done: set[str] | None = None) -> list[Proposal]:
    """The proposals whose kind of change no trial of the session has measured yet (`done`: those kinds, where
    the caller knows more): levers the trace points at, not yet measured on any best."""
    done = measured_kinds(state) if done is None else done
    return [p for p in proposals if not set(kinds(p.recommendation)) & done]


def deferred_for(decision: Any, proposal: Proposal, others: list[Proposal], state: dict[str, Any]) -> str | None:
    """Why a move read within its noise is not measured again now, or None: a lever the session has not measured
    yet (of `others`, the proposals after it) is worth more than the re-measure can still change."""
    if decision is None:
        return None
    levers = untried(others, state, measured_kinds(state) | set(kinds(proposal.recommendation)))
    if not levers:
        return None
    worth, rival = max(((value(p, state), p) for p in levers), key=lambda pair: pair[0])
    again = remeasure_value(decision.gain, decision.noise)
    if worth <= again:
        return None
    return f"{rival.change}, not measured yet, is worth more (expected {100 * worth:+.1f}% against " \
           f"{100 * again:+.1f}% for this once more)"


def levers_left(proposals: list[Proposal], state: dict[str, Any]) -> str:
    """Where the budget ends before every lever the trace points at was measured: those left, kept in the record
    (`unmeasured`) and said after the stop's note ("" where none is left)."""
    left = untried(proposals, state)
    state["unmeasured"] = [p.change for p in left]
    return f"; never measured: {', '.join(state['unmeasured'])}" if left else ""

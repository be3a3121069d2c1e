"""What a change is worth a trial: its expected improvement, one scale for the search's candidates and the
advice of a diagnosis.

A change carries a predicted gain μ (a relative change of samples/s) and an uncertainty σ: the prior spread
of that kind of change on this kind of device (what one such change moved on the recorded H100 and CPU truth
surfaces and the pair surfaces), wider where the change addresses the bound the trace shows, and never wider
than what the trace's evidence lets it take back (a loader wait of 1 % of the step can give at most about
+1 %, whatever a worker count gives elsewhere). Its worth is E[max(0, X)] for X ~ N(μ, σ²) =
μ·Φ(μ/σ) + σ·φ(μ/σ): a change priced at +0 % is still worth a trial where its spread is wide, and a share of
the step too small to reach any gain is worth as little as it is. Pure functions, torch-free.
"""

from __future__ import annotations

import math

from advisor.knobs import KNOBS


def spreads(accelerator: bool) -> dict[str, float]:
    """σ of each knob's change that declares one (`Knob.spread`), by the change's id: its advice, or what it is
    proposed as."""
    column = 0 if accelerator else 1
    return {k.advice or k.proposed_as: k.spread[column] for k in KNOBS
            if (k.advice or k.proposed_as) and k.spread[column] is not None}


# σ of a change's relative change of samples/s before a session measured any of its kind. Wide where one change
# can double the step (workers, pinned copies beside a fed loader, AMP off the Tensor Cores), narrow where it
# moves a few percent. Each knob declares its own (`Knob.spread`); CUDA graphs are no knob's.
SPREAD_GPU = {"cuda-graphs": 0.15, **spreads(True)}
SPREAD_CPU = spreads(False)
DEFAULT_SPREAD = 0.10
EVIDENCE = 1.5  # a change that addresses the bound the trace shows: the trace says there is room, its spread wider


def expected_improvement(mu: float, sigma: float) -> float:
    """E[max(0, X)] for X ~ N(mu, sigma²); mu itself (at least 0) where sigma is 0."""
    if sigma <= 0:
        return max(0.0, mu)
    z = mu / sigma
    return mu * 0.5 * (1 + math.erf(z / math.sqrt(2))) + sigma * math.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def samples_gain(step_share: float | None) -> float | None:
    """A share of step time saved as the change in samples/s it means (saving 79% of the step is ×4.8,
    +376%): the unit a measured gain has, so that prediction and measurement read side by side."""
    if step_share is None or not step_share < 1:
        return None
    return 1 / (1 - step_share) - 1


def kinds(recommendation: str | None) -> list[str]:
    """The kinds of change a recommendation makes: one, or each of a pair's ("amp+pin-memory")."""
    return [k for k in str(recommendation or "").split("+") if k]


def prior_spread(recommendation: str | None, accelerator: bool) -> float:
    """σ of a change of this kind before anything was measured (a pair's: the root sum of its moves')."""
    table = SPREAD_GPU if accelerator else SPREAD_CPU
    return math.sqrt(sum(table.get(k, DEFAULT_SPREAD) ** 2 for k in kinds(recommendation)) or DEFAULT_SPREAD ** 2)


def ceiling(recoverable: float | None) -> float | None:
    """The most a change can gain (samples/s) where the trace names the share of the step it takes back (the
    loader wait, for more workers); None where it names none (AMP, a larger batch, pinned copies)."""
    return samples_gain(min(max(recoverable, 0.0), 1 - 1e-3)) if recoverable is not None else None


def worth(predicted_share: float, sigma: float, recoverable: float | None = None, shift: float = 0.0) -> float:
    """The expected improvement of a change predicted to save `predicted_share` of the step, moved by `shift`
    (what the session learnt of the model's error on such changes), with spread `sigma`, never wider than what
    its evidence can take back (`recoverable`, a share of the step)."""
    top = ceiling(recoverable)
    if top is not None:
        sigma = min(sigma, top)
    return expected_improvement(samples_gain(min(predicted_share, 1 - 1e-3)) + shift, sigma)

"""A Recommendation: one change to make, with its evidence, predicted gain and the bound it addresses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from advisor.knobs import advised_by, proposed_knobs


@dataclass(frozen=True)
class Recommendation:
    """One change to make, why (evidence), what it should gain, the bound it addresses, and the code."""

    id: str
    title: str
    knobs: dict  # the Knobs fields this changes, e.g. {"amp": "bf16"}; empty for code-only advice
    predicted_gain: float  # step time it saves, as a share of today's step (once its bound binds, if not now)
    evidence: tuple[str, ...]
    code_change: str
    caveat: str = ""
    details: dict = field(default_factory=dict)
    bound: str = field(kw_only=True)  # the key of BOUNDS this addresses
    helps_now: bool = field(default=True, kw_only=True)  # its bound is the diagnosis's (or that is unknown)
    helps_once: str = field(default="", kw_only=True)  # when not now: the bound to fix first, as BOUNDS names it
    # The share of today's step the evidence says the change can take back at most (the loader wait, for more
    # workers); None where no share bounds it (AMP, a larger batch; pinned copies, which can pay beyond theirs).
    recoverable: float | None = field(default=None, kw_only=True)
    worth: float = field(default=0.0, kw_only=True)  # its expected improvement of samples/s (`analysis.worth`)


def tried(d: Any, knob: str) -> bool:
    """Whether the trial behind this diagnosis's trace already ran with the knob on."""
    return bool(((d.trial or {}).get("knobs") or {}).get(knob))


def tried_advice(d: Any, advice: str) -> bool:
    """Whether the trial behind this trace already ran with a knob this advice turns on (`advisor.knobs`: those
    it advises, and those proposed as it)."""
    return any(tried(d, knob) for knob in {**advised_by(advice), **proposed_knobs(advice)})


def pct(x: float) -> str:
    """A share as evidence reads it: '12.3%'."""
    return f"{100 * x:.1f}%"


def ms(us: float) -> str:
    """Microseconds as evidence reads them: '1.23 ms'."""
    return f"{us / 1000:.2f} ms"

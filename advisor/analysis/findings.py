"""A fact worth telling about a trace, beside its figures (a queue that ran dry, events left out)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """A fact worth telling, with the figures behind it."""

    code: str
    message: str
    value: float | None = None

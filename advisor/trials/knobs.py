"""`Knobs`: the settings a trial can change. A value of the parent side: the CLI, the session and the
notebook build and record them without torch.

Its fields are the registry's knobs (`advisor.knobs`: one module a knob, where each says what it takes, how it
reads and where the trial applies it), in the registry's order; their values are checked by each knob.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from advisor.knobs import BY_NAME, KNOBS
# A knob's outcome in a trial, read wherever trials record it.
from advisor.knobs.knob import APPLIED, not_applicable  # noqa: F401


class KnobValues:
    """What `Knobs` does beyond holding its fields (the fields come from the registry)."""

    def __post_init__(self) -> None:
        problem = knobs_problem(self)
        if problem:
            raise ValueError(problem)

    def requested(self) -> dict[str, Any]:
        """The knobs this trial changes (those not None)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        """All fields, JSON-ready."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Knobs":
        """Inverse of `to_dict`; unknown keys are an error naming the key."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown knob {unknown[0]!r} (known: {', '.join(sorted(names))})")
        return cls(**data)

    def label(self) -> str:
        """A short name for folders and output, e.g. `amp-bf16+num_workers-2`, or `baseline`."""
        return "+".join(BY_NAME[k].label(v) for k, v in self.requested().items()) or "baseline"


# Settings for one trial; `None` everywhere means "leave the user's value". A frozen dataclass with a field a
# knob, each `None` by default.
Knobs = dataclasses.make_dataclass(
    "Knobs", [(k.name, Any, dataclasses.field(default=None)) for k in KNOBS], bases=(KnobValues,), frozen=True,
    namespace={"__doc__": "Settings for one trial; `None` everywhere means \"leave the user's value\".",
               "__module__": __name__})


def knobs_problem(knobs: Any) -> str | None:
    """Why these values are invalid (one line), or None."""
    for knob in KNOBS:
        problem = knob.problem(getattr(knobs, knob.name))
        if problem:
            return problem
    return None


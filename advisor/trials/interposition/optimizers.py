"""How the trial builds the script's torch.optim optimizers for a knob (`Knob.on_optimizer`): `fused_optimizer`'s
`FusedOptimizers`, built with `fused=True` (one kernel for the whole update), or `foreach=True` (a few kernels over
tensor lists) where fused is not offered for the class or the parameters' device. Names no knob: each is given
its knob's name and value. Inside the trial only (torch imported lazily).

Applied where the optimizer is built: the constructors of torch.optim's classes are wrapped for the trial,
so the script's own `torch.optim.AdamW(model.parameters(), lr=...)` builds the fused one. A constructor
that refuses fused (parameters on a device without fused kernels, a differentiable optimizer) is built
again with foreach, then as the script asked; the parameters are listed once first, so a generator
such as `model.parameters()` is not used up by the first attempt. An optimizer built before the trial
(a notebook's) is not rebuilt: not applicable, and said so.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any

from advisor.knobs import KNOBS
from advisor.trials.knobs import APPLIED, Knobs, not_applicable
from advisor.knobs.in_trial import declared_class, patched_attribute
from advisor.trials.interposition.loaders import user_site


def optimizer_changes(knobs: Knobs) -> list[Any]:
    """What builds the script's optimizers for each knob that says how (`Knob.on_optimizer`), in the registry's order:
    given its name and this trial's value, installed in every trial."""
    return [declared_class(k.on_optimizer)(k.name, getattr(knobs, k.name)) for k in KNOBS if k.on_optimizer]


def optimizer_classes() -> list[type]:
    """torch.optim's optimizer classes whose constructor takes `fused` or `foreach`."""
    import torch

    found = []
    for value in vars(torch.optim).values():
        if isinstance(value, type) and issubclass(value, torch.optim.Optimizer) and value is not torch.optim.Optimizer:
            names = inspect.signature(value.__init__).parameters
            if "fused" in names or "foreach" in names:
                found.append(value)
    return found


class FusedOptimizers:
    """Builds the script's torch.optim optimizers fused (else foreach) for the trial; records what it did."""

    def __init__(self, knob: str, value: bool | None):
        self.knob = knob  # its outcome and the script's own value are keyed by it
        self.requested = bool(value)
        self.built: list[dict[str, Any]] = []  # per optimizer: class, the user's fused/foreach, what ran
        self.stack = contextlib.ExitStack()
        self.depth = 0

    def install(self) -> None:
        """Wrap the constructors for the rest of the trial (also when not requested: the script's own
        `fused=True` is recorded in every trial)."""
        for cls in optimizer_classes():
            if "__init__" in vars(cls):
                self.stack.enter_context(patched_attribute(cls, "__init__", self._constructor(cls.__init__)))

    def undo(self) -> None:
        """Put the constructors back."""
        self.stack.close()

    def _constructor(self, original: Any) -> Any:
        names = inspect.signature(original).parameters
        interposition = self

        @functools.wraps(original)
        def __init__(optimizer, params, *args, **kwargs):
            # A subclass's constructor calling its base's (AdamW → Adam) passes fused on: the outermost decides.
            if interposition.depth:
                return original(optimizer, params, *args, **kwargs)
            interposition.depth += 1
            try:
                return interposition._build(original, names, optimizer, params, args, kwargs)
            finally:
                interposition.depth -= 1

        return __init__

    def _build(self, original: Any, names: Any, optimizer: Any, params: Any, args: tuple, kwargs: dict) -> None:
        user = {"fused": kwargs.get("fused"), "foreach": kwargs.get("foreach")}
        entry = {"class": type(optimizer).__name__, "user": user, "ran": None, "why": None, "site": user_site()}
        self.built.append(entry)
        if not self.requested:
            return original(optimizer, params, *args, **kwargs)
        params = list(params)
        if user["fused"]:
            entry["ran"] = "fused"
            entry["why"] = "the script builds it fused already"
            return original(optimizer, params, *args, **kwargs)
        attempts = []
        if "fused" in names:
            attempts.append(("fused", {**kwargs, "fused": True, "foreach": None}))
        if "foreach" in names and not user["foreach"]:
            attempts.append(("foreach", {**{k: v for k, v in kwargs.items() if k != "fused"}, "foreach": True}))
        refusals = []
        for name, attempt in attempts:
            try:
                original(optimizer, params, *args, **attempt)
            except (RuntimeError, ValueError, TypeError) as exc:
                refusals.append(f"{name}: {(str(exc).strip().splitlines() or [''])[0][:160]}")
                continue
            entry["ran"] = name
            return None
        entry["why"] = "; ".join(refusals) or "the script already builds it with foreach=True"
        return original(optimizer, params, *args, **kwargs)

    def outcomes(self) -> dict[str, str]:
        """The knob's outcome where it was requested: `applied` when an optimizer was built fused or foreach for the
        trial; else why not."""
        if not self.requested:
            return {}
        if any(e["ran"] and e["why"] is None for e in self.built):
            return {self.knob: APPLIED}
        if not self.built:
            return {self.knob: not_applicable("no torch.optim optimizer was built in the trial (one built before it, "
                                              "or another library's, is not rebuilt)")}
        return {self.knob: not_applicable(f"{self.built[0]['class']}: {self.built[0]['why']}")}

    def user_values(self) -> dict[str, bool]:
        """Whether the script builds its (first) optimizer fused itself, by the knob; empty where it built none."""
        return {self.knob: bool(self.built[0]["user"]["fused"])} if self.built else {}

    def record(self) -> list[dict[str, Any]] | None:
        """Per optimizer built: its class, the script's fused/foreach and which implementation ran."""
        return [{k: e[k] for k in ("class", "user", "ran", "site")} for e in self.built] or None

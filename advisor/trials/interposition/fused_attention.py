"""The `sdpa` knob: attention written by hand runs as `F.scaled_dot_product_attention`. Inside the trial only
(torch imported lazily).

At the model's first call (`advisor.trials.interposition.model`), each class of its modules whose `forward`
is the user's (not torch's: `nn.MultiheadAttention` already calls the fused kernels) has its source read for
*where* a hand-written attention is (`advisor.trials.interposition.attention_source`). Whether the fused call
computes the same is decided on the real batch (`advisor.trials.interposition.attention_check`): the scale
and the mask are read as numbers, and the forward with the call is compared with the original on the same
input. Where they agree, the class's `forward` is compiled again from its source with those lines replaced
(under the file's name and its line numbers, in the module's own globals), and the rewrite is recorded (file,
lines, the statements) for the patch; else the reason, with the number that decided it. `undo()` puts the
forwards back.
"""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path
from typing import Any

from advisor.trials.interposition.attention_check import capture_inputs, check, compiled, rewritten_lines
from advisor.trials.interposition.attention_source import Refusal, find_attention
from advisor.knobs.in_trial import ModelChange
from advisor.trials.knobs import APPLIED, not_applicable

NONE_FOUND = ("no attention written by hand (q @ k.transpose, softmax, @ v) in the forward of the model's modules; "
              "nn.MultiheadAttention and scaled_dot_product_attention calls are fused already")


def user_forward(cls: type) -> tuple[type, Any] | None:
    """(the class that defines it, the function) of the forward a module class runs, when it is the user's."""
    owner = next((c for c in cls.__mro__ if "forward" in c.__dict__), None)
    if owner is None or owner.__module__.split(".")[0] in ("torch", "torchvision", "transformers", "timm"):
        return None
    return owner, owner.__dict__["forward"]


def functional_name(namespace: dict) -> str | None:
    """How the forward's module reaches torch.nn.functional: `F`, `nn.functional` or `torch.nn.functional`."""
    import torch

    for name, value in namespace.items():
        if value is torch.nn.functional:
            return name
    for name, value in namespace.items():
        if value is torch.nn:
            return f"{name}.functional"
    for name, value in namespace.items():
        if value is torch:
            return f"{name}.nn.functional"
    return None


class FusedAttention:
    """Rewrites the forwards of the model's attention modules where the numbers agree; outcome, record, undo."""

    MAX_CHECKED = 4  # instances of a class checked on their input (each a forward of the module, twice)

    def __init__(self) -> None:
        self.rewritten: dict[type, Any] = {}  # class -> its own forward, to put back
        self.refused: list[str] = []
        self.plans: list[dict[str, Any]] = []  # what the patch writes: file, class, lines, statement
        self.found: list[dict[str, Any]] = []  # every candidate: class, file, line, rewritable, why not
        self.seen: set[type] = set()

    def apply(self, model: Any, args: tuple | None = None) -> None:
        """Rewrite each attention class among `model`'s modules (once per class) where, on `args` (the model's
        first call), the fused call computes what the forward does."""
        instances: dict[type, list[Any]] = {}
        for module in model.modules():
            found = user_forward(type(module))
            if found is not None and found[0] not in self.seen:
                instances.setdefault(found[0], []).append(module)
        candidates = {}
        for owner, modules in instances.items():
            self.seen.add(owner)
            found = self.candidate(owner)
            if isinstance(found, str):
                self.refuse(owner, found)
            elif found is not None:
                candidates[owner] = (found, modules)
        if not candidates:
            return
        modules = [m for _, ms in candidates.values() for m in ms[: self.MAX_CHECKED]]
        inputs = capture_inputs(model, args, modules) if args is not None else \
            "no input of the model's to check the rewrite on"
        for owner, (found, modules) in candidates.items():
            why = inputs if isinstance(inputs, str) else self.rewrite(owner, found, [
                (m, inputs[id(m)]) for m in modules[: self.MAX_CHECKED] if id(m) in inputs])
            if why:
                self.refuse(owner, why)

    def refuse(self, owner: type, why: str) -> None:
        """Record why `owner`'s attention stays as written."""
        self.refused.append(f"{owner.__name__}.forward: {why}")
        self.found.append({"class": owner.__name__, "rewritable": False, "why": why})

    def candidate(self, owner: type) -> tuple | str | None:
        """(the forward, its source, file, first line, the candidate, how it reaches F) of `owner`, the reason
        where its attention cannot be replaced, None where it has none (or no source of the user's)."""
        forward = owner.__dict__["forward"]
        try:
            lines, start = inspect.getsourcelines(forward)
            filename = inspect.getsourcefile(forward)
        except (OSError, TypeError):
            return None  # no source (a C extension, a REPL): nothing to read
        if filename is None or any(part in ("site-packages", "dist-packages") for part in Path(filename).parts):
            return None  # an installed package's module: not the user's code to rewrite (nor to patch)
        source = textwrap.dedent("".join(lines))
        if not source.lstrip().startswith("def ") or "__class__" in forward.__code__.co_freevars:
            return None  # decorated, or it uses super() (a cell the recompiled function would not have)
        found = find_attention(source)
        if found is None:
            return None
        if isinstance(found, Refusal):
            return f"{found.reason} ({filename}:{start + found.line - 1})"
        functional = functional_name(forward.__globals__)
        if functional is None:
            return f"{filename} imports neither torch nor torch.nn.functional under a name the call could use"
        return forward, source, filename, start, found, functional

    def rewrite(self, owner: type, found: tuple, inputs: list[tuple[Any, tuple]]) -> str | None:
        """Compile `owner.forward` again with its attention as one call where the check agrees; else why not."""
        import torch

        forward, source, filename, start, candidate, functional = found
        if not inputs:
            return "no instance of it ran in the model's first call: nothing to check the rewrite on"
        if candidate.dropout is not None and candidate.dropout[1] is not None and not all(
                isinstance(getattr(m, candidate.dropout[1], None), torch.nn.Dropout) for m, _ in inputs):
            return f"self.{candidate.dropout[1]} is not an nn.Dropout: its effect on the weights is not known"
        checked = check(forward, source, filename, start, candidate, functional, inputs)
        if isinstance(checked, str):
            return f"{checked} ({filename}:{start + candidate.first_line - 1})"
        replacement, form = checked
        owner.forward = compiled(forward, rewritten_lines(source, candidate, replacement), filename, start)
        self.rewritten[owner] = forward
        statement = "\n".join(replacement)
        self.plans.append({"file": filename, "class": owner.__name__,
                           "first_line": start + candidate.first_line - 1,
                           "last_line": start + candidate.last_line - 1, "statement": statement, "form": form})
        self.found.append({"class": owner.__name__, "rewritable": True, "why": form})
        return None

    def outcome(self) -> str:
        """Applied where a forward was rewritten, else why not."""
        if self.rewritten:
            return APPLIED
        return not_applicable("; ".join(self.refused) if self.refused else NONE_FOUND)

    def undo(self) -> None:
        """Put every rewritten class's own forward back."""
        for owner, forward in self.rewritten.items():
            owner.forward = forward
        self.rewritten = {}


class AttentionRewrite(ModelChange):
    """The `sdpa` knob's change of the model (`Knob.on_model`): its attention rewritten at its first call
    (`FusedAttention`); records what the patch writes (`attention_plan`) and every hand-written attention found,
    rewritable (the form read) or why not (`attention_modules`)."""

    record_fields = ("attention_plan", "attention_modules")

    def __init__(self) -> None:
        super().__init__()
        self.attention = FusedAttention()

    def apply(self, torch: Any, module: Any, args: tuple) -> None:
        self.attention.apply(module, args)
        self.user = False  # a forward the script wrote by hand: its own is not the fused call
        self.outcome = self.attention.outcome()

    def record(self) -> dict[str, Any]:
        return {"attention_plan": self.attention.plans, "attention_modules": self.attention.found}

    def undo(self, torch: Any) -> None:
        self.attention.undo()

"""The `sdpa` knob: attention written by hand runs as `F.scaled_dot_product_attention`. Inside the trial only
(torch imported lazily).

At the model's first call (`advisor.trials.interposition.model`), each class of its modules whose `forward`
is the user's (not torch's: `nn.MultiheadAttention` already calls the fused kernels) has its source read
and searched for the attention pattern (`advisor.trials.interposition.attention_source`); where one is found
and proven the same, the class's `forward` is compiled again from its source with those lines replaced by
the one call (an AST step, as the step wrapper's), under the file's name and its line numbers, in the
module's own globals. What the source alone cannot prove is checked on the live modules: the buffer a
causal mask is read from holds a triangle of ones, the dropout called on the weights is an `nn.Dropout`.
Each rewrite is recorded (file, lines, the statement) for the patch. `undo()` puts the forwards back.
"""

from __future__ import annotations

import __future__
import inspect
import textwrap
from pathlib import Path
from typing import Any

from advisor.trials.interposition.attention_source import Refusal, Rewrite, find_attention
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


def triangle_kind(buffer: Any) -> str | None:
    """"tril" for a lower triangle of ones (the positions that take part), "triu" for a strict upper one
    (those masked out), over the buffer's last two dimensions; else None."""
    import torch

    if not isinstance(buffer, torch.Tensor) or buffer.dim() < 2 or buffer.shape[-1] != buffer.shape[-2]:
        return None
    present = (buffer != 0).reshape(-1, *buffer.shape[-2:])
    n = buffer.shape[-1]
    lower = torch.ones(n, n, dtype=torch.bool, device=buffer.device).tril()
    if bool((present == lower).all()):
        return "tril"
    if bool((present == ~lower).all()):
        return "triu"
    return None


class FusedAttention:
    """Rewrites the forwards of the model's attention modules; their outcome, record and undo."""

    def __init__(self) -> None:
        self.rewritten: dict[type, Any] = {}  # class -> its own forward, to put back
        self.refused: list[str] = []
        self.plans: list[dict[str, Any]] = []  # what the patch writes: file, class, lines, statement
        self.seen: set[type] = set()

    def apply(self, model: Any) -> None:
        """Rewrite each attention class among `model`'s modules (once per class)."""
        instances: dict[type, list[Any]] = {}
        for module in model.modules():
            found = user_forward(type(module))
            if found is not None and found[0] not in self.seen:
                instances.setdefault(found[0], []).append(module)
        for owner, modules in instances.items():
            self.seen.add(owner)
            why = self.rewrite(owner, modules)
            if why:
                self.refused.append(f"{owner.__name__}.forward: {why}")

    def rewrite(self, owner: type, modules: list[Any]) -> str | None:
        """Compile `owner.forward` again with its attention as one call; the reason where it cannot be."""
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
        functional = functional_name(forward.__globals__)

        def buffer_kind(name: str) -> str | None:
            kinds = {triangle_kind(getattr(m, name, None)) for m in modules}
            return kinds.pop() if len(kinds) == 1 else None

        found = find_attention(source, buffer_kind, functional or "F")
        if found is None:
            return None
        if isinstance(found, Refusal):
            return f"{found.reason} ({filename}:{start + found.line - 1})"
        if functional is None:
            return f"{filename} imports neither torch nor torch.nn.functional under a name the call could use"
        if found.dropout is not None:
            import torch

            if not all(isinstance(getattr(m, found.dropout, None), torch.nn.Dropout) for m in modules):
                return f"self.{found.dropout} is not an nn.Dropout: its effect on the weights is not known"
        owner.forward = self.compiled(forward, source, found, filename, start)
        self.rewritten[owner] = forward
        self.plans.append({"file": filename, "class": owner.__name__, "first_line": start + found.first_line - 1,
                           "last_line": start + found.last_line - 1, "statement": found.statement,
                           "form": found.form})
        return None

    @staticmethod
    def compiled(forward: Any, source: str, found: Rewrite, filename: str, start: int) -> Any:
        """The forward made from `source` with the lines `found` names replaced by its statement."""
        lines = source.splitlines()
        first = lines[found.first_line - 1]
        indent = first[: len(first) - len(first.lstrip())]
        lines[found.first_line - 1: found.last_line] = [indent + found.statement] + \
            [""] * (found.last_line - found.first_line)  # blank lines keep the numbers of the lines after
        flags = forward.__code__.co_flags & __future__.annotations.compiler_flag  # as the file compiled it
        code = compile("\n" * (start - 1) + "\n".join(lines) + "\n", filename, "exec", flags, dont_inherit=True)
        namespace: dict[str, Any] = {}
        exec(code, forward.__globals__, namespace)  # the module's own globals: its names resolve as before
        new = namespace[forward.__name__]
        new.__qualname__, new.__doc__ = forward.__qualname__, forward.__doc__
        new.__defaults__, new.__kwdefaults__ = forward.__defaults__, forward.__kwdefaults__
        return new

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

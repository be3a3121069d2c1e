"""The knobs applied at the model's first call: those that change the model, each by its `ModelChange`
(`Knob.on_model`: `channels_last`, `compile`, `sdpa`, `checkpointing`), and the process-wide torch settings (`tf32`,
`cudnn_benchmark`). Names no knob: each is its module's. Inside the trial only (torch imported lazily).

They reach the model at its first call, through a global module forward pre-hook: the model exists by then
(whether the script has a step function or only a loop), and the optimizer has no state yet, so nothing
the first step made is left in the old layout. Each outermost module call of a module with parameters
(the model; a GAN's two models each) is the place:

- a knob's `ModelChange` (declared in its module, or where its module says it lives in the trial's code: the
  attention rewrite, `advisor.trials.interposition.fused_attention`; the checkpointed blocks,
  `advisor.trials.interposition.checkpointed_blocks`) changes the model at its first call, may change the
  arguments of each of its calls (channels_last's inputs), reads a step's error (a compile's), says what
  trial.json records (the compile's graphs, the attention plan, the checkpointed blocks, channels_last's inputs)
  and is undone. Those that rewrite the model come first, in the registry's order; a change marked
  `after_rewrites` (the compile) after them, which it must trace.
- the process-wide torch settings (a knob whose module declares a `TorchSetting`: `tf32`, `cudnn_benchmark`):
  set at the same moment over what the script set itself, by the knob's own module, which also says how the
  script's own setting reads; on the CPU there is neither TF32 nor cuDNN: not applicable.

`undo()` takes every change back (in-process trials run in the user's own notebook).
"""

from __future__ import annotations

import contextlib
from typing import Any

from advisor.knobs import KNOBS, TORCH_SETTINGS, applied_at
from advisor.knobs.knob import AT_FIRST_CALL
from advisor.knobs.in_trial import ModelChange, declared_class
from advisor.trials.knobs import APPLIED, Knobs, not_applicable

# The knobs this interposition applies at the model's first call (not knobs.MODEL_KNOBS: the fused optimizer is
# applied where the optimizer is built; checkpointing, a memory knob, is applied here).
FIRST_CALL_KNOBS = applied_at(AT_FIRST_CALL)


# Each changes the model by its `ModelChange`, in the registry's order (those after the rewrites last).
CHANGES: dict[str, type[ModelChange]] = {k.name: declared_class(k.on_model) for k in KNOBS if k.on_model}


def compiled_graphs() -> int | None:
    """How many graphs dynamo has compiled in this process so far (its own counter); None if unreadable."""
    try:
        from torch._dynamo.utils import counters

        return int(counters.get("stats", {}).get("unique_graphs", 0))
    except Exception:  # a figure we could not take must not fail the step
        return None


def records_of(model: "ModelInterposition | None") -> dict[str, Any]:
    """The trial.json fields the model's changes fill (`ModelChange.record_field`), null where none ran."""
    out: dict[str, Any] = {field: None for change in CHANGES.values() for field in change.record_fields}
    for change in model.changes.values() if model is not None else ():
        out.update(change.record())
    return out


class ModelInterposition:
    """The knobs' changes of the model (their `ModelChange`) and the torch settings, applied at the model's first
    call."""

    def __init__(self, knobs: Knobs, device_type: str):
        self.knobs = knobs
        self.device_type = device_type
        self.outcomes: dict[str, str] = {}
        self.user: dict[str, Any] = {}  # the script's own values, for "from X to Y"
        self.seen: set[int] = set()  # modules already given the knobs
        self.depth = 0
        self.changes = {name: change() for name, change in CHANGES.items() if getattr(knobs, name)}
        self.undo_stack = contextlib.ExitStack()
        self.requested = any(getattr(knobs, name) for name in FIRST_CALL_KNOBS)
        if self.requested and device_type != "cuda":
            for knob in TORCH_SETTINGS:
                if getattr(knobs, knob.name):
                    self.outcomes[knob.name] = not_applicable(knob.setting.off_cuda)

    def install(self) -> None:
        """Interpose for the trial: a global forward pre-hook (and post-hook, for the call depth)."""
        if not self.requested:
            return
        from torch.nn.modules import module as module_hooks

        pre = module_hooks.register_module_forward_pre_hook(self._forward_starts)
        post = module_hooks.register_module_forward_hook(self._forward_ends, always_call=True)
        self.undo_stack.callback(pre.remove)
        self.undo_stack.callback(post.remove)

    # --- at the model's first call -------------------------------------------------------------------

    def _forward_starts(self, module: Any, args: tuple) -> Any:
        import torch

        if torch.compiler.is_compiling():
            return None  # traced into a compiled forward: the hooks ran where the model was called
        self.depth += 1
        if self.depth > 1:
            return None
        key = id(module)
        if key not in self.seen and next(module.parameters(), None) is not None:
            self.seen.add(key)
            self._first_call(module, args)
        changed = None
        for change in self.changes.values():  # channels_last's inputs
            changed = change.call(torch, module, args if changed is None else changed) or changed
        return changed

    def _forward_ends(self, module: Any, args: Any, output: Any) -> None:
        import torch

        if torch.compiler.is_compiling():
            return
        self.depth = max(0, self.depth - 1)

    def _first_call(self, module: Any, args: tuple = ()) -> None:
        import torch

        if len(self.seen) == 1:
            self._process_wide()
        # The model's own rewrites (its layout, attention, checkpointed blocks) first: a compile traces them.
        for change in sorted(self.changes.values(), key=lambda c: c.after_rewrites):
            change.apply(torch, module, args)

    def _process_wide(self) -> None:
        import torch

        if self.device_type != "cuda":
            return
        for knob in TORCH_SETTINGS:  # tf32, cudnn.benchmark: each knob's module sets and puts back its own
            if getattr(self.knobs, knob.name):
                self.user[knob.name] = knob.setting.own(torch) is not None
                why = knob.setting.apply(torch, self.undo_stack)
                self.outcomes[knob.name] = APPLIED if why is None else not_applicable(why)

    # --- after the steps ------------------------------------------------------------------------------

    def outcomes_after_steps(self) -> dict[str, str]:
        """Every requested knob's outcome: those no model call ever reached say so."""
        out = {**self.outcomes, **{name: c.outcome for name, c in self.changes.items() if c.outcome is not None}}
        for name in FIRST_CALL_KNOBS:
            if getattr(self.knobs, name) and name not in out:
                out[name] = not_applicable("no module with parameters was called in the steps")
        return out

    def user_values(self) -> dict[str, Any]:
        """The script's own values of the knobs the trial changed on the model."""
        return {**self.user, **{name: c.user for name, c in self.changes.items() if c.user is not None}}

    def failed(self, exc: BaseException) -> None:
        """A step raised: a change's own error (a compile's, compiling the backward) is its outcome."""
        for change in self.changes.values():
            change.failed(exc)

    def undo(self) -> None:
        """Take every change back: hooks, forwards, layouts (an in-process trial's model is the user's)."""
        import torch

        self.undo_stack.close()
        for change in self.changes.values():
            change.undo(torch)

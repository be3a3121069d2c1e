"""The knobs that change the model and how torch runs it: `channels_last`, `compile` (each by its module's
`ModelChange`), `sdpa`
(`advisor.trials.interposition.fused_attention`), and the process-wide torch settings (`tf32`, `cudnn_benchmark`).
Inside the trial only (torch imported lazily).

They reach the model at its first call, through a global module forward pre-hook: the model exists by then
(whether the script has a step function or only a loop), and the optimizer has no state yet, so nothing
the first step made is left in the old layout. Each outermost module call of a module with parameters
(the model; a GAN's two models each) is the place:

- a knob whose module declares a `ModelChange` (`Knob.on_model`) changes the model by it, at its first call, at
  each of its calls, when a step raises, and after the steps (what trial.json records; the undo):
  `channels_last` (the module's parameters in `torch.channels_last` in place, and every 4-D floating-point input
  made channels_last before its forward; a model without 2-D convolutions: not applicable, and said so) and
  `compile` (the module's forward becomes `torch.compile(forward)` from its next call on; the compile runs in the
  first steps, before any measured window, and its cost is the trial's `compile_s`; graph breaks and graphs are
  counted from dynamo's own counters; a compile that fails puts the eager forward back and the trial goes on:
  not applicable, with the reason). A change marked `after_rewrites` (the compile) comes after the attention and
  the checkpointed blocks below, which it must trace.
- the process-wide torch settings (a knob whose module declares a `TorchSetting`: `tf32`, `cudnn_benchmark`):
  set at the same moment over what the script set itself, by the knob's own module, which also says how the
  script's own setting reads; on the CPU there is neither TF32 nor cuDNN: not applicable.

- `checkpointing`: the model's repeated blocks run under activation checkpointing
  (`advisor.trials.interposition.checkpointed_blocks`); a model that repeats none: not applicable, and said so.

`undo()` takes every change back (in-process trials run in the user's own notebook).
"""

from __future__ import annotations

import contextlib
from typing import Any

from advisor.trials.interposition.fused_attention import FusedAttention
from advisor.trials.interposition.checkpointed_blocks import CheckpointBlocks
from advisor.knobs import KNOBS, TORCH_SETTINGS, applied_at
from advisor.knobs.knob import AT_FIRST_CALL
from advisor.trials.knobs import APPLIED, Knobs, not_applicable

# The knobs this interposition applies at the model's first call (not knobs.MODEL_KNOBS: the fused optimizer is
# applied where the optimizer is built; checkpointing, a memory knob, is applied here).
FIRST_CALL_KNOBS = applied_at(AT_FIRST_CALL)
CHANGING = tuple(k for k in KNOBS if k.on_model)  # each changes the model by its module's `ModelChange`


def compiled_graphs() -> int | None:
    """How many graphs dynamo has compiled in this process so far (its own counter); None if unreadable."""
    try:
        from torch._dynamo.utils import counters

        return int(counters.get("stats", {}).get("unique_graphs", 0))
    except Exception:  # a figure we could not take must not fail the step
        return None


def records_of(model: "ModelInterposition | None") -> dict[str, Any]:
    """The trial.json fields the model's changes fill (`ModelChange.record_field`), null where none ran."""
    out: dict[str, Any] = {k.on_model.record_field: None for k in CHANGING if k.on_model.record_field}
    if model is not None:
        out.update({c.record_field: c.record() for c in model.changes.values() if c.record_field})
    return out


class ModelInterposition:
    """The knobs' changes of the model (their `ModelChange`: channels_last, compile), sdpa, checkpointing and the
    torch settings, applied at the model's first call."""

    def __init__(self, knobs: Knobs, device_type: str):
        self.knobs = knobs
        self.device_type = device_type
        self.outcomes: dict[str, str] = {}
        self.user: dict[str, Any] = {}  # the script's own values, for "from X to Y"
        self.seen: set[int] = set()  # modules already given the knobs
        self.depth = 0
        self.changes = {k.name: k.on_model() for k in CHANGING if getattr(knobs, k.name)}
        self.attention = FusedAttention()  # sdpa: the attention forwards rewritten
        self.checkpoints = CheckpointBlocks()
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
        for change in self.changes.values():
            if not change.after_rewrites:
                change.apply(torch, module, args)
        if self.knobs.sdpa:  # before compile: the compiled forward traces the fused call
            self.attention.apply(module, args)
            self.user["sdpa"] = False
            self.outcomes["sdpa"] = self.attention.outcome()
        if self.knobs.checkpointing:  # before compile: the compiled forward traces the checkpointed blocks
            self.checkpoints.apply(module)
            self.outcomes["checkpointing"] = self.checkpoints.outcome
        for change in self.changes.values():
            if change.after_rewrites:
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

    def attention_record(self) -> tuple[Any, Any]:
        """With the sdpa knob: the attentions rewritten (their plans), and every hand-written attention the check
        found, rewritable (the form read) or why not (the number); (None, None) without it."""
        return (self.attention.plans, self.attention.found) if self.knobs.sdpa else (None, None)

    def undo(self) -> None:
        """Take every change back: hooks, forwards, layouts (an in-process trial's model is the user's)."""
        import torch

        self.undo_stack.close()
        self.attention.undo()
        self.checkpoints.undo()
        for change in self.changes.values():
            change.undo(torch)

"""The knobs that change the model and how torch runs it: `channels_last`, `compile`, `sdpa`
(`advisor.trials.interposition.fused_attention`), and the process-wide torch settings (`tf32`, `cudnn_benchmark`).
Inside the trial only (torch imported lazily).

They reach the model at its first call, through a global module forward pre-hook: the model exists by then
(whether the script has a step function or only a loop), and the optimizer has no state yet, so nothing
the first step made is left in the old layout. Each outermost module call of a module with parameters
(the model; a GAN's two models each) is the place:

- `channels_last`: the module's parameters move to `torch.channels_last` in place (the optimizer keeps the
  same Parameter objects), and every 4-D floating-point tensor it is called with is made channels_last
  before its forward, as a user writes `x.to(device, memory_format=torch.channels_last)`. A model without
  2-D convolutions: not applicable, and said so. How, and when not, is the knob's module's
  (`advisor.knobs.channels_last`).
- `compile`: the module's forward becomes `torch.compile(forward)` from its next call on. The compile runs
  in the first steps (before any measured window) and its cost is the trial's `compile_s`; graph breaks
  and graphs are counted from dynamo's own counters. A compile that fails (the backend is unavailable, the
  compiler refuses a construct) puts the eager forward back and the trial goes on: not applicable, with
  the reason.
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
from advisor.knobs import TORCH_SETTINGS, applied_at, channels_last
from advisor.knobs.knob import AT_FIRST_CALL
from advisor.trials.knobs import APPLIED, Knobs, not_applicable

# The knobs this interposition applies at the model's first call (not knobs.MODEL_KNOBS: the fused optimizer is
# applied where the optimizer is built; checkpointing, a memory knob, is applied here).
FIRST_CALL_KNOBS = applied_at(AT_FIRST_CALL)


def is_compile_error(exc: BaseException) -> bool:
    """An error raised by the compiler (dynamo, AOTAutograd, inductor), not by the user's code."""
    return any(type(e).__module__.startswith(("torch._dynamo", "torch._inductor", "torch._functorch"))
               for e in (exc, exc.__cause__, exc.__context__) if e is not None)


def compile_failure(exc: BaseException) -> str:
    """The not-applicable outcome of a compile that failed: its error, one line."""
    first = (str(exc).strip().splitlines() or [""])[0][:240]
    return not_applicable(f"torch.compile failed: {type(exc).__name__}: {first}".rstrip(": "))


def compiled_graphs() -> int | None:
    """How many graphs dynamo has compiled in this process so far (its own counter); None if unreadable."""
    try:
        from torch._dynamo.utils import counters

        return int(counters.get("stats", {}).get("unique_graphs", 0))
    except Exception:  # a figure we could not take must not fail the step
        return None


class ModelInterposition:
    """channels_last, compile, sdpa, checkpointing and the torch settings, applied at the model's first call."""

    def __init__(self, knobs: Knobs, device_type: str):
        self.knobs = knobs
        self.device_type = device_type
        self.outcomes: dict[str, str] = {}
        self.user: dict[str, Any] = {}  # the script's own values, for "from X to Y"
        self.seen: set[int] = set()  # modules already given the knobs
        self.depth = 0
        self.compiled: list[tuple[Any, bool, Any]] = []  # (module, had its own forward, that forward)
        self.layouts: list[Any] = []  # modules moved to channels_last
        # The positions of the 4-D floating-point inputs of the first call of a module moved to channels_last: those
        # the trial makes channels_last, and the patch writes it for (`channels_last_inputs` of trial.json).
        self.layout_inputs: list[int] | None = None
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
        if self.knobs.channels_last and any(m is module for m in self.layouts):
            if self.layout_inputs is None:
                self.layout_inputs = channels_last.image_positions(torch, args)
            return channels_last.inputs(torch, args)
        return None

    def _forward_ends(self, module: Any, args: Any, output: Any) -> None:
        import torch

        if torch.compiler.is_compiling():
            return
        self.depth = max(0, self.depth - 1)

    def _first_call(self, module: Any, args: tuple = ()) -> None:
        if len(self.seen) == 1:
            self._process_wide()
        if self.knobs.channels_last:
            self._channels_last(module)
        if self.knobs.sdpa:  # before compile: the compiled forward traces the fused call
            self.attention.apply(module, args)
            self.user["sdpa"] = False
            self.outcomes["sdpa"] = self.attention.outcome()
        if self.knobs.checkpointing:  # before compile: the compiled forward traces the checkpointed blocks
            self.checkpoints.apply(module)
            self.outcomes["checkpointing"] = self.checkpoints.outcome
        if self.knobs.compile:
            self._compile(module)

    def _process_wide(self) -> None:
        import torch

        if self.device_type != "cuda":
            return
        for knob in TORCH_SETTINGS:  # tf32, cudnn.benchmark: each knob's module sets and puts back its own
            if getattr(self.knobs, knob.name):
                self.user[knob.name] = knob.setting.own(torch) is not None
                why = knob.setting.apply(torch, self.undo_stack)
                self.outcomes[knob.name] = APPLIED if why is None else not_applicable(why)

    def _channels_last(self, module: Any) -> None:
        import torch

        why = channels_last.not_for(torch, module)
        if why is not None:
            self.outcomes.setdefault("channels_last", not_applicable(why))
            return
        self.user["channels_last"] = channels_last.apply(torch, module)
        self.layouts.append(module)
        self.outcomes["channels_last"] = APPLIED

    def _compile(self, module: Any) -> None:
        import torch

        self.user["compile"] = type(module).__name__ == "OptimizedModule" or \
            getattr(module, "_compiled_call_impl", None) is not None
        own = "forward" in module.__dict__
        previous = module.__dict__.get("forward")
        eager = module.forward
        try:
            compiled = torch.compile(eager)
        except Exception as exc:  # e.g. dynamo does not support this Python
            self.outcomes["compile"] = compile_failure(exc)
            return
        interposition = self

        def forward(*args, **kwargs):
            if "compile" in interposition.outcomes and interposition.outcomes["compile"] != APPLIED:
                return eager(*args, **kwargs)
            try:
                return compiled(*args, **kwargs)
            except Exception as exc:
                if not is_compile_error(exc):
                    raise
                interposition.outcomes["compile"] = compile_failure(exc)
                return eager(*args, **kwargs)  # the trial goes on without the compiler

        module.forward = forward
        self.compiled.append((module, own, previous))
        self.outcomes.setdefault("compile", APPLIED)

    # --- after the steps ------------------------------------------------------------------------------

    def outcomes_after_steps(self) -> dict[str, str]:
        """Every requested knob's outcome: those no model call ever reached say so."""
        out = dict(self.outcomes)
        for name in FIRST_CALL_KNOBS:
            if getattr(self.knobs, name) and name not in out:
                out[name] = not_applicable("no module with parameters was called in the steps")
        return out

    def failed(self, exc: BaseException) -> None:
        """A step raised: a compile error there (compiling the backward) is the compile's outcome."""
        if self.knobs.compile and is_compile_error(exc):
            self.outcomes["compile"] = compile_failure(exc)

    def attention_record(self) -> tuple[Any, Any]:
        """With the sdpa knob: the attentions rewritten (their plans), and every hand-written attention the check
        found, rewritable (the form read) or why not (the number); (None, None) without it."""
        return (self.attention.plans, self.attention.found) if self.knobs.sdpa else (None, None)

    def compile_record(self) -> dict[str, Any] | None:
        """What the compiler did: graphs, graph breaks and their most frequent reasons (dynamo's counters)."""
        if not self.knobs.compile or not self.compiled or self.outcomes.get("compile") != APPLIED:
            return None
        from torch._dynamo.utils import counters

        breaks = counters.get("graph_break", {})
        return {"graphs": int(counters.get("stats", {}).get("unique_graphs", 0)),
                "graph_breaks": int(sum(breaks.values())),
                "break_reasons": [reason.splitlines()[0][:200] for reason, _ in
                                  sorted(breaks.items(), key=lambda kv: -kv[1])[:3]]}

    def undo(self) -> None:
        """Take every change back: hooks, forwards, layouts (an in-process trial's model is the user's)."""
        import torch

        self.undo_stack.close()
        self.attention.undo()
        self.checkpoints.undo()
        for module, own, forward in self.compiled:
            if own:
                module.forward = forward
            else:
                module.__dict__.pop("forward", None)
        for module in self.layouts:
            channels_last.undo(torch, module)
        self.compiled, self.layouts = [], []

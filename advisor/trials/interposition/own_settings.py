"""The script's own settings of the knobs, read from the running trial: what was in effect when its model
ran, not only what its source says. Inside the trial only (torch imported lazily).

Read in every trial, whatever its knobs, so the baseline records them:

- `amp`: an autocast the script entered itself (`torch.autocast`, `torch.amp.autocast`,
  `torch.cuda.amp.autocast`, a framework's: accelerate's `mixed_precision`, Lightning's `precision`, the
  Trainer's `bf16`/`fp16`), enabled while a module with parameters runs with gradients on (a training
  forward; an evaluation under `no_grad` does not count). The advisor's own autocast is entered from its
  code and is never taken for the script's.
- `fused_optimizer`: a torch.optim optimizer built with `fused=True` (`FusedOptimizers` sees every build).
- `compile`, `channels_last` and the process-wide torch settings (`tf32`, `cudnn_benchmark`: each knob's
  module says how its own reads): at the first call of the model, whether it is compiled already
  (`torch.compile(model)`, `model.compile()`), its convolutions are in channels_last, and the process-wide
  flags are set.
- `accumulation_steps`: backward passes per optimizer step, where the script accumulates gradients itself.

Each is recorded with where the script sets it (`file.py:LINE`, the nearest frame of the user's code)
where one can be told, and a phrase for the baseline row ("bf16 autocast").
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from typing import Any

from advisor.knobs import TORCH_SETTINGS
from advisor.knobs.knob import patched_attribute
from advisor.trials.interposition.loaders import INSTALLED, user_site
from advisor.trials.knobs import Knobs

ACCUMULATION_STEPS_SEEN = 3  # optimizer steps whose backward counts must agree to call it accumulation
ADVISOR_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}


def autocast_owner() -> str | None:
    """Who enters the autocast being entered: "advisor" (the `amp` knob's own), an installed package's name
    (accelerate, lightning: a framework's precision setting), or None (the script's own code). The first
    frame above `__enter__` that is neither torch's, contextlib's nor this module's tells."""
    import torch

    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    skipped = (os.path.abspath(__file__), os.path.abspath(contextlib.__file__))
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path not in skipped and not path.startswith(torch_dir):
            if path.startswith(ADVISOR_DIR):
                return "advisor"
            installed = next((d for d in INSTALLED if path.startswith(d)), None)
            return path[len(installed):].split(os.sep)[0] if installed else None
        frame = frame.f_back
    return None


def own_setting(value: Any, what: str, site: str | None) -> dict[str, Any]:
    """One recorded setting: its knob value, a phrase for people, and where the script sets it."""
    return {"value": value, "what": what, "site": site}


class OwnSettings:
    """Watches the trial for the script's own autocast, compiled model, layouts, flags and accumulation."""

    def __init__(self, knobs: Knobs):
        self.knobs = knobs
        self.settings: dict[str, dict[str, Any]] = {}
        self.entered: list[dict[str, Any] | None] = []  # autocasts open now: the user's (a dict) or not (None)
        self.compile_site: str | None = None
        self.first_call_seen = False
        self.backwards = 0
        self.per_step: list[int] = []
        self.stack = contextlib.ExitStack()
        self.forward_hook: Any = None

    def install(self) -> None:
        """Interpose for the rest of the trial."""
        import torch
        from torch.amp import autocast_mode
        from torch.optim.optimizer import register_optimizer_step_post_hook

        original_enter, original_exit = autocast_mode.autocast.__enter__, autocast_mode.autocast.__exit__
        watcher = self

        def enter(context, *args, **kwargs):
            watcher._autocast_entered(context)
            return original_enter(context, *args, **kwargs)

        def exit_(context, *args, **kwargs):
            if watcher.entered:
                watcher.entered.pop()
            return original_exit(context, *args, **kwargs)

        self.stack.enter_context(patched_attribute(autocast_mode.autocast, "__enter__", enter))
        self.stack.enter_context(patched_attribute(autocast_mode.autocast, "__exit__", exit_))
        original_compile = torch.compile

        def compile_(*args, **kwargs):
            watcher.compile_site = watcher.compile_site or user_site()
            return original_compile(*args, **kwargs)

        self.stack.enter_context(patched_attribute(torch, "compile", compile_))
        self._watch_calls()  # the model's first call; later ones only while the script's own autocast is open
        self.stack.callback(self._stop_watching_calls)
        self.stack.callback(register_optimizer_step_post_hook(self._optimizer_stepped).remove)

    def undo(self) -> None:
        """Take the interposition back (an in-process trial runs in the user's own notebook)."""
        self.stack.close()

    # --- what the script does -------------------------------------------------------------------------

    def _watch_calls(self) -> None:
        from torch.nn.modules import module as module_hooks

        if self.forward_hook is None:
            self.forward_hook = module_hooks.register_module_forward_pre_hook(self._forward_starts)

    def _stop_watching_calls(self) -> None:
        if self.forward_hook is not None:
            self.forward_hook.remove()
            self.forward_hook = None

    def _autocast_entered(self, context: Any) -> None:
        if "amp" in self.settings:  # known already: nothing more to learn from autocasts
            self.entered.append(None)
            return
        dtype = DTYPES.get(str(getattr(context, "fast_dtype", "")))
        owner = autocast_owner()
        # With the amp knob on, a framework's autocast may be the knob's (the Trainer's precision set for it).
        ours = owner == "advisor" or (owner is not None and self.knobs.amp is not None)
        user = None if ours or not getattr(context, "_enabled", True) or dtype is None else \
            {"dtype": dtype, "what": f"{dtype} autocast" + (f" ({owner})" if owner else ""), "site": user_site()}
        self.entered.append(user)
        if user is not None:
            self._watch_calls()  # is it on while the model runs, with gradients?

    def _forward_starts(self, module: Any, args: Any) -> None:
        import torch

        if torch.compiler.is_compiling() or next(module.parameters(), None) is None:
            return
        if not self.first_call_seen:
            self.first_call_seen = True
            self._model_seen(module)
        user = next((e for e in reversed(self.entered) if e is not None), None)
        if user is not None and torch.is_grad_enabled():
            self.settings["amp"] = own_setting(user["dtype"], user["what"], user["site"])
        if "amp" in self.settings or user is None:
            self._stop_watching_calls()  # no module call teaches more until the script's autocast opens again

    def _model_seen(self, module: Any) -> None:
        import torch

        if type(module).__name__ == "OptimizedModule" or getattr(module, "_compiled_call_impl", None) is not None:
            self.settings["compile"] = own_setting(True, "torch.compile", self.compile_site)
        conv = next((m for m in module.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))), None)
        if conv is not None and conv.weight.is_contiguous(memory_format=torch.channels_last) \
                and not conv.weight.is_contiguous():
            self.settings["channels_last"] = own_setting(True, "channels_last", None)
        for knob in TORCH_SETTINGS:  # tf32, cudnn.benchmark: each knob's module reads the script's own
            text = knob.setting.own(torch)
            if text is not None:
                self.settings[knob.name] = own_setting(True, text, None)

    def backward_ran(self) -> None:
        """A scalar's backward ran (the loss of a micro-batch)."""
        self.backwards += 1

    def _optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # An optimizer given a closure (LBFGS) runs the backward itself, as often as it evaluates the loss: those
        # are not micro-batches of one step.
        closure = kwargs.get("closure") if isinstance(kwargs, dict) else None
        # torch passes the step's own arguments, the optimizer first.
        closure = closure or next((a for a in args or () if a is not optimizer and callable(a)), None)
        self.per_step.append(1 if closure is not None else self.backwards)
        self.backwards = 0

    # --- the record -----------------------------------------------------------------------------------

    def record(self, optimizers: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
        """knob → {value, what, site} for each knob the script sets itself."""
        out = dict(self.settings)
        fused = next((o for o in optimizers or [] if o["user"].get("fused")), None)
        if fused is not None:
            out["fused_optimizer"] = own_setting(True, f"fused {fused['class']}", fused.get("site"))
        # The first step's count can hold a warm-up's backward; the rest must agree.
        counts = self.per_step[1:]
        if self.knobs.accumulation_steps is None and len(counts) >= ACCUMULATION_STEPS_SEEN \
                and min(counts) == max(counts) and counts[0] > 1:
            steps = int(statistics.median(counts))
            out["accumulation_steps"] = own_setting(steps, f"gradient accumulation over {steps} batches", None)
        return out

"""The script's own settings of the knobs, read from the running trial: what was in effect when its model
ran, not only what its source says. Inside the trial only (torch imported lazily).

Read in every trial, whatever its knobs, so the baseline records them. Each knob's module says how its own reads
(`Knob.own_at_first_call`, `Knob.own_at_end`); this module gathers what they read:

- at the model's first call, before any knob changes the model or torch: the model and torch's settings (a
  compiled model, convolutions in channels_last, TF32), with where the script called the torch function a knob
  names as its setter (`Knob.own_call`: torch.compile);
- by the trial's end (`ScriptSeen`): the autocasts others than the advisor entered that were open at a training
  forward (a module with parameters running with gradients on: an evaluation under `no_grad` does not count), with
  who entered them (the script's code, or a framework: accelerate, lightning); the optimizers it built; its backward
  passes per optimizer step. The advisor's own autocast is entered from its code and is never taken for the
  script's.

Each is recorded with where the script sets it (`file.py:LINE`, the nearest frame of the user's code)
where one can be told, and a phrase for the baseline row ("bf16 autocast").
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from advisor.knobs import KNOBS
from advisor.knobs.in_trial import ScriptSeen, patched_attribute
from advisor.trials.interposition.loaders import INSTALLED, user_site
from advisor.trials.knobs import Knobs

ADVISOR_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
READ_AT_FIRST_CALL = tuple(k for k in KNOBS if k.own_at_first_call or k.setting)
READ_AT_END = tuple(k for k in KNOBS if k.own_at_end)


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
    """Watches the trial for what the script sets itself: its autocasts, model, torch settings, optimizers and
    backward passes; each knob's module reads its own setting from them."""

    def __init__(self, knobs: Knobs):
        self.knobs = knobs
        self.settings: dict[str, dict[str, Any]] = {}  # read at the model's first call
        self.seen = ScriptSeen(knobs)
        self.entered: list[dict[str, Any] | None] = []  # autocasts open now: one to record (a dict) or not (None)
        self.sites: dict[str, str | None] = {}  # a knob's setter (`own_call`) → where the script first called it
        self.first_call_seen = False
        self.backwards = 0
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
        for knob in READ_AT_FIRST_CALL:
            if knob.own_call is not None:
                self.stack.enter_context(patched_attribute(torch, knob.own_call,
                                                           self._recording_site(torch, knob.own_call)))
        self._watch_calls()  # the model's first call; later ones only while an autocast to record is open
        self.stack.callback(self._stop_watching_calls)
        self.stack.callback(register_optimizer_step_post_hook(self._optimizer_stepped).remove)

    def undo(self) -> None:
        """Take the interposition back (an in-process trial runs in the user's own notebook)."""
        self.stack.close()

    # --- what the script does -------------------------------------------------------------------------

    def _recording_site(self, torch: Any, call: str) -> Any:
        """torch's function `call` (a knob's setter), recording where the script first calls it."""
        original = getattr(torch, call)

        def called(*args, **kwargs):
            self.sites[call] = self.sites.get(call) or user_site()  # None where no frame of the script's called it
            return original(*args, **kwargs)

        return called

    def _watch_calls(self) -> None:
        from torch.nn.modules import module as module_hooks

        if self.forward_hook is None:
            self.forward_hook = module_hooks.register_module_forward_pre_hook(self._forward_starts)

    def _stop_watching_calls(self) -> None:
        if self.forward_hook is not None:
            self.forward_hook.remove()
            self.forward_hook = None

    def _autocast_entered(self, context: Any) -> None:
        owner = autocast_owner()
        dtype = str(getattr(context, "fast_dtype", ""))
        known = any(a["dtype"] == dtype and a["owner"] == owner for a in self.seen.autocasts)
        if owner == "advisor" or known or not getattr(context, "_enabled", True):
            self.entered.append(None)  # the advisor's own, or nothing more to learn from it
            return
        self.entered.append({"dtype": dtype, "owner": owner, "site": user_site()})
        self._watch_calls()  # is it on while the model runs, with gradients?

    def _forward_starts(self, module: Any, args: Any) -> None:
        import torch

        if torch.compiler.is_compiling() or next(module.parameters(), None) is None:
            return
        if not self.first_call_seen:
            self.first_call_seen = True
            self._model_seen(module)
        open_ = next((e for e in reversed(self.entered) if e is not None), None)
        if open_ is not None and torch.is_grad_enabled() and open_ not in self.seen.autocasts:
            self.seen.autocasts.append(open_)
        if open_ is None or open_ in self.seen.autocasts:
            self._stop_watching_calls()  # no module call teaches more until another autocast opens

    def _model_seen(self, module: Any) -> None:
        import torch

        for knob in READ_AT_FIRST_CALL:
            text = knob.own_on_model(torch, module)
            if text is not None:
                self.settings[knob.name] = own_setting(True, text, self.sites.get(knob.own_call))

    def compiles_itself(self) -> bool:
        """Whether the script called a compiling knob's setter itself (torch.compile): its step is compiled."""
        return any(k.own_call in self.sites for k in READ_AT_FIRST_CALL if k.compiles)

    def backward_ran(self) -> None:
        """A scalar's backward ran (the loss of a micro-batch)."""
        self.backwards += 1

    def _optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # An optimizer given a closure (LBFGS) runs the backward itself, as often as it evaluates the loss: those
        # are not micro-batches of one step.
        closure = kwargs.get("closure") if isinstance(kwargs, dict) else None
        # torch passes the step's own arguments, the optimizer first.
        closure = closure or next((a for a in args or () if a is not optimizer and callable(a)), None)
        self.seen.backwards_per_step.append(1 if closure is not None else self.backwards)
        self.backwards = 0

    # --- the record -----------------------------------------------------------------------------------

    def record(self, optimizers: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
        """knob → {value, what, site} for each knob the script sets itself."""
        self.seen.optimizers = optimizers or []
        out = dict(self.settings)
        for knob in READ_AT_END:
            if (own := knob.own_at_end(self.seen)) is not None:
                out[knob.name] = own_setting(*own)
        return out

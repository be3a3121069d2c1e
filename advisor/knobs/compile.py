"""`compile`: `torch.compile` of the model's forward.

- **In the trial**: the model's forward through `torch.compile` from its second call. The compile runs in
  the steps before the measured windows, so it is never in samples/s: the trial records it (`compile_s`,
  graphs, graph breaks) and the session says after how many steps it pays back.
- **Proposed when**: compute or launch overhead binds.
- **The script's own**: a model compiled before its first call, where the script calls `torch.compile`.
- **Not applicable**: a compile that fails (a construct the compiler refuses): the eager forward is put back,
  the trial goes on, the reason is recorded. A model on the CPU where inductor finds no working C++ compiler
  is not traced at all: the compiler is looked for first (what tracing a large model only to fail at its first
  kernel would cost is minutes of the trial).
- **The patch writes**: `model.compile()` just before the optimizer is built from the model (in place: the
  model's class, its state_dict keys and what `torch.save(model)` writes stay as they were); under Lightning,
  `model = torch.compile(model)` before `trainer.fit(model)`; under transformers' Trainer, `torch_compile=True`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from advisor.errors import first_line
from advisor.knobs.graph import StepGraph, TrialSettings, host_cut, layout_share, relayout, undone
from advisor.knobs.knob import APPLIED, AT_FIRST_CALL, FLAG, MODEL, ON_MODEL, Knob, WhatIf, Written, not_applicable
from advisor.knobs.in_trial import ModelChange, forwards_back
from advisor.knobs.offer import ROUND_GAIN, Best, Offer


def setting(trial: TrialSettings) -> bool:
    """Whether the trial's model was compiled: the knob, else the script's own."""
    return trial.flag("compile")


def transform(g: StepGraph, value: Any, p: float, params: dict[str, float]) -> StepGraph:
    """The share p of the host work and of the kernels that are neither matrix products nor copies (the ones
    compile fuses) removed, or given back when turned off; on a CPU beside channels_last, that knob's saving
    as much as compiled graphs keep of it (with its parameter among `params`)."""
    if bool(value) == g.compiled:
        return g
    share = p if value else -undone(p)
    other = max(0.0, g.device_s - g.matmul_s - g.matmul_tc_s - g.copy_s)
    after = dataclasses.replace(host_cut(g, g.host_s * share), compiled=bool(value),
                                device_s=g.device_s - other * share)
    if g.platform == "cpu" and g.channels_last:
        layout_p = params["channels_last"]
        after = relayout(after, layout_share(g, layout_p), layout_share(after, layout_p))
    return after


# The share of the host work and of the non-matrix kernel time it removes. On a CPU it is expected to cost a
# little before it is measured (every steady state of a compiled step measured on a CPU in the repo was slower:
# the conv classifier's by 7-42%, the char transformer's by 4%, the live CNN of issue 71 by 13-29%): it adds a
# fifth to the host work and non-matrix operators.
WHAT_IF = WhatIf("compile", "compiled", setting, transform, "compile", prior=0.5, bounds=(-0.5, 0.9),
                 prior_cpu=-0.2)


# Before the optimizer; under Lightning, before `trainer.fit(model)`; under transformers' Trainer, its own field.
# In a plain script `model.compile()`, not `model = torch.compile(model)`: the wrapper that returns changes what the
# script saves (pytorch/examples' word_language_model: `torch.save(model)`, then a `torch.load` that allows its own
# classes only, failed on the OptimizedModule) and prefixes every state_dict key with `_orig_mod.`.
WRITTEN = Written(
    ON_MODEL,
    lines=("{model}.compile()  # in place: its class, state_dict keys and torch.save(model) unchanged",),
    manual="after building the model: model.compile()", trainer_keywords=(("torch_compile", True),),
    lightning_model="{model} = torch.compile({model})  # Lightning trains the compiled module (compiled in the first "
                    "steps)")


def own(torch: Any, model: Any) -> str | None:
    """The script's own: its model compiled before its first call (`torch.compile(model)`, `model.compile()`)."""
    compiled = type(model).__name__ == "OptimizedModule" or getattr(model, "_compiled_call_impl", None) is not None
    return "torch.compile" if compiled else None


def is_compile_error(exc: BaseException) -> bool:
    """An error raised by the compiler (dynamo, AOTAutograd, inductor), not by the user's code."""
    return any(type(e).__module__.startswith(("torch._dynamo", "torch._inductor", "torch._functorch"))
               for e in (exc, exc.__cause__, exc.__context__) if e is not None)


def failure(exc: BaseException) -> str:
    """The not-applicable outcome of a compile that failed: its error, one line."""
    return not_applicable(f"torch.compile failed: {first_line(exc, 240)}")


def no_cpu_compiler(torch: Any, module: Any) -> str | None:
    """Why inductor cannot build this module's kernels, where they would be C++ for the CPU and no working C++
    compiler is found (CXX, then g++, as inductor looks); None where one is, or the module is on another device."""
    devices = {t.device.type for t in (*module.parameters(), *module.buffers())}
    if devices - {"cpu"} or (not devices and torch.cuda.is_available()):
        return None
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except Exception as exc:  # inductor's InvalidCxxCompiler: none of the compilers it tries runs
        return f"torch.compile failed: no C++ compiler for its CPU kernels ({first_line(exc, 200)}); nothing was traced"
    return None


class Compile(ModelChange):
    """In the trial: each model's forward through `torch.compile` from its next call; a compile that fails puts the
    eager forward back and the trial goes on. Records the graphs, graph breaks and their most frequent reasons
    (dynamo's counters; `compile_s` is the driver's)."""

    after_rewrites = True  # it traces the attention and checkpointed blocks rewritten before it
    record_fields = ("compile",)

    def __init__(self) -> None:
        super().__init__()
        self.compiled: list[tuple[Any, bool, Any]] = []  # (module, had its own forward, that forward)

    def apply(self, torch: Any, module: Any, args: tuple) -> None:
        self.user = own(torch, module) is not None
        had_own, previous, eager = "forward" in module.__dict__, module.__dict__.get("forward"), module.forward
        if (missing := no_cpu_compiler(torch, module)) is not None:
            self.outcome = not_applicable(missing)
            return
        try:
            compiled = torch.compile(eager)
        except Exception as exc:  # e.g. dynamo does not support this Python
            self.outcome = failure(exc)
            return
        change = self

        def forward(*args: Any, **kwargs: Any) -> Any:
            if change.outcome not in (None, APPLIED):
                return eager(*args, **kwargs)
            try:
                return compiled(*args, **kwargs)
            except Exception as exc:
                if not is_compile_error(exc):
                    raise
                change.outcome = failure(exc)
                return eager(*args, **kwargs)  # the trial goes on without the compiler

        module.forward = forward
        self.compiled.append((module, had_own, previous))
        self.outcome = self.outcome or APPLIED

    def failed(self, exc: BaseException) -> None:
        if is_compile_error(exc):  # raised in a step, compiling the backward
            self.outcome = failure(exc)

    def record(self) -> dict[str, Any]:
        if not self.compiled or self.outcome != APPLIED:
            return {"compile": None}
        from torch._dynamo.utils import counters  # the trial's torch: this runs inside it

        breaks = counters.get("graph_break", {})
        return {"compile": {"graphs": int(counters.get("stats", {}).get("unique_graphs", 0)),
                            "graph_breaks": int(sum(breaks.values())),
                            "break_reasons": [reason.splitlines()[0][:200] for reason, _ in
                                              sorted(breaks.items(), key=lambda kv: -kv[1])[:3]]}}

    def undo(self, torch: Any) -> None:
        forwards_back(self.compiled)
        self.compiled = []


def held(row: Any) -> float | None:
    """The seconds a trial's compile took in its first steps (its row's `compile` record), None where it compiled
    nothing."""
    seconds = (row.get("compile") or {}).get("compile_s")
    return seconds if isinstance(seconds, (int, float)) else None


def payback_steps(compile_s: float | None, before: Any, after: Any) -> int | None:
    """Steps after which a compile pays for itself: its compile time over the time it saves per step (steady
    state, the best before it, a row, against the trial's); None when it saves nothing or a figure is missing."""
    rates = (before.get("samples_per_s"), after.get("samples_per_s"))
    sizes = (before.get("batch_size") or 1, after.get("batch_size") or 1)
    if compile_s is None or not all(rates):
        return None
    saved = sizes[0] / rates[0] - sizes[1] / rates[1]  # seconds per step; per sample where the batch differs
    if sizes[0] != sizes[1]:
        saved = (1 / rates[0] - 1 / rates[1]) * sizes[1]
    return math.ceil(compile_s / saved) if saved > 0 else None


def note_payback(row: Any, before: Any) -> None:
    """Put into a trial's row, where it compiled, after how many steps its compile pays back against `before`."""
    seconds = held(row)
    if seconds is not None:
        row.get("compile")["pays_back_after_steps"] = payback_steps(seconds, before, row)


def figures_text(figures: dict | None) -> str:
    """What a trial's torch.compile cost and did: 'compiled in 12.9 s (first steps, not in the speed); 1 graph,
    no graph breaks; pays back after 140 steps'; '' for a trial that did not compile."""
    if not isinstance(figures, dict) or not isinstance(figures.get("compile_s"), (int, float)):
        return ""
    graphs, breaks = figures.get("graphs"), figures.get("graph_breaks")
    parts = [f"compiled in {figures['compile_s']:.1f} s (first steps, not in the speed)"]
    if isinstance(graphs, int):
        parts.append(f"{graphs} graph{'s' if graphs != 1 else ''}, "
                     + ("no graph breaks" if not breaks else f"{breaks} graph break{'s' if breaks != 1 else ''}"))
    reasons = [r for r in figures.get("break_reasons") or [] if isinstance(r, str)]
    if breaks and reasons:
        parts[-1] += f" ({reasons[0]})"
    steps = figures.get("pays_back_after_steps")
    parts.append(f"pays back after {steps:,} steps" if isinstance(steps, int) else "does not pay back: no faster")
    return "; ".join(parts)


def row_text(row: Any) -> str:
    """`figures_text` of a trial's row ('' where it did not compile)."""
    return figures_text(row.get("compile"))


def offer(best: Best) -> Offer | None:
    """torch.compile: fused kernels for a compute- or launch-bound step. No rule predicts its gain on a
    compute-bound step (it is measured, its compile time reported apart); on a launch-bound GPU step the CUDA
    graphs rule's figure stands for it."""
    graphs = best.advice.get("cuda-graphs")
    if best.knobs.compile or not best.space.allows("compile") or (
            graphs is None and best.bound not in ("compute", "host")):
        return None
    gain = graphs.predicted_gain if graphs is not None else ROUND_GAIN
    target = "host" if graphs is not None or best.bound == "host" else "compute"
    return Offer({"compile": True}, "torch.compile", "compile", gain, target, predicted=graphs is not None)


# torch.compile of a large model takes minutes on its first steps: a trial that compiles gets this much more time.
# Before the session measured a compile, one is taken to add what the conv example's compile trials took on a 2-core
# CPU (38 s and 47 s, issue 71); on a GPU a model of that size compiles in about as long.
KNOB = Knob("compile", FLAG, MODEL, AT_FIRST_CALL, "torch.compile", proposed_as="compile", spread=(0.20, 0.30),
            whatif=WHAT_IF, written=WRITTEN, offer=offer, first_steps_s=600.0,
            compiles=True, own_at_first_call=own, own_call="compile", first_steps_held=held,
            first_steps_prior_s=40.0, on_model=Compile)

"""The `sdpa` knob's evidence: on the real batch, what a hand-written attention computes, read as numbers, and
whether `F.scaled_dot_product_attention` computes the same. Inside the trial only (torch imported lazily).

At the model's first call the model runs once more on the same batch (no grad, every module in eval: dropout
off; the random state put back after), and each candidate attention module's input is kept. On that input,
the module's forward runs with a probe just before its softmax, which reads q, k and the scores there; the
scores are then read as a scale (a number, fitted on the positions that take part) times q·kᵀ plus a mask
(the positions at -1e3 or below: causal where they are the strict upper triangle for the sequence length,
else the mask the source writes, boolean or additive, padding masks included). What is not such a scale and
mask (a position bias, ALiBi, a soft-cap) is refused with its largest difference. Then the forward with the
fused call runs on the same input and is compared with the original, in float32 and in the dtype the step
runs in (autocast), within a tolerance per dtype; it is applied only where they agree.
"""

from __future__ import annotations

import __future__
import math
from dataclasses import dataclass
from typing import Any, Callable

from advisor.trials.interposition.attention_source import Candidate, scale_code, statements

# Relative tolerance per dtype, on the largest magnitude (at least 1): rounding of the two computations.
TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "bfloat16": 4e-2, "float16": 4e-3}
MASKED = -1e3  # a score at or below this takes no part in the softmax (exp underflows to 0 in every float type)
PROBE = "__advisor_probe__"


@dataclass(frozen=True)
class Readings:
    """What the scores before the softmax are, read from the numbers."""

    scale: float
    head_width: int
    causal: bool  # the masked positions are exactly the strict upper triangle (queries == keys)
    masked: int  # positions taking no part
    mask_shape: tuple[int, ...]  # the smallest shape the pattern of masked positions broadcasts from
    dtype: str


def tolerance(dtype: Any) -> float:
    """The relative tolerance of `dtype` (a torch dtype)."""
    return TOLERANCE.get(str(dtype).removeprefix("torch."), 1e-4)


def capture_inputs(model: Any, args: tuple, modules: list[Any]) -> dict[int, tuple] | str:
    """Each module's first (args, kwargs) when `model(*args)` runs once more (no grad, eval, the random state
    put back); or why it could not run."""
    import torch

    found: dict[int, tuple] = {}
    handles = [m.register_forward_pre_hook(lambda mod, a, kw: found.setdefault(id(mod), (a, kw)) and None,
                                           with_kwargs=True) for m in modules]
    modes = [(m, m.training) for m in model.modules()]
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            model(*args)
    except Exception as exc:  # noqa: BLE001 - the user's model: any failure means no evidence
        return f"the model could not run again on its first batch to check the rewrite ({type(exc).__name__}: {exc})"
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes:
            module.training = training
    return found


def compiled(forward: Any, lines: list[str], filename: str, start: int, extra: dict | None = None) -> Any:
    """A function made from the forward's source `lines`, with the file's name and line numbers, in its module's
    globals (a copy of them, with `extra`, when given)."""
    flags = forward.__code__.co_flags & __future__.annotations.compiler_flag  # as the file compiled it
    code = compile("\n" * (start - 1) + "\n".join(lines) + "\n", filename, "exec", flags, dont_inherit=True)
    namespace: dict[str, Any] = {}
    exec(code, {**forward.__globals__, **extra} if extra else forward.__globals__, namespace)  # noqa: S102
    new = namespace[forward.__name__]
    new.__qualname__, new.__doc__ = forward.__qualname__, forward.__doc__
    new.__defaults__, new.__kwdefaults__ = forward.__defaults__, forward.__kwdefaults__
    return new


def probe_lines(source: str, candidate: Candidate) -> list[str]:
    """The forward's source with a call reading q, k and the scores just before the softmax (one line added)."""
    lines = source.splitlines()
    at = candidate.softmax_line - 1
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    return lines[:at] + [f"{indent}{PROBE}({candidate.q}, {candidate.k}, {candidate.scores})"] + lines[at:]


def rewritten_lines(source: str, candidate: Candidate, replacement: list[str]) -> list[str]:
    """The forward's source with the candidate's lines replaced by `replacement` (the lines after keep their
    numbers: blank lines fill the difference)."""
    lines = source.splitlines()
    first = lines[candidate.first_line - 1]
    indent = first[: len(first) - len(first.lstrip())]
    new = [indent + line for statement in replacement for line in statement.splitlines()]
    span = candidate.last_line - candidate.first_line + 1
    return lines[: candidate.first_line - 1] + new + [""] * max(0, span - len(new)) + lines[candidate.last_line:]


def read_scores(q: Any, k: Any, scores: Any) -> Readings | str:
    """The scores read as scale · q·kᵀ + mask; or what they are instead (the largest difference)."""
    import torch

    raw = q.detach().double() @ k.detach().double().transpose(-2, -1)
    given = scores.detach().double()
    if raw.shape != given.shape:
        return f"the scores before the softmax have the shape {tuple(given.shape)}, q·kᵀ {tuple(raw.shape)}"
    taking = torch.isfinite(given) & (given > MASKED)
    if not bool(taking.any()):
        return "every score before the softmax is masked"
    x, y = raw[taking], given[taking]
    scale = float((x * y).sum() / (x * x).sum().clamp_min(1e-300))
    largest = float((y - scale * x).abs().max())
    dtype = max((q.dtype, k.dtype, scores.dtype), key=tolerance)  # the least precise of the three
    allowed = tolerance(dtype) * max(1.0, float(y.abs().max()))
    if largest > allowed:
        return (f"the scores before the softmax are not a scale of q·kᵀ plus a mask: they differ from "
                f"{scale:.4g}·q·kᵀ by up to {largest:.3g} where they take part (tolerance {allowed:.2g} in "
                f"{str(dtype).removeprefix('torch.')}): a position bias, ALiBi or a cap the fused call "
                "does not compute")
    masked = ~taking
    queries, keys = masked.shape[-2:]
    causal = queries == keys and bool(masked.any()) and bool((masked == torch.ones(
        queries, keys, dtype=torch.bool, device=masked.device).triu(1)).all())
    shape = tuple(1 if all(bool((s == masked.select(d, 0)).all()) for s in masked.unbind(d)) else n
                  for d, n in enumerate(masked.shape))
    return Readings(scale, int(q.shape[-1]), causal, int(masked.sum()), shape, str(dtype).removeprefix("torch."))


def floats(value: Any) -> list[Any]:
    """The floating-point tensors in an output (a tensor, or tuples, lists and dicts of them)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in floats(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in floats(v)]
    return []


def difference(before: Any, after: Any) -> tuple[float, float, str]:
    """(largest difference, the tolerance it is held to, the dtype) between two outputs of the module."""
    import torch

    old, new = floats(before), floats(after)
    if len(old) != len(new) or not old or any(a.shape != b.shape for a, b in zip(old, new)):
        return math.inf, 0.0, "?"
    largest, scale = 0.0, 1.0
    for a, b in zip(old, new):
        a, b = a.detach().double(), b.detach().double()
        both = torch.isnan(a) & torch.isnan(b)
        gap = torch.where(both, torch.zeros_like(a), (a - b).abs())
        largest = max(largest, float(gap.nan_to_num(math.inf).max()) if gap.numel() else 0.0)
        scale = max(scale, float(a.nan_to_num(0.0).abs().max()) if a.numel() else 0.0)
    dtype = str(old[0].dtype).removeprefix("torch.")
    return largest, tolerance(old[0].dtype) * scale, dtype


def as_float32(value: Any) -> Any:
    """Floating tensors made float32 (inside tuples, lists, dicts)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(as_float32(v) for v in value)
    if isinstance(value, dict):
        return {k: as_float32(v) for k, v in value.items()}
    return value


def runs(module: Any, inputs: tuple) -> list[tuple[str, Any]]:
    """The settings the check runs in: float32 without autocast (where the module's weights are float32), and
    as the step runs (its autocast), where that differs."""
    import torch

    args, kwargs = inputs
    device = next((p.device.type for p in module.parameters()), "cpu")
    weights32 = all(p.dtype == torch.float32 for p in module.parameters())
    ambient = torch.is_autocast_enabled(device) if device in ("cpu", "cuda") else False
    out = []
    if weights32:
        out.append(("float32", (device, False, as_float32(args), as_float32(kwargs))))
    if ambient or not weights32:
        out.append(("as the step runs", (device, None, args, kwargs)))
    return out


def run(function: Callable, module: Any, setting: tuple) -> Any:
    """`function(module, ...)` in eval, without grad, the random state put back, autocast as `setting` says."""
    import contextlib

    import torch

    device, autocast, args, kwargs = setting
    modes = [(m, m.training) for m in module.modules()]
    context = torch.autocast(device, enabled=False) if autocast is False else contextlib.nullcontext()
    try:
        module.eval()
        with torch.no_grad(), context, torch.random.fork_rng(devices=[]):
            return function(module, *args, **kwargs)
    finally:
        for m, training in modes:
            m.training = training


def check(forward: Any, source: str, filename: str, start: int, candidate: Candidate, functional: str,
          inputs: list[tuple[Any, tuple]]) -> tuple[list[str], str] | str:
    """The statements that replace the candidate (and what was read), checked equal on every instance's input
    in each setting; or why not, with the number that decided it."""
    captured: list[tuple] = []
    probe = compiled(forward, probe_lines(source, candidate), filename, start,
                     {PROBE: lambda q, k, s: captured.append((q, k, s))})
    readings, originals = [], []
    for module, given in inputs:
        for name, setting in runs(module, given):
            captured.clear()
            try:
                originals.append((module, name, setting, run(probe, module, setting)))
            except Exception as exc:  # noqa: BLE001 - the user's forward, probed
                return f"the forward failed when probed ({type(exc).__name__}: {exc})"
            if not captured:
                return "the softmax was not reached on the first batch: nothing to read"
            read = read_scores(*captured[0])
            if isinstance(read, str):
                return read
            readings.append(read)
    first = readings[0]
    causal = all(r.causal for r in readings)
    masks = [s for s in candidate.steps if s.kind == "mask"]
    if any(r.masked for r in readings) and not masks and not causal:
        return f"positions are masked ({first.mask_shape}) by no statement the call could take as its mask"
    if all(abs(r.scale * math.sqrt(r.head_width) - 1) < 1e-3 for r in readings):
        scale = None  # SDPA's own 1/sqrt(width)
    else:
        scale = scale_code(candidate) or repr(float(f"{first.scale:.6g}"))
    replacement = statements(candidate, functional, scale, causal)
    try:
        fused = compiled(forward, rewritten_lines(source, candidate, replacement), filename, start)
    except SyntaxError as exc:
        return f"the replacement does not compile ({exc.msg})"
    for module, name, setting, before in originals:
        try:
            after = run(fused, module, setting)
        except Exception as exc:  # noqa: BLE001 - the fused call refused these operands
            return f"the fused call failed on the first batch ({type(exc).__name__}: {exc})"
        largest, allowed, dtype = difference(before, after)
        if not largest <= allowed:
            mask = "causal" if causal else f"mask of shape {first.mask_shape}" if first.masked else "no mask"
            return (f"the fused call differs from the original by up to {largest:.3g} (tolerance {allowed:.2g} in "
                    f"{dtype}, {name}; scale read {first.scale:.4g}, {mask})")
    kind = {"add": "additive", "bool": "boolean"}[masks[0].op] if masks else ""
    form = ["causal mask" if causal else f"{kind} mask of shape {first.mask_shape}" if masks else "no mask",
            "1/sqrt(d)" if scale is None else f"scale {first.scale:.4g}"]
    if candidate.dropout is not None:
        form.append("dropout")
    return replacement, ", ".join(form)

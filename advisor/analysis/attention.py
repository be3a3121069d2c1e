"""Attention's share of the step, written by hand or fused (`Diagnosis.extra["attention"]`).

Hand-written attention is found by its operators, siblings under one parent on one thread: a softmax over a
tensor of three or more dimensions with a batched matmul before it (the scores; the scale and the mask lie
between) and one after it (the values), no linear layer in between; its backward likewise, as the autograd
engine runs it: `SoftmaxBackward0` between two matmul backwards. Fused attention is
`aten::scaled_dot_product_attention` and its backward node, the implementation told by the operator it
dispatched to (flash, memory-efficient, cuDNN, math, the CPU's flash kernel). On a CPU its time is those
operators' time; on a GPU, the kernels they launched (matched through the runtime calls inside them), and
fused attention kernels that no operator launched (a compiled region) by their names.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from advisor.analysis import intervals as iv
from advisor.analysis.events import Event, input_lists
from advisor.analysis.steps import Step, starts_in_steps
from advisor.analysis.trace import Trace

SOFTMAX = ("aten::softmax", "aten::_softmax", "aten::special_softmax")
MATMUL = ("aten::matmul", "aten::bmm", "aten::baddbmm", "aten::einsum")
LAYER = ("aten::linear", "aten::addmm", "aten::mm", "aten::conv1d", "aten::conv2d")  # not attention: stop there
BACKWARD = "autograd::engine::evaluate_function: "
SOFTMAX_BACKWARD = ("SoftmaxBackward0",)
MATMUL_BACKWARD = ("BmmBackward0", "BaddbmmBackward0", "MatmulBackward0")
LAYER_BACKWARD = ("AddmmBackward0", "MmBackward0", "ConvolutionBackward0")
FUSED = "aten::scaled_dot_product_attention"
# The operator SDPA dispatched to -> the implementation's name (the longest match wins).
IMPLEMENTATIONS = {"_flash_attention_for_cpu": "flash (CPU)", "_flash_attention": "flash",
                   "_efficient_attention": "memory-efficient", "_cudnn_attention": "cuDNN",
                   "_attention_math": "math", "_fused_attention_overrideable": "fused (backend)"}
FUSED_KERNEL = re.compile(r"flash_fwd|flash_bwd|fmha|_sdpa_|native_sdpa|attention_kernel|efficient_attention",
                          re.IGNORECASE)
REACH = 8  # siblings searched before and after a softmax for its two matmuls


@dataclass(frozen=True)
class Attention:
    """Attention's time per step and its share of the step, by how it is computed."""

    share: float  # of the step, hand-written and fused together
    hand_written_share: float
    fused_share: float
    ms_per_step: float
    per_step: float  # attention forwards a step
    implementations: tuple[str, ...]  # of the fused: "flash", "cuDNN", ...; "hand-written" where there is some

    def to_dict(self) -> dict:
        """The JSON form (`advisor analyze --json`, `attention`)."""
        return {"share": self.share, "hand_written_share": self.hand_written_share, "fused_share": self.fused_share,
                "ms_per_step": self.ms_per_step, "per_step": self.per_step,
                "implementations": list(self.implementations)}


def siblings(ops: list[Event]) -> list[list[Event]]:
    """The operators of one thread grouped by their parent (each group in time order)."""
    groups: dict[int, list[Event]] = defaultdict(list)
    stack: list[tuple[float, int]] = []  # (end, id of the group its children go into)
    for n, op in enumerate(ops):
        while stack and stack[-1][0] <= op.ts:
            stack.pop()
        groups[stack[-1][1] if stack else -1].append(op)
        stack.append((op.ts + op.dur, n))
    return list(groups.values())


def dims_of(op: Event) -> list:
    """The operator's input shapes, where the trace recorded them."""
    found = input_lists(op.args, "input_dims")
    return found[0] if found is not None else []


def between_matmuls(group: list[Event], i: int, matmul, layer) -> tuple[float, float] | None:
    """(start, end) from the matmul before `group[i]` to the one after it, with no layer in between."""
    def nearest(indices) -> Event | None:
        for j in indices:
            if matmul(group[j].name):
                return group[j]
            if layer(group[j].name):
                return None
        return None

    before = nearest(range(i - 1, max(-1, i - 1 - REACH), -1))
    after = nearest(range(i + 1, min(len(group), i + 1 + REACH)))
    return None if before is None or after is None else (before.ts, after.ts + after.dur)


def backward_of(name: str, names: tuple[str, ...]) -> bool:
    """Whether the event is the autograd engine running one of these nodes."""
    return name.startswith(BACKWARD) and name[len(BACKWARD):] in names


def may_be_attention(name: str) -> bool:
    """Whether an operator's name is one `attention_spans` looks at: a softmax or its backward, SDPA's operator,
    its backward, or the operator it dispatched to."""
    return (name in SOFTMAX or backward_of(name, SOFTMAX_BACKWARD) or name == FUSED or "AttentionBackward" in name
            or "scaled_dot_product" in name or name.endswith(("_attention_forward", "_attention_backward")))


def attention_spans(trace: Trace) -> tuple[list[tuple], list[tuple], set[str]]:
    """(hand-written spans, fused spans, implementations): each span (tid, start, end, whether a forward)."""
    if not any(may_be_attention(name) for name in trace.columns["ops"].names):  # most traces: none can match
        return [], [], set()
    by_thread: dict = defaultdict(list)
    for op in trace.ops:
        if op.cat == "cpu_op":
            by_thread[op.tid].append(op)
    hand, fused, kinds = [], [], set()
    for tid, ops in by_thread.items():
        for group in siblings(ops):
            for i, op in enumerate(group):
                span, forward = None, op.name in SOFTMAX
                if forward and len((dims_of(op) or [[0, 0, 0]])[0]) >= 3:
                    span = between_matmuls(group, i, lambda n: n in MATMUL, lambda n: n in LAYER)
                elif backward_of(op.name, SOFTMAX_BACKWARD):
                    span = between_matmuls(group, i, lambda n: backward_of(n, MATMUL_BACKWARD),
                                           lambda n: backward_of(n, LAYER_BACKWARD))
                elif op.name == FUSED or (op.name.startswith(BACKWARD) and "AttentionBackward" in op.name
                                          and "ScaledDotProduct" in op.name):
                    fused.append((tid, op.ts, op.ts + op.dur, op.name == FUSED))
                if span is not None:
                    hand.append((tid, *span, forward))
        for op in ops:  # the operator SDPA dispatched to names the implementation
            if "scaled_dot_product" in op.name or op.name.endswith(("_attention_forward", "_attention_backward")):
                found = [key for key in IMPLEMENTATIONS if key in op.name]
                if found:
                    kinds.add(IMPLEMENTATIONS[max(found, key=len)])
    return hand, outermost(fused), kinds


def outermost(spans: list[tuple]) -> list[tuple]:
    """The spans not inside another of the same thread (SDPA's operator dispatches to itself once more)."""
    out, reach = [], {}
    for span in sorted(spans, key=lambda s: (str(s[0]), s[1], -s[2])):
        if span[2] > reach.get(span[0], float("-inf")):
            out.append(span)
            reach[span[0]] = span[2]
    return out


def in_steps(spans: list[tuple], steps: list[Step]) -> list[tuple]:
    """The spans that start inside a step."""
    return [s for s in spans if any(step.start <= s[1] < step.end for step in steps)]


def device_time(trace: Trace, kernels: list, spans: list[tuple]) -> float:
    """Time of `kernels` (those in the steps) launched from inside `spans` (by the runtime calls on their thread)."""
    if not spans:
        return 0.0
    by_thread: dict = defaultdict(list)
    for tid, start, end, _ in spans:
        by_thread[tid].append((start, end))
    launched = set()
    for call in trace.runtime:
        if call.correlation is not None and any(s <= call.ts < e for s, e in by_thread.get(call.tid, ())):
            launched.add(call.correlation)
    return sum(k.dur for k in kernels if k.correlation in launched)


def attention(trace: Trace, steps: list[Step], platform: str, step_us: float) -> Attention | None:
    """Attention's figures over `steps`, None where the trace shows none."""
    hand, fused, kinds = attention_spans(trace)
    hand, fused = in_steps(hand, steps), in_steps(fused, steps)
    by_name = 0.0
    if platform == "cpu":
        windows = iv.from_spans((s.start, s.end) for s in steps)
        hand_us, fused_us = (iv.length_within(iv.from_spans((s, e) for _, s, e, _ in spans), windows)
                             for spans in (hand, fused))
    else:
        columns = trace.columns["kernels"]
        inside = starts_in_steps(columns.ts, steps)
        kernels = [trace.kernels[i] for i in np.flatnonzero(inside).tolist()] if hand or fused else []
        hand_us, fused_us = device_time(trace, kernels, hand), device_time(trace, kernels, fused)
        if not fused_us:  # fused kernels no operator launched: a compiled region, a CUDA graph
            by_name = sum(columns.dur[inside & columns.where_name(FUSED_KERNEL.search)].tolist())
            fused_us = by_name
    if not (hand_us or fused_us) or not steps or not step_us:
        return None
    if hand_us:
        kinds.add("hand-written")
    if by_name and not kinds - {"hand-written"}:
        kinds.add("fused kernels")
    n, forwards = len(steps), sum(span[3] for span in hand + fused)
    return Attention(share=(hand_us + fused_us) / n / step_us, hand_written_share=hand_us / n / step_us,
                     fused_share=fused_us / n / step_us, ms_per_step=(hand_us + fused_us) / n / 1000,
                     per_step=forwards / n, implementations=tuple(sorted(kinds)))

"""Time per step by kernel and by operator name, their families, and what moved between two traces.

A kernel's time is its device time inside the steps; an operator's is its self time (its child operators
left out), so that an operator's time moves only where its own work did. Families group names by what they
do (Tensor Core matmuls, FP32 matmuls, elementwise, the DataLoader ...), so that a change of library or of
precision, which renames every kernel, still reads as one move. Pure functions over a parsed `Trace`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from advisor.analysis.breakdown import is_collective, is_communication_kernel
from advisor.analysis.kernels import LAYOUT_KERNEL, MATMUL_KERNEL, is_eligible_op, is_tensor_core
from advisor.analysis.steps import Step, in_steps_mask
from advisor.analysis.trace import Trace

# Kernel families, the first that matches names the family (Tensor Cores and communication are tested first).
KERNEL_FAMILIES: tuple[tuple[str, re.Pattern], ...] = (
    ("layout conversion", LAYOUT_KERNEL),
    ("attention", re.compile(r"flash|fmha|_sdpa_|attention", re.IGNORECASE)),
    ("matmul/conv (FP32 units)", MATMUL_KERNEL),  # FP32_FAMILY
    ("normalization, softmax", re.compile(r"norm|softmax", re.IGNORECASE)),
    ("reduction", re.compile(r"reduce|reduction", re.IGNORECASE)),
    ("optimizer", re.compile(r"multi_tensor|adam|sgd|fused_optim", re.IGNORECASE)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|pointwise|triton_poi", re.IGNORECASE)),
    ("copies, memset", re.compile(r"copy|memcpy|memset|fill", re.IGNORECASE)),
)
TENSOR_CORE_FAMILY = "matmul/conv (Tensor Cores)"
FP32_FAMILY = "matmul/conv (FP32 units)"  # matmul and convolution kernels that did not run on Tensor Cores
COMMUNICATION_FAMILY = "communication"

OPERATOR_FAMILIES: tuple[tuple[str, re.Pattern], ...] = (
    ("DataLoader", re.compile(r"^enumerate\(Data")),
    ("optimizer", re.compile(r"^Optimizer\.|optim", re.IGNORECASE)),
    ("backward", re.compile(r"Backward|^autograd::")),
    ("copies, casts", re.compile(r"^aten::(copy_|_to_copy|to|_copy_from\w*|clone|contiguous)$")),
)


@dataclass(frozen=True)
class Move:
    """One name's (or family's) time per step in A and in B."""

    name: str
    family: str
    a_us: float
    b_us: float

    @property
    def change_us(self) -> float:
        """B less A, per step."""
        return self.b_us - self.a_us

    @property
    def status(self) -> str:
        """'added' (only in B), 'removed' (only in A) or 'changed'."""
        return "added" if not self.a_us else "removed" if not self.b_us else "changed"


def kernel_family(vendor: str, name: str) -> str:
    """The family of a kernel by its name (see KERNEL_FAMILIES)."""
    if is_communication_kernel(name):
        return COMMUNICATION_FAMILY
    if is_tensor_core(vendor, name):
        return TENSOR_CORE_FAMILY
    return next((family for family, pattern in KERNEL_FAMILIES if pattern.search(name)), "other kernels")


def operator_family(name: str) -> str:
    """The family of an operator (or annotation) by its name (see OPERATOR_FAMILIES)."""
    if is_collective(name):
        return COMMUNICATION_FAMILY
    found = next((family for family, pattern in OPERATOR_FAMILIES if pattern.search(name)), None)
    if found is not None:
        return found
    if is_eligible_op(name):
        return "matmul, convolution"
    return "other operators" if name.startswith("aten::") else "annotations, Python"


def kernel_times(trace: Trace, steps: list[Step]) -> dict[str, float]:
    """Device time per step of each kernel name, kernels that start inside the steps."""
    out: dict[str, float] = defaultdict(float)
    if not steps or not trace.kernels:
        return {}
    for k, inside in zip(trace.kernels, in_steps_mask(trace.kernels, steps)):
        if inside:
            out[k.name] += k.dur
    return {name: us / len(steps) for name, us in out.items()}


def operator_times(trace: Trace, steps: list[Step]) -> dict[str, float]:
    """Self time per step of each operator (and user annotation) name inside the steps: its span less the
    spans of the operators directly inside it on its thread."""
    if not steps or not trace.ops:
        return {}
    out: dict[str, float] = defaultdict(float)
    by_thread: dict = defaultdict(list)
    for op, inside in zip(trace.ops, in_steps_mask(trace.ops, steps)):
        if inside:
            by_thread[op.tid].append(op)
    for ops in by_thread.values():  # sorted by start, the enclosing operator first
        stack: list[list] = []  # [event, time of its direct children]
        for op in ops:
            while stack and stack[-1][0].ts + stack[-1][0].dur <= op.ts:
                done = stack.pop()
                out[done[0].name] += max(0.0, done[0].dur - done[1])
            if stack:
                stack[-1][1] += op.dur
            stack.append([op, 0.0])
        for event, children in stack:
            out[event.name] += max(0.0, event.dur - children)
    return {name: us / len(steps) for name, us in out.items()}


def moves(a: dict[str, float], b: dict[str, float], family_of, limit: int | None = None) -> list[Move]:
    """Each name of either table with its time in both, largest change first (at most `limit`)."""
    names = set(a) | set(b)
    found = [Move(n, family_of(n), a.get(n, 0.0), b.get(n, 0.0)) for n in names]
    found = [m for m in found if m.a_us or m.b_us]
    found.sort(key=lambda m: (-abs(m.change_us), m.name))
    return found if limit is None else found[:limit]


def family_moves(a: dict[str, float], b: dict[str, float], family_of) -> list[Move]:
    """The tables summed by family, largest change first."""
    def by_family(table: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for name, us in table.items():
            out[family_of(name)] += us
        return out

    return moves(by_family(a), by_family(b), lambda family: family)


def tensor_core_moves(kernels: list[Move]) -> tuple[list[Move], list[Move]]:
    """(Tensor Core kernels that came or grew in B, matmul/conv kernels on FP32 units that left or shrank):
    the work a precision change moved onto Tensor Cores."""
    onto = [m for m in kernels if m.family == TENSOR_CORE_FAMILY and m.change_us > 0]
    off = [m for m in kernels if m.family == FP32_FAMILY and m.change_us < 0]
    return onto, off

"""The step-time breakdown: each moment of a step counted once, by the first role active then (the
TensorBoard plugin's priority scheme), and how busy kernels keep each device."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from advisor.analysis import intervals as iv
from advisor.analysis.columns import with_external_id
from advisor.analysis.steps import Step
from advisor.analysis.trace import Trace

# Priority order of the step-time breakdown: each moment of a step is counted once, by the first role
# active at that moment (the plugin's scheme).
ROLES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_op", "other")

# Collective annotations the process-group backends record (nccl:all_reduce, gloo:broadcast, ...).
COLLECTIVE_NAME = re.compile(r"^(nccl|gloo|ucc|mpi|xccl|hccl):(\w+)$")
DATALOADER_NAME = re.compile(r"^enumerate\(DataLoader\)#.*\.__next__$|^enumerate\(DataPipe\)#")
COMMUNICATION_KERNEL = re.compile(r"^(nccl|rccl)", re.IGNORECASE)


@lru_cache(maxsize=None)
def collective_kind(name: str) -> str | None:
    """The collective a process group's annotation names ('all_reduce' for nccl:all_reduce), else None.
    Cached: a trace repeats a few hundred operator names over tens of thousands of operators."""
    match = COLLECTIVE_NAME.match(name)
    return None if match is None else match.group(2)


def is_collective(name: str) -> bool:
    """A process group's collective annotation (nccl:all_reduce, gloo:all_reduce, ...)."""
    return collective_kind(name) is not None


@lru_cache(maxsize=None)
def is_communication_kernel(name: str) -> bool:
    """NCCL/RCCL kernels: communication, not compute, in the breakdown and the kernel mix."""
    return COMMUNICATION_KERNEL.match(name) is not None


@lru_cache(maxsize=None)
def _operator_role(name: str) -> str:
    """The breakdown role of a host span by its name: 'dataloader', 'communication' or 'cpu_op'."""
    if name.startswith("enumerate(Data") and DATALOADER_NAME.match(name):
        return "dataloader"
    return "communication" if is_collective(name) else "cpu_op"


def role_intervals(trace: Trace) -> dict[str, iv.Intervals]:
    """Merged time intervals of each breakdown role over the whole trace."""
    ops, kernels = trace.columns["ops"], trace.columns["kernels"]
    # Each role a mask made once per distinct name: comparing an array of the roles' names is a Python
    # comparison per operator.
    comm, dataloader, cpu_op = (ops.where_name(lambda name, role=role: _operator_role(name) == role)
                                for role in ("communication", "dataloader", "cpu_op"))
    collective_ids = {trace.ops[i].external_id for i in np.flatnonzero(comm).tolist()}
    kernel_comm = kernels.where_name(is_communication_kernel)
    if collective_ids:  # kernels a collective annotation launched: communication too
        kernel_comm |= with_external_id(kernels, trace.kernels, collective_ids)
    # The annotations, then the kernels, in that order (as the intervals were always gathered).
    comm_starts = np.concatenate([ops.ts[comm], kernels.ts[kernel_comm]])
    comm_ends = np.concatenate([ops.end[comm], kernels.end[kernel_comm]])
    return {
        "kernel": iv.from_columns(kernels, ~kernel_comm),
        "memcpy": iv.from_columns(trace.columns["memcpys"]),
        "memset": iv.from_columns(trace.columns["memsets"]),
        "communication": iv.merge(comm_starts, comm_ends),
        "runtime": iv.from_columns(trace.columns["runtime"]),
        "dataloader": iv.from_columns(ops, dataloader),
        "cpu_op": iv.from_columns(ops, cpu_op),
    }


def exclusive_time(steps: list[Step], layers: list[tuple[str, iv.Intervals]], rest: str) -> dict[str, float]:
    """Average microseconds per step of each layer, each moment counted once, by the first layer active
    then; `rest` gets the moments no layer covers.

    The time of layer k is |layers 0..k| − |layers 0..k−1| inside the steps: the same as subtracting
    higher-priority time first, computed with unions only.
    """
    windows = iv.from_spans((s.start, s.end) for s in steps)
    covered_before = 0.0
    cumulative = iv.EMPTY
    totals = {}
    for name, intervals in layers:
        cumulative = iv.union(cumulative, intervals)
        covered = iv.length_within(cumulative, windows)
        totals[name] = covered - covered_before
        covered_before = covered
    totals[rest] = iv.length(windows) - covered_before
    n = len(steps)
    return {name: us / n for name, us in totals.items()}


def breakdown(steps: list[Step], roles: dict[str, iv.Intervals]) -> dict[str, float]:
    """Average microseconds per step of each role, each moment counted once by priority (`ROLES`)."""
    return exclusive_time(steps, [(role, roles[role]) for role in ROLES[:-1]], "other")


def gpu_utilization(trace: Trace, steps: list[Step]) -> dict[int, float]:
    """Per device: union of kernel intervals within the steps / the steps' span (the plugin's definition)."""
    start, end = steps[0].start, steps[-1].end
    if end <= start:
        return {}
    kernels = trace.columns["kernels"]
    devices = kernels.device[kernels.on_device]
    _, first = np.unique(devices, return_index=True)
    return {d: iv.length(iv.from_columns(kernels, kernels.on_device & (kernels.device == d)), start, end) / (end - start)
            for d in devices[np.sort(first)].tolist()}  # in the order the devices first appear

"""Communication: collectives per step (count, bytes), and their time split into overlapped with compute
and exposed (nothing else computing then: the rank waits).

Collectives are seen three ways: the host's `nccl:*` / `gloo:*` annotations (gloo runs them on its own
threads, so on the CPU their spans are the collective's time), NCCL/RCCL kernels on the device, and the
device work launched by a collective annotation. Compute is what the rank would otherwise be doing: kernels
and memsets on an accelerator; on the CPU, its operators (the step's thread computes while gloo's threads
reduce). Exposed communication is communication time with no compute and no DataLoader wait under it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from advisor.analysis import intervals as iv
from advisor.analysis.breakdown import collective_kind
from advisor.analysis.events import input_lists
from advisor.analysis.steps import Step, starts_in_steps
from advisor.analysis.trace import Trace

# Bytes per element of the dtypes the profiler names in "Input type".
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
               "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1,
               "c10::Float8_e5m2": 1}


@dataclass(frozen=True)
class Collective:
    """One kind of collective (all_reduce, broadcast, ...): calls and bytes per step."""

    name: str
    count: float  # calls per step
    bytes: float | None  # bytes per step, None when the trace records no input shapes or dtypes
    largest: float | None  # the largest single call's bytes


@dataclass(frozen=True)
class Communication:
    """A rank's communication: who it is, its collectives and their time per step (µs)."""

    backend: str | None
    rank: int | None
    world_size: int | None
    total_us: float  # communication time per step (any collective in flight)
    exposed_us: float  # ... with nothing computing and no DataLoader wait: the rank only waits
    collectives: tuple[Collective, ...]

    @property
    def overlapped_us(self) -> float:
        """Communication time hidden behind compute."""
        return max(0.0, self.total_us - self.exposed_us)

    @property
    def count(self) -> float:
        """Collective calls per step."""
        return sum(c.count for c in self.collectives)

    @property
    def bytes(self) -> float | None:
        """Bytes the collectives move per step (None when unknown)."""
        sizes = [c.bytes for c in self.collectives]
        return None if not sizes or any(b is None for b in sizes) else sum(sizes)


def collective_bytes(args) -> float | None:
    """Bytes of a collective's first input (the tensor, or the bucket, it reduces), from its annotation's
    "Input Dims" and "Input type"; None when the trace did not record shapes."""
    found = input_lists(args, "input_dims", "input_type")
    if found is None:
        return None
    dims, types = found
    if not dims or not types or not isinstance(dims[0], list) or types[0] not in DTYPE_BYTES:
        return None
    shape = dims[0]
    if shape and isinstance(shape[0], list):  # a list of tensors: the first one
        shape = shape[0]
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        return None
    return float(math.prod(shape) * DTYPE_BYTES[types[0]])


def collectives(trace: Trace, steps: list[Step]) -> tuple[Collective, ...]:
    """Collective calls per step by kind, from the host's collective annotations inside the steps."""
    found: dict[str, list[float | None]] = {}
    ops = trace.columns["ops"]
    for i in np.flatnonzero(ops.where_name(collective_kind) & starts_in_steps(ops.ts, steps)).tolist():
        op = trace.ops[i]
        found.setdefault(collective_kind(op.name), []).append(collective_bytes(op.args))
    n = len(steps) or 1
    out = []
    for name, sizes in sorted(found.items(), key=lambda kv: -len(kv[1])):
        known = None if any(b is None for b in sizes) else sum(sizes) / n
        largest = None if known is None else max(sizes)
        out.append(Collective(name, len(sizes) / n, known, largest))
    return tuple(out)


def communication(trace: Trace, steps: list[Step], roles: dict[str, iv.Intervals],
                  platform: str) -> Communication | None:
    """The rank's communication figures; None when the trace shows no collective and no process group."""
    comm = roles["communication"]
    info = trace.distributed or {}
    if not comm[0].size and not info:
        return None
    windows = iv.from_spans((s.start, s.end) for s in steps)
    n = len(steps) or 1
    if platform == "cpu":
        busy = iv.union(roles["cpu_op"], roles["dataloader"])
    else:
        busy = iv.union(roles["kernel"], roles["memset"], roles["dataloader"])
    total = iv.length_within(comm, windows)
    hidden = iv.length_within(iv.union(comm, busy), windows) - iv.length_within(busy, windows)
    return Communication(
        backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
        rank=info.get("rank") if isinstance(info.get("rank"), int) else None,
        world_size=info.get("world_size") if isinstance(info.get("world_size"), int) else None,
        total_us=total / n,
        exposed_us=max(0.0, hidden) / n,
        collectives=collectives(trace, steps),
    )

"""Host-to-device copies: time by host memory kind, bytes, and where the host blocked on them."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from advisor.analysis import intervals as iv
from advisor.analysis.events import Event
from advisor.analysis.columns import among, distinct
from advisor.analysis.steps import Step, starts_in_steps
from advisor.analysis.trace import Trace

SYNC_CALL = re.compile(r"(cuda|hip)(Stream|Device|Event)Synchronize$")
HTOD = "HtoD"


@dataclass(frozen=True)
class Copies:
    """Host-to-device copies per average step."""

    pageable_us: float = 0.0
    pinned_us: float = 0.0
    unknown_us: float = 0.0  # 'Host -> Device' (ROCm) does not say whether the host memory was pinned
    count: float = 0.0
    bytes: float | None = None
    synchronous: float = 0.0  # copies the host waited for, per step
    # The host's wait, per step: blocking copy calls and synchronizes right after async ones (what
    # non_blocking=True removes, given pinned memory) ...
    sync_wait_us: float = 0.0
    # ... and the async copy calls from pageable memory, inside which the host stages the data itself
    # (what pin_memory=True removes).
    pageable_wait_us: float = 0.0
    overlap_with_kernels: float | None = None  # share of copy time that ran alongside a kernel
    exposed_us: float = 0.0  # copies and the host's waits on them with no kernel running, per step

    @property
    def host_wait_us(self) -> float:
        """All host time blocked by host-to-device copies per step."""
        return self.sync_wait_us + self.pageable_wait_us

    @property
    def total_us(self) -> float:
        """All host-to-device copy time per step."""
        return self.pageable_us + self.pinned_us + self.unknown_us


def _copy_kind(name: str) -> str | None:
    if HTOD not in name:
        return None
    if "Pageable" in name:
        return "pageable"
    if "Pinned" in name:
        return "pinned"
    return "unknown"


@dataclass(frozen=True)
class CopyEvents:
    """The steps' host-to-device copies and the runtime calls in which the host waited for them."""

    copies: tuple[Event, ...] = ()  # device-side copies inside the steps
    sync_waits: tuple[Event, ...] = ()  # blocking copy calls, synchronizes right after async copy calls
    pageable_waits: tuple[Event, ...] = ()  # async copy calls from pageable memory (the host stages the data)
    blocked: int = 0  # copy calls the host waited on, in all


def copy_events(trace: Trace, steps: list[Step]) -> CopyEvents:
    """Host-to-device copies in the steps, and where the host blocked on them.

    The host blocks on a copy inside a blocking memcpy call, inside an async copy call from pageable
    memory (the driver stages the data through a pinned buffer before the call returns: the call lasts
    about as long as the copy), and in a synchronize that directly follows the async copy call on the same
    thread (what `.to(device)` does without non_blocking).
    """
    memcpys, runtime = trace.columns["memcpys"], trace.columns["runtime"]
    kind_of_copy = memcpys.name_classes(_copy_kind)
    copies = [trace.memcpys[i] for i in np.flatnonzero((kind_of_copy != None) & starts_in_steps(memcpys.ts, steps)).tolist()]  # noqa: E711
    kind_by_id = {}  # the last copy with an id decides its kind
    for i in np.flatnonzero((kind_of_copy != None) & (memcpys.correlation != -1)).tolist():  # noqa: E711
        kind_by_id[int(memcpys.correlation[i])] = kind_of_copy[i]
    sync_waits, pageable_waits = [], []
    blocked = 0
    ids = np.fromiter(kind_by_id, np.int64, len(kind_by_id))
    calls = np.flatnonzero(among(runtime.correlation, ids) & starts_in_steps(runtime.ts, steps))
    if calls.size:
        # Each call's next call on its thread; calls taken thread by thread (threads in the order they first
        # call), in order, as the waits were always gathered.
        by_thread = np.argsort(runtime.tid, kind="stable")
        following = np.full(len(runtime), -1)
        same = runtime.tid[by_thread[1:]] == runtime.tid[by_thread[:-1]]
        following[by_thread[:-1][same]] = by_thread[1:][same]
        _, first = np.unique(runtime.tid, return_index=True)
        thread_rank = np.empty(first.size, dtype=np.int64)
        thread_rank[np.argsort(first)] = np.arange(first.size)
        rank = thread_rank[np.searchsorted(distinct(runtime.tid), runtime.tid[calls])]
        calls = calls[np.lexsort((calls, rank))]
        is_sync = runtime.where_name(SYNC_CALL.search)
        for i in calls.tolist():
            r = trace.runtime[i]
            kind = kind_by_id[int(runtime.correlation[i])]
            if "Async" not in r.name:
                sync_waits.append(r)
                blocked += 1
                continue
            after = following[i]
            synchronized = bool(after >= 0 and is_sync[after])
            if synchronized:
                sync_waits.append(trace.runtime[after])
            if kind == "pageable":
                pageable_waits.append(r)
            blocked += synchronized or kind == "pageable"
    return CopyEvents(tuple(copies), tuple(sync_waits), tuple(pageable_waits), blocked)


def host_to_device_copies(events: CopyEvents, steps: list[Step], kernel_intervals: iv.Intervals) -> Copies:
    """Host-to-device copy time by host memory kind, bytes, the host's waits and kernel overlap, per step."""
    n = len(steps)
    per_kind = defaultdict(float)
    byte_total, byte_known = 0.0, True
    for c in events.copies:
        per_kind[_copy_kind(c.name)] += c.dur
        if c.args is not None and c.args.bytes is not None:
            byte_total += c.args.bytes
        else:
            byte_known = False
    merged = iv.from_events(list(events.copies))
    copy_time = iv.length(merged)
    overlap = iv.overlap(merged, kernel_intervals) / copy_time if copy_time else None
    windows = iv.from_spans((s.start, s.end) for s in steps)
    busy = iv.union(merged, iv.from_events(list(events.sync_waits + events.pageable_waits)))
    exposed = iv.length_within(iv.union(busy, kernel_intervals), windows) - iv.length_within(kernel_intervals, windows)
    count = len(events.copies)
    return Copies(
        pageable_us=per_kind["pageable"] / n,
        pinned_us=per_kind["pinned"] / n,
        unknown_us=per_kind["unknown"] / n,
        count=count / n,
        bytes=(byte_total / n) if count and byte_known else None,
        synchronous=events.blocked / n,
        sync_wait_us=sum(r.dur for r in events.sync_waits) / n,
        pageable_wait_us=sum(r.dur for r in events.pageable_waits) / n,
        overlap_with_kernels=overlap,
        exposed_us=max(exposed, 0.0) / n,
    )

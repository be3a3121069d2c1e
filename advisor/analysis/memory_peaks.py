"""Memory: peaks per device from the trace's `[memory]` events, and what the trial says of its growth."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.analysis.devices import Device
from advisor.analysis.trace import Trace


@dataclass(frozen=True)
class DeviceMemory:
    """Peak memory of one device, from the trace's `[memory]` events."""

    device: str  # "cuda:1", "cpu"
    peak_allocated: float | None
    peak_reserved: float | None
    capacity: float | None
    growth: float | None = None  # peak rise of allocations during the trace, when no totals are recorded
    # Allocated bytes over time (ms from the trace start), at most TIMELINE_POINTS points keeping each
    # bucket's maximum so that peaks survive; net allocations from their lowest point when the trace records no totals.
    timeline_ms: tuple[float, ...] = ()
    timeline_bytes: tuple[float, ...] = ()

    @property
    def headroom(self) -> float | None:
        """1 − peak allocated / capacity (allocated, not reserved: the caching allocator can release); None
        when either is unknown, or the peak exceeds the capacity (one of them is wrong)."""
        if self.peak_allocated is None or not self.capacity or self.peak_allocated > self.capacity:
            return None
        return 1.0 - self.peak_allocated / self.capacity


TIMELINE_POINTS = 400


def downsample_max(times: list[float], values: list[float], points: int = TIMELINE_POINTS,
                   ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """At most `points` samples: the maximum of each equal-time bucket, the first on ties (peaks are what
    matter). `times` ascend."""
    if len(times) <= points:
        return tuple(times), tuple(values)
    t, v = np.asarray(times, dtype=float), np.asarray(values, dtype=float)
    width = (t[-1] - t[0]) / points or 1.0
    bucket = np.minimum(((t - t[0]) / width).astype(np.int64), points - 1)
    # By bucket, then largest value, then earliest: the first row of each bucket is the one kept.
    order = np.lexsort((np.arange(t.size), -v, bucket))
    ordered = bucket[order]
    kept = order[np.concatenate(([True], ordered[1:] != ordered[:-1]))]
    return tuple(t[kept].tolist()), tuple(v[kept].tolist())


def memory_peaks(trace: Trace, devices: list[Device]) -> list[DeviceMemory]:
    """Peak allocated/reserved per device from `[memory]` events, against the device's capacity."""
    capacity = {d.index: d.total_memory for d in devices}
    m = trace.memory
    if m is None or not len(m):
        return []
    # By device (type, then id), each device's samples by time, in file order where times tie.
    order = np.lexsort((m.ts, m.device_id, m.device_type))
    kinds, ids = m.device_type[order], m.device_id[order]
    starts = np.flatnonzero(np.concatenate(([True], (kinds[1:] != kinds[:-1]) | (ids[1:] != ids[:-1]))))
    out = []
    for first, end in zip(starts.tolist(), starts[1:].tolist() + [order.size]):
        samples = order[first:end]
        dtype, did = kinds[first].item(), ids[first].item()
        name = "cpu" if dtype == 0 else f"cuda:{did}" if dtype == 1 else f"device{dtype}:{did}"
        ts, allocated, reserved = m.ts[samples], m.total_allocated[samples], m.total_reserved[samples]
        known = ~np.isnan(allocated)
        reserved = reserved[~np.isnan(reserved)]
        growth = None
        if known.any():
            times, values = ts[known], allocated[known]
        else:
            # Net allocations since the trace began. Frees of memory allocated before it make the sum dip
            # below zero: the growth is the largest rise above the lowest point so far, and the timeline
            # counts from the lowest point, so neither is ever negative.
            running = np.cumsum(m.bytes[samples])  # added in time order, one by one
            lowest = np.minimum.accumulate(np.concatenate(([0.0], running)))[1:]
            growth = max(0.0, float((running - lowest).max()))
            times, values = ts, running - lowest[-1]
        times, values = downsample_max(((times - ts[0]) / 1000).tolist(), values.tolist())
        out.append(DeviceMemory(
            device=name,
            peak_allocated=float(allocated[known].max()) if known.any() else None,
            peak_reserved=float(reserved.max()) if reserved.size else None,
            capacity=capacity.get(did) if dtype != 0 else None,
            growth=growth,
            timeline_ms=times,
            timeline_bytes=values,
        ))
    return out


MEMORY_NEARLY_GONE = 0.05  # headroom below this share of device memory
LEAK_BYTES_PER_STEP = 1 << 20  # growth below 1 MiB a step is allocator noise, not a leak
LEAK_R2 = 0.9


def memory_leak(trial: dict | None) -> dict | None:
    """The trial's memory growth when it is a leak (about the same rise every step), else None."""
    growth = ((trial or {}).get("summary") or {}).get("memory_growth") or {}
    per_step = growth.get("bytes_per_step") or 0.0
    median_diff = growth.get("median_difference_bytes") or 0.0
    # A leak grows by about the same amount every step; a one-off jump (optimizer state created on the
    # first step) has a slope but no typical step-to-step difference.
    if per_step < LEAK_BYTES_PER_STEP or median_diff < LEAK_BYTES_PER_STEP / 2 or (growth.get("r2") or 0) < LEAK_R2:
        return None
    return growth


def memory_pressure(trial: dict | None, memory: list[DeviceMemory]) -> str | None:
    """Why memory binds (out of memory, headroom nearly gone, a leak), or None."""
    if (trial or {}).get("status") == "oom":
        return "the trial ran out of memory"
    steps = ((trial or {}).get("summary") or {}).get("accumulation_steps")
    if steps not in (None, 1):
        return f"the batch runs as {steps} micro-batches with gradient accumulation to fit in memory"
    for m in memory:
        if m.device != "cpu" and m.headroom is not None and m.headroom < MEMORY_NEARLY_GONE:
            return (f"peak memory {m.peak_allocated / 1e9:.2f} GB of {m.capacity / 1e9:.1f} GB on {m.device} "
                    f"({100 * m.headroom:.1f}% free)")
    leak = memory_leak(trial)
    if leak is not None:
        return (f"memory grows {leak['bytes_per_step'] / 2**20:.1f} MiB per step: the run ends out of memory "
                "however much there is")
    return None

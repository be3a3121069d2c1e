"""Time-interval arithmetic on sorted, disjoint intervals held as two numpy arrays (starts, ends).

Everything the breakdown needs reduces to two vectorized operations, union and clipped length:
the time role k gets under the priority scheme is |roles ≤ k| − |roles < k| within a step.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Iterable

import numpy as np

START, DURATION = attrgetter("ts"), attrgetter("dur")

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.empty(0), np.empty(0))


def from_spans(spans: Iterable[tuple[float, float]]) -> Intervals:
    """Merged intervals from (start, end) pairs."""
    pairs = np.array(list(spans), dtype=float).reshape(-1, 2)
    return merge(pairs[:, 0], pairs[:, 1])


def from_events(events) -> Intervals:
    """Merged intervals covered by trace events (objects with .ts and .dur)."""
    n = len(events)
    # map over attrgetter: about twice as fast as a generator expression over a hundred thousand events.
    starts = np.fromiter(map(START, events), float, n)
    ends = starts + np.fromiter(map(DURATION, events), float, n)
    return merge(starts, ends)


def from_columns(columns, mask=None) -> Intervals:
    """Merged intervals covered by a group of a Trace's events (`advisor.analysis.columns.Columns`), or by
    those of them a boolean mask selects."""
    if mask is None:
        return merge(columns.ts, columns.end)
    return merge(columns.ts[mask], columns.end[mask])


def merge(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Union of possibly overlapping intervals, as sorted disjoint arrays."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    # A new interval begins where a start lies beyond everything that came before it.
    new = np.empty(starts.size, dtype=bool)
    new[0] = True
    new[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, starts.size - 1)
    return starts[first], reach[last]


def union(*parts: Intervals) -> Intervals:
    """Union of several interval sets."""
    parts = [p for p in parts if p[0].size]
    if not parts:
        return EMPTY
    return merge(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def length(a: Intervals, lo: float = -np.inf, hi: float = np.inf) -> float:
    """Total length of `a` inside [lo, hi]."""
    if a[0].size == 0:
        return 0.0
    return float(np.clip(np.minimum(a[1], hi) - np.maximum(a[0], lo), 0, None).sum())


def length_within(a: Intervals, windows: Intervals) -> float:
    """Total length of `a` inside a set of disjoint windows."""
    return sum(length(a, lo, hi) for lo, hi in zip(windows[0], windows[1]))


def overlap(a: Intervals, b: Intervals) -> float:
    """Length of a ∩ b, as |a| + |b| − |a ∪ b|."""
    if a[0].size == 0 or b[0].size == 0:
        return 0.0
    return max(0.0, length(a) + length(b) - length(union(a, b)))


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """a ∩ b: every overlapping pair, found with two binary searches per interval of `a`."""
    (a_starts, a_ends), (b_starts, b_ends) = a, b
    if a_starts.size == 0 or b_starts.size == 0:
        return EMPTY
    first = np.searchsorted(b_ends, a_starts, side="right")  # the first of b ending after each a starts
    last = np.searchsorted(b_starts, a_ends, side="left")  # past the last of b starting before it ends
    counts = np.maximum(last - first, 0)
    total = int(counts.sum())
    if total == 0:
        return EMPTY
    ai = np.repeat(np.arange(a_starts.size), counts)
    offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    bi = np.repeat(first, counts) + offsets
    starts = np.maximum(a_starts[ai], b_starts[bi])
    ends = np.minimum(a_ends[ai], b_ends[bi])
    keep = ends > starts
    return starts[keep], ends[keep]


def difference(a: Intervals, b: Intervals, lo: float, hi: float) -> Intervals:
    """a ∖ b within [lo, hi]."""
    b_starts, b_ends = b
    gap_starts = np.maximum(np.concatenate([[lo], b_ends]), lo)
    gap_ends = np.minimum(np.concatenate([b_starts, [hi]]), hi)
    keep = gap_ends > gap_starts
    return intersect(a, (gap_starts[keep], gap_ends[keep]))

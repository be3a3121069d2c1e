"""Interval arithmetic against a brute-force count on a grid: union, intersection, difference, lengths."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.analysis import intervals as iv

SPANS = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)).map(sorted), max_size=12)


def covered(intervals: iv.Intervals) -> set[int]:
    """Unit cells [k, k+1) the intervals cover (all ends are integers here)."""
    return {k for a, b in zip(*intervals) for k in range(int(a), int(b))}


def cells(spans) -> set[int]:
    return {k for a, b in spans for k in range(a, b)}


@settings(max_examples=200, deadline=None)
@given(a=SPANS, b=SPANS, window=st.tuples(st.integers(0, 60), st.integers(0, 60)).map(sorted))
def test_intersection_and_difference_match_a_grid(a, b, window):
    ia, ib = iv.from_spans(a), iv.from_spans(b)
    lo, hi = window
    assert covered(iv.intersect(ia, ib)) == cells(a) & cells(b)
    assert covered(iv.difference(ia, ib, lo, hi)) == (cells(a) - cells(b)) & set(range(lo, hi))
    assert iv.length(iv.union(ia, ib)) == len(cells(a) | cells(b))
    assert iv.overlap(ia, ib) == len(cells(a) & cells(b))
    # Results are sorted and disjoint, as every other function expects.
    starts, ends = iv.intersect(ia, ib)
    assert np.all(ends > starts) and np.all(starts[1:] >= ends[:-1])

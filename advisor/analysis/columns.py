"""A Trace's events as numpy columns, made once as the trace is loaded: each group's starts, ends and names.

The figures select and measure events with array operations on these (a mask of the kernels inside the
steps, the intervals of the runtime calls that launch kernels) instead of each looping over tens of
thousands of events again. A name is tested once per distinct name (`Columns.where_name`), not once per
event: a trace repeats a few hundred names.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import count
from operator import attrgetter

import numpy as np

NAME = attrgetter("name")
CATEGORY = attrgetter("cat")
ANNOTATION = "user_annotation"  # the category of the ops that are annotations, not operators


@dataclass(frozen=True, eq=False)
class Columns:
    """One group of events (a Trace's ops, runtime calls, kernels, ...), in its order, as arrays."""

    ts: np.ndarray  # start, µs
    dur: np.ndarray  # length, µs
    end: np.ndarray  # ts + dur, µs
    names: tuple[str, ...]  # the group's distinct names, in order of first appearance
    name_code: np.ndarray  # per event: its name's index in `names`
    tid: np.ndarray  # per event: its thread, as an integer alike in all groups of a trace (`id_columns`)
    # Per event: its correlation id likewise, -1 where it has none; runtime calls and device activity only
    # (None for the steps and operators, which the analysis never links so).
    correlation: np.ndarray | None
    # Per event of device activity (kernels, copies, memsets): the device that ran it ('device' in its
    # arguments, else its 'pid'), where that is an integer (`on_device`); None for the other groups.
    device: np.ndarray | None = None
    on_device: np.ndarray | None = None
    # Per operator (the ops group only, None for the others): whether it is a user annotation (category
    # 'user_annotation': '## forward ##', 'Optimizer.step#...'), not an operator.
    annotation: np.ndarray | None = None
    # Per kernel (None for the other groups, or where one is not an integer): its 'External id'.
    external_id: np.ndarray | None = None

    def __len__(self) -> int:
        return self.ts.size

    def where_name(self, test) -> np.ndarray:
        """Which events have a name that passes `test` (called once per distinct name)."""
        if not self.names:
            return np.zeros(self.ts.size, dtype=bool)
        return np.array([bool(test(name)) for name in self.names], dtype=bool)[self.name_code]

    def name_classes(self, classify) -> np.ndarray:
        """`classify(name)` per event, as an object array (called once per distinct name)."""
        table = np.empty(len(self.names), dtype=object)
        table[:] = [classify(name) for name in self.names]
        return table[self.name_code]


def columns_of(events: list, ts: np.ndarray, dur: np.ndarray, tid: np.ndarray, correlation: np.ndarray | None,
               device: np.ndarray | None = None, on_device: np.ndarray | None = None,
               names: tuple[tuple[str, ...], np.ndarray] | None = None, annotation: np.ndarray | None = None,
               external_id: np.ndarray | None = None) -> Columns:
    """The Columns of `events`, whose starts, durations, threads and correlation ids are the arrays given (in
    the events' order); `names`: their distinct names and each one's code, where the caller has them;
    `annotation`, `external_id`: see `Columns`."""
    if names is None:
        codes: defaultdict[str, int] = defaultdict(count().__next__)  # a new name gets the next code
        name_code = np.fromiter(map(codes.__getitem__, map(NAME, events)), np.int32, len(events))
        names = tuple(codes), name_code
    return Columns(ts, dur, ts + dur, *names, tid, correlation, device, on_device, annotation, external_id)


EXTERNAL_ID = attrgetter("args.external_id")


def external_ids(events: list) -> list:
    """Each event's external id (`Event.external_id`), read with one getter where every event has one in its
    arguments (as Kineto writes them)."""
    try:
        ids = list(map(EXTERNAL_ID, events))
    except AttributeError:  # an event without arguments
        ids = [None]
    return ids if None not in ids else [e.external_id for e in events]


def with_external_id(columns: Columns, events: list, ids: set) -> np.ndarray:
    """Which of the events (whose Columns are given) have an external id among `ids`: on the column where it has
    one and all the ids are integers, else from each event."""
    if columns.external_id is not None and all(type(i) is int for i in ids):
        try:
            return among(columns.external_id, np.fromiter(ids, np.int64, len(ids)))
        except OverflowError:  # an id beyond 64 bits
            pass
    return np.fromiter(map(ids.__contains__, external_ids(events)), bool, len(events))


TID = attrgetter("tid")
LINKED = ("runtime", "kernels", "memcpys", "memsets")  # the groups whose events have correlation ids


def correlation_of(event):
    """The id that links a runtime call to the device activity it launched (None where there is none)."""
    args = event.args
    return None if args is None else args.correlation


def correlations(events: list) -> list:
    """Each event's correlation id (None where it has none)."""
    try:
        return list(map(CORRELATION, events))  # every runtime call and device event of Kineto's has arguments
    except AttributeError:
        return list(map(correlation_of, events))


CORRELATION = attrgetter("args.correlation")


def id_columns(values: list[list]) -> list[np.ndarray]:
    """Lists of ids (tids, correlation ids) as integer arrays, equal where the ids are, -1 for None: the ids
    themselves where all are integers of 0 or more (as in Kineto's traces), else codes of their values."""
    arrays = list(map(whole_ids, values))
    if all(array is not None for array in arrays):
        return arrays
    arrays = []
    for v in values:
        types = set(map(type, v))
        if not types <= {int, type(None)}:
            break  # text: codes instead
        nones = v.count(None) if type(None) in types else 0
        try:
            array = np.array([-1 if x is None else x for x in v] if nones else v, dtype=np.int64).reshape(-1)
        except OverflowError:  # an integer beyond 64 bits
            break
        if array.size and (array.min() < -1 or int((array == -1).sum()) != nones):
            break  # a negative id of the trace's own: codes instead
        arrays.append(array)
    else:
        return arrays
    codes: dict = {None: -1}
    return [np.fromiter((codes.setdefault(x, len(codes) - 1) for x in v), np.int64, len(v)) for v in values]


def whole_ids(ids: list) -> np.ndarray | None:
    """The ids as an integer array where all are integers of 0 or more (as in Kineto's traces), else None.

    numpy tells the type of the values as it reads them (integers, or text, None, integers beyond 64 bits),
    which is cheaper than asking each value its type first."""
    if not ids:
        return np.zeros(0, dtype=np.int64)
    try:
        array = np.array(ids)
    except (OverflowError, ValueError):
        return None
    if array.dtype.kind != "i" or array.ndim != 1 or array.min() < 0:
        return None
    return array.astype(np.int64, copy=False)


def rightmost_above(values: np.ndarray, last: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    """For each query i: the largest j <= last[i] with values[j] > threshold[i], or -1 where there is none.

    Binary lifting over a table of running maxima (level k holds the maximum of the 2**k values ending at each
    position): every query moves left past whole blocks whose maximum is at most its threshold."""
    levels = [values]
    width = 1
    while width < values.size:
        below = levels[-1]
        level = below.copy()
        level[width:] = np.maximum(below[width:], below[:-width])
        levels.append(level)
        width *= 2
    position = last.copy()
    for k in range(len(levels) - 1, -1, -1):
        inside = position >= 0
        skip = inside & (levels[k][np.clip(position, 0, None)] <= threshold)
        position = np.where(skip, position - (1 << k), position)
    return np.where(position >= 0, position, -1)


def in_windows(ts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which times fall in one of the sorted, disjoint windows [start, end)."""
    i = np.searchsorted(starts, ts, side="right") - 1
    return (i >= 0) & (ts < ends[np.clip(i, 0, None)])


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted (np.unique without its flags imports numpy.ma, a tenth of the import of numpy)."""
    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if ordered.size else ordered


def among(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Which values are among the wanted ones (np.isin, without the import of numpy.ma it may make)."""
    wanted = distinct(wanted)
    if not wanted.size:
        return np.zeros(values.shape, dtype=bool)
    at = np.clip(np.searchsorted(wanted, values), 0, wanted.size - 1)
    return wanted[at] == values


@dataclass(frozen=True, eq=False)
class MemorySamples:
    """A trace's `[memory]` instant events, in file order: allocations (bytes > 0) and frees (bytes < 0)."""

    ts: np.ndarray  # µs from the trace's origin
    device_type: np.ndarray  # 0 = CPU, 1 = CUDA (Kineto's c10::DeviceType)
    device_id: np.ndarray  # -1 where unknown
    bytes: np.ndarray
    total_allocated: np.ndarray  # NaN where the event does not record it
    total_reserved: np.ndarray

    def __len__(self) -> int:
        return self.ts.size


MEMORY_FIELDS = ("device_type", "device_id", "alloc_bytes", "total_allocated", "total_reserved")
ARGS = attrgetter("args")


def memory_fields(events: list) -> dict[str, list]:
    """Each argument of the `[memory]` events that the analysis reads (`MEMORY_FIELDS`), per event: None where an
    event has no arguments. Read once, for the check of their byte counts and for the MemorySamples."""
    args = list(map(ARGS, events))
    fields = {}
    for name in MEMORY_FIELDS:
        try:
            fields[name] = list(map(attrgetter(name), args))
        except AttributeError:  # an event without arguments
            fields[name] = [None if a is None else getattr(a, name) for a in args]
    return fields


def memory_samples(events: list, origin, scale: float, fields: dict[str, list]) -> MemorySamples:
    """The MemorySamples of `[memory]` events whose times are rewritten as (ts - origin) * scale (`fields`: their
    `memory_fields`)."""
    field = fields.__getitem__
    if scale == 1.0 and origin == 0:
        ts = np.fromiter(map(attrgetter("ts"), events), float, len(events))
    else:  # integer nanoseconds since the epoch: the origin taken off exactly, as integers, first
        ts = np.array([(e.ts - origin) * scale for e in events], dtype=float).reshape(-1)
    return MemorySamples(
        ts=ts, device_type=whole_numbers(field("device_type"), 0), device_id=whole_numbers(field("device_id"), -1),
        bytes=np.nan_to_num(np.array(field("alloc_bytes"), dtype=float).reshape(-1), nan=0.0),  # None: 0
        total_allocated=np.array(field("total_allocated"), dtype=float).reshape(-1),  # None: NaN
        total_reserved=np.array(field("total_reserved"), dtype=float).reshape(-1))


def whole_numbers(values: list, default: int) -> np.ndarray:
    """`int(value)` of each value, `default` where that fails (None, text that is not a number)."""
    if set(map(type, values)) <= {int}:
        try:
            return np.array(values, dtype=np.int64).reshape(-1)
        except OverflowError:
            pass
    out = []
    for value in values:
        try:
            out.append(int(value))
        except (TypeError, ValueError):
            out.append(default)
    return np.array(out, dtype=object if any(abs(v) >= 2**63 for v in out) else np.int64).reshape(-1)


DEVICE_GROUPS = ("kernels", "memcpys", "memsets")


def device_of(event):
    """The device that ran an event of device activity: 'device' in its arguments, else its 'pid'."""
    args = event.args
    device = None if args is None else args.device
    return event.pid if device is None else device


DEVICE = attrgetter("args.device")


def devices_of(events: list) -> tuple[np.ndarray, np.ndarray]:
    """(device of each event where it is an integer, which events have one) (`device_of`)."""
    try:
        values = list(map(DEVICE, events))  # Kineto's device activity has its device in its arguments
    except AttributeError:  # an event without arguments
        values = [None]
    if None in values:
        values = list(map(device_of, events))
    if set(map(type, values)) <= {int}:
        known = np.ones(len(values), dtype=bool)
    else:
        known = np.fromiter((type(v) is int for v in values), bool, len(values))
        values = [v if type(v) is int else 0 for v in values]
    try:
        return np.array(values, dtype=np.int64).reshape(-1), known
    except OverflowError:  # an integer beyond 64 bits: kept as it is
        return np.array(values, dtype=object).reshape(-1), known

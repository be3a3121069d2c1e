"""A trace's events sorted into the groups the analysis reads as they are decoded, with the fields its columns need.

A gzipped trace is decoded a run of about a thousand events at a time (`events.decode_pieces`), and each run is
handed to `EventSorter.add` at once: the events just made are still in the processor's cache, where reading
their times, threads, ids and names costs a third of reading them afterwards from all of a trace's events,
by then mostly out of the cache (40 ms of the 54 MB test trace's reading). A field that is not as Kineto writes
it (a missing time, an id that is text, None or beyond 64 bits) is left unread for the whole trace, and
`trace.build_trace` reads it from the events afterwards as it did before, to the same result.
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from itertools import count
from operator import attrgetter

import numpy as np

from advisor.analysis.columns import ANNOTATION, CATEGORY, DEVICE_GROUPS, LINKED, NAME, MemorySamples
from advisor.analysis.events import Event, Instant, LooseEvent, kind_of

GROUPS = ("steps", "ops", "runtime", "kernels", "memcpys", "memsets")  # a Trace's groups of timed events
GROUP_OF_KIND = {"op": "ops", "annotation": "ops", "runtime": "runtime", "kernel": "kernels", "memcpy": "memcpys",
                 "memset": "memsets"}
# The fields read as events arrive: (getter, type: 'd' float, 'q' 64-bit integer, groups that have it). Floats are
# read a run at a time by numpy (None: NaN, as `validation.floats_of` reads them), integers into an array.array,
# which takes integers only (numpy would read 1.5 or '7' as an integer too).
FIELDS = {"ts": (attrgetter("ts"), "d", GROUPS), "dur": (attrgetter("dur"), "d", GROUPS),
          "tid": (attrgetter("tid"), "q", GROUPS), "correlation": (attrgetter("args.correlation"), "q", LINKED),
          "device": (attrgetter("args.device"), "q", DEVICE_GROUPS),
          "external_id": (attrgetter("args.external_id"), "q", ("kernels",))}
# Of the `[memory]` instants: their time and the allocator's fields (`columns.MEMORY_FIELDS`).
MEMORY = {"ts": (attrgetter("ts"), "d"), "device_type": (attrgetter("args.device_type"), "q"),
          "device_id": (attrgetter("args.device_id"), "q"), "alloc_bytes": (attrgetter("args.alloc_bytes"), "d"),
          "total_allocated": (attrgetter("args.total_allocated"), "d"),
          "total_reserved": (attrgetter("args.total_reserved"), "d")}
PID = attrgetter("pid")
# A field that cannot be read so: no arguments; None, text or a float for an integer; a number too big.
UNREADABLE = (AttributeError, TypeError, OverflowError, ValueError)


class EventSorter:
    """Sorts runs of decoded events (`add`), in file order, into a Trace's groups and its `[memory]` instants,
    reading their fields as they come."""

    def __init__(self) -> None:
        self.groups: dict[str, list] = {name: [] for name in GROUPS}
        self.memory: list = []  # the `[memory]` instants
        self.group_of_category: dict = {}  # a category's group, None for those the analysis skips; filled as met
        self.read = {field: {name: new_values(code) for name in groups} for field, (_, code, groups) in FIELDS.items()}
        self.codes = {name: defaultdict(count().__next__) for name in GROUPS}  # a new name gets the next code
        self.name_code = {name: array("i") for name in GROUPS}  # per event: its name's code, in file order
        self.memory_read = {field: new_values(code) for field, (_, code) in MEMORY.items()}
        self.unread: set[str] = set()  # fields left to read afterwards ("memory": the instants' fields)
        self.annotation = array("b")  # per operator: whether it is a user annotation (`Columns.annotation`)
        self.host_pids: set = set()  # the processes ('pid') of the operators and runtime calls

    def add(self, events: list) -> None:
        """Sort a run of events (the next ones in the file) and read their fields."""
        run: dict[str, list] = {name: [] for name in GROUPS}
        ops, steps, memory = run["ops"], run["steps"], []
        buckets = {cat: None if group is None else run[group] for cat, group in self.group_of_category.items()}
        for e in events:
            kind = type(e)  # its phase (`events.Event` is 'X')
            if kind is LooseEvent:  # decoded loose: its phase is a field
                kind = Event if e.ph == "X" else Instant if e.ph == "i" else None
            if kind is Event:
                cat = e.cat
                bucket = buckets.get(cat, False)
                if bucket is False:
                    group = self.group_of_category[cat] = GROUP_OF_KIND.get(kind_of(cat))
                    bucket = buckets[cat] = None if group is None else run[group]
                if bucket is None:
                    continue
                if bucket is ops and e.name.startswith("ProfilerStep#"):
                    bucket = steps
                bucket.append(e)
            elif kind is Instant and e.name == "[memory]":
                memory.append(e)
        self.annotation.extend(map(ANNOTATION.__eq__, map(CATEGORY, ops)))
        self.host_pids.update(map(PID, ops), map(PID, run["runtime"]))
        for name, new in run.items():
            if new:
                self.groups[name] += new
                self.name_code[name].extend(map(self.codes[name].__getitem__, map(NAME, new)))
                for field, (get, _, groups) in FIELDS.items():
                    if name in groups:
                        self.read_into(field, self.read[field][name], get, new)
        if memory:
            self.memory += memory
            for field, (get, _) in MEMORY.items():
                self.read_into("memory", self.memory_read[field], get, memory)

    def read_into(self, field: str, values: array | list, get, events: list) -> None:
        """Append each event's `get` to `values` (`new_values`), or leave `field` unread where one does not fit."""
        if field not in self.unread:
            try:
                if isinstance(values, list):
                    values.append(np.fromiter(map(get, events), np.float64, len(events)))
                else:
                    values.extend(map(get, events))
            except UNREADABLE:
                self.unread.add(field)

    def values(self, field: str, name: str, order: np.ndarray | None = None) -> np.ndarray | None:
        """A field of a group as read, in `order` (the group's sorted order); None where it was left unread."""
        if field in self.unread:
            return None
        values = as_array(self.read[field][name])
        return values if order is None else values[order]

    def annotations(self, order: np.ndarray) -> np.ndarray:
        """`Columns.annotation` of the operators, in their sorted `order`."""
        return as_array(self.annotation)[order]

    def ids(self, field: str, orders: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """The groups' ids (thread, correlation) in their sorted orders, where all are read and none is
        negative (as `columns.id_columns` keeps them); None otherwise."""
        ids = {name: self.values(field, name, order) for name, order in orders.items()}
        if any(v is None or (v.size and v.min() < 0) for v in ids.values()):
            return None
        return ids

    def names(self, name: str, order: np.ndarray) -> tuple[tuple[str, ...], np.ndarray]:
        """A group's distinct names, in order of first appearance in `order`, and each event's code in them (as
        `columns.columns_of` has them)."""
        codes = as_array(self.name_code[name])[order]
        names = list(self.codes[name])
        first = np.full(len(names), codes.size, dtype=np.int64)  # where each name first appears in `order`
        np.minimum.at(first, codes, np.arange(codes.size))
        renamed = np.argsort(first, kind="stable")
        code_of = np.empty(len(names), dtype=np.int32)
        code_of[renamed] = np.arange(len(names), dtype=np.int32)
        return tuple(names[i] for i in renamed.tolist()), code_of[codes]

    def memory_fields(self) -> dict[str, np.ndarray] | None:
        """The `[memory]` instants' time and allocator fields as read (in file order), None where left unread."""
        if "memory" in self.unread:
            return None
        return {field: as_array(values) for field, values in self.memory_read.items()}


def new_values(code: str) -> array | list:
    """Where a field's values are kept as they are read: floats ('d') in a list of arrays, a run's each."""
    return [] if code == "d" else array(code)


def as_array(values: array | list) -> np.ndarray:
    """The numpy array of values kept (`new_values`), as the dtype numpy gives such values read from a list."""
    if isinstance(values, list):
        return np.concatenate(values) if values else np.zeros(0, dtype=np.float64)
    dtype = {"d": np.float64, "q": np.int64, "i": np.int32, "b": np.bool_}[values.typecode]
    return np.frombuffer(values, dtype=dtype) if len(values) else np.zeros(0, dtype=dtype)


def memory_samples_read(fields: dict[str, np.ndarray]) -> MemorySamples:
    """The MemorySamples of `[memory]` instants whose fields were all read (`EventSorter.memory_fields`), in a
    trace of microseconds (as `columns.memory_samples` makes them)."""
    return MemorySamples(ts=fields["ts"], device_type=fields["device_type"], device_id=fields["device_id"],
                         bytes=np.nan_to_num(fields["alloc_bytes"], nan=0.0), total_allocated=fields["total_allocated"],
                         total_reserved=fields["total_reserved"])

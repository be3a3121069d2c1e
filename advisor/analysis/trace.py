"""Load torch.profiler (Kineto) Chrome traces into a `Trace`, without importing torch.

Reads `.json` and `.json.gz` files (`reading`), decodes their events (`events`), refuses what cannot be
real (`validation`) and finds the devices (`devices`); this module sorts the events into a `Trace`.

All times in a `Trace` are microseconds relative to the earliest event (`origin_us`), as floats; traces
that store nanoseconds are converted here, once.
"""

from __future__ import annotations

import gc
import os
import threading
import zlib
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path

import numpy as np

from advisor.analysis.columns import (ANNOTATION, CATEGORY, DEVICE_GROUPS, LINKED, TID, Columns, MemorySamples,
                                      columns_of, correlations, devices_of, id_columns, memory_fields, memory_samples,
                                      whole_ids)
from advisor.analysis.devices import Device, described_devices, devices_from_events
from advisor.analysis.intervals import DURATION, START
from advisor.analysis.events import Event, TraceDocument, accelerator_of, decode, decode_pieces, kind_of
from advisor.analysis.reading import json_text, read_file
from advisor.analysis.sorting import GROUPS, EventSorter, memory_samples_read
from advisor.analysis.validation import check_sizes, check_times, floats_of, usable_steps
from advisor.errors import NotATrace, TraceError


@dataclass
class Trace:
    """A parsed trace: host spans, device activity and memory events, in relative microseconds."""

    path: str
    steps: list[Event] = field(default_factory=list)  # ProfilerStep#N spans, sorted by start
    ops: list[Event] = field(default_factory=list)  # CPU ops, user annotations, python ops
    runtime: list[Event] = field(default_factory=list)
    kernels: list[Event] = field(default_factory=list)
    memcpys: list[Event] = field(default_factory=list)
    memsets: list[Event] = field(default_factory=list)
    memory: MemorySamples | None = None  # the [memory] events
    devices: list[Device] = field(default_factory=list)  # all devices the file describes (or its events show)
    # The accelerator the device activity ran on: "cuda" for the CUDA vocabulary (CUDA and ROCm), else the
    # prefix of the accelerator's own categories ("mtia"); None when the trace shows no accelerator.
    accelerator: str | None = None
    gpu_vocabulary: bool = False  # device activity in the CUDA vocabulary's categories (a GPU)
    distributed: dict | None = None
    origin_us: float = 0.0
    time_unit: str = "us"
    event_count: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # odd but legal events left out: reason → count
    host_pids: set = field(default_factory=set)  # the processes ('pid') of its operators and runtime calls
    # Each group of events above (but the memory samples) as arrays, in its order: "steps", "ops", "kernels", ...
    columns: dict[str, Columns] = field(default_factory=dict)

    @property
    def has_device_activity(self) -> bool:
        """True when the trace recorded kernels, copies or memsets on an accelerator."""
        return bool(self.kernels or self.memcpys or self.memsets)

    @property
    def used_device_ids(self) -> list[int]:
        """The accelerator ids that ran kernels or copies, from the events themselves."""
        columns = [self.columns[name] for name in DEVICE_GROUPS]
        return sorted(set(np.concatenate([c.device[c.on_device] for c in columns]).tolist()))

    @property
    def used_devices(self) -> list[Device]:
        """Devices that ran something; all described devices when the events do not say."""
        ids = set(self.used_device_ids)
        used = [d for d in self.devices if d.index in ids]
        return used or ([] if ids or not self.has_device_activity else self.devices[:1])


def _time_scale(doc: TraceDocument, events: list[Event]) -> tuple[float, str]:
    """Microseconds per trace time unit. Chrome traces use microseconds; some writers use nanoseconds."""
    unit = (doc.traceTimeUnit or "").lower()
    if unit == "ns":
        return 0.001, "ns"
    # Wall-clock timestamps in ns are > 1e17 (2001 onwards); in microseconds they stay below 1e17
    # until the year 5138. Relative ns timestamps cannot be told apart and are taken as microseconds.
    for e in events[:1000]:
        if e.ts is not None and e.ts > 1e17:
            return 0.001, "ns"
    return 1.0, "us"


def build_trace(path: Path | str, doc: TraceDocument, sorter: EventSorter | None = None) -> Trace:
    """Sort a decoded document into a Trace: kinds, relative microseconds, devices, memory samples. `sorter`: its
    events sorted, and their fields read, as they were decoded (`decode_pieces`); sorted here otherwise."""
    events = doc.traceEvents
    if sorter is None:
        sorter = EventSorter()
        sorter.add(events)
    scale, unit = _time_scale(doc, events)
    trace = Trace(path=str(path), distributed=doc.distributedInfo, time_unit=unit, event_count=len(events),
                  host_pids=sorter.host_pids, **sorter.groups)
    memory_events = sorter.memory
    timed = [getattr(trace, name) for name in GROUPS]
    if not any(timed):
        raise NotATrace(path, f"no events the analysis can use: none of its {len(events)} events is a complete "
                              "('ph': 'X') event of a known category (operators, runtime calls, kernels, copies)")
    # Checked once over the kept events, vectorized, not inside the loop above. The fields the sorter read serve
    # where it could read them; the others are read from the events.
    read_memory = sorter.memory_fields()
    times = {name: (sorter.values("ts", name), sorter.values("dur", name)) for name in GROUPS}
    times = {name: (floats_of(group, "ts") if ts is None else ts, floats_of(group, "dur") if dur is None else dur)
             for group, (name, (ts, dur)) in zip(timed, times.items())}
    check_times(path, events, timed, memory_events, scale,
                tuple(np.concatenate([times[name][i] for name in GROUPS]) for i in (0, 1)),
                None if read_memory is None else read_memory["ts"])
    fields = memory_fields(memory_events) if read_memory is None or scale != 1.0 else read_memory
    check_sizes(path, events, memory_events, trace.memcpys, fields)
    origin = 0
    if scale != 1.0:
        # Integer nanoseconds since the epoch do not fit a float exactly: subtract the (integer) origin
        # first, exactly, then scale. Microsecond timestamps fit a float as they are.
        origin = min(e.ts for e in chain(*timed, memory_events))
        for e in chain(*timed):
            e.ts = (e.ts - origin) * scale
            e.dur = e.dur * scale
    trace.origin_us = origin * scale
    trace.memory = memory_samples(memory_events, origin, scale, fields) if fields is not read_memory else \
        memory_samples_read(read_memory)
    trace.steps.sort(key=START)
    trace.steps[:] = usable_steps(trace.steps, trace.skipped)
    orders = {}
    for name in GROUPS:
        group = getattr(trace, name)
        # The times read for the check serve, unless they changed since (scaled, or steps left out).
        known = times[name] if scale == 1.0 and name != "steps" else None
        group[:], *times[name], orders[name] = sorted_by_start(group, name == "ops", known)
    # What the sorter read is in file order: it serves in the groups' sorted orders (unless times were scaled,
    # or too large for floats to sort), where it could read it all.
    read = scale == 1.0 and all(orders[name] is not None for name in GROUPS[1:])
    tids = sorter.ids("tid", {name: orders[name] for name in GROUPS[1:]}) if read else None
    step_tids = whole_ids(list(map(TID, trace.steps)))
    if tids is None or step_tids is None:
        tids = dict(zip(GROUPS, id_columns([list(map(TID, getattr(trace, name))) for name in GROUPS])))
    else:
        tids["steps"] = step_tids
    ids = sorter.ids("correlation", {name: orders[name] for name in LINKED}) if read else None
    if ids is None:
        ids = dict(zip(LINKED, id_columns([correlations(getattr(trace, name)) for name in LINKED])))
    for name in GROUPS:
        group = getattr(trace, name)
        device = sorter.values("device", name, orders[name]) if read and name in DEVICE_GROUPS else None
        if device is not None:  # every one an integer
            devices = device, np.ones(device.size, dtype=bool)
        else:
            devices = devices_of(group) if name in DEVICE_GROUPS else (None, None)
        annotation = None
        if name == "ops":
            annotation = sorter.annotations(orders[name]) if read else \
                np.fromiter(map(ANNOTATION.__eq__, map(CATEGORY, group)), bool, len(group))
        trace.columns[name] = columns_of(
            group, *times[name], tids[name], ids.get(name), *devices, annotation=annotation,
            names=sorter.names(name, orders[name]) if read and name != "steps" else None,
            external_id=sorter.values("external_id", name, orders[name]) if read and name == "kernels" else None)
    runtime_names = set(trace.columns["runtime"].names)
    kernel_kinds = {e.args.kind for e in trace.kernels[:50] if e.args is not None and e.args.kind}
    trace.accelerator, trace.gpu_vocabulary = _accelerator(sorter.group_of_category)
    trace.devices = described_devices(path, doc, runtime_names, kernel_kinds)
    if not trace.devices:
        trace.devices = devices_from_events(trace, set(trace.columns["kernels"].names))
    return trace


def sorted_by_start(events: list[Event], enclosing_first: bool,
                    times: tuple[np.ndarray, np.ndarray] | None = None
                    ) -> tuple[list[Event], np.ndarray, np.ndarray, np.ndarray | None]:
    """The events sorted by start (stably; with `enclosing_first`, the longer of two that start together
    first: an operator before its first child), their starts and durations as arrays, in that order, and the
    order (each one's index among the events given; None where they were sorted as Python numbers).

    Sorted on the arrays, which the figures use too (`Trace.columns`), rather than by a key read from each
    event. Times beyond 2**53 (which floats cannot tell apart) are sorted as Python numbers instead. `times`:
    the events' (starts, durations) as arrays, where the caller has them already."""
    n = len(events)
    ts, dur = times if times is not None else (np.fromiter(map(START, events), float, n),
                                               np.fromiter(map(DURATION, events), float, n))
    if n and (np.abs(ts).max() >= 2.0**53 or np.abs(dur).max() >= 2.0**53):
        if enclosing_first:
            events = sorted(events, key=DURATION, reverse=True)
        events = sorted(events, key=START)
        return events, np.fromiter(map(START, events), float, n), np.fromiter(map(DURATION, events), float, n), None
    order = np.lexsort((-dur, ts)) if enclosing_first else np.argsort(ts, kind="stable")
    return list(map(events.__getitem__, order.tolist())), ts[order], dur[order], order


def _accelerator(bucket_of_category: dict) -> tuple[str | None, bool]:
    """(accelerator, device activity in the CUDA vocabulary) from the categories of the kept events.

    An accelerator's own categories name it (mtia_ccp_events, xpu_runtime); the CUDA vocabulary, which
    ROCm shares, is 'cuda'. Runtime calls alone name an accelerator only when they are not CUDA's: a
    CPU run may still call cudaGetDeviceCount.
    """
    device, runtime = set(), set()
    for category, bucket in bucket_of_category.items():
        if bucket is None:
            continue
        kind = kind_of(category)
        (runtime if kind == "runtime" else device if kind in ("kernel", "memcpy", "memset") else set()).add(
            accelerator_of(category))
    gpu_vocabulary = "cuda" in device
    own = sorted(a for a in device | runtime if a not in (None, "cuda"))
    return (own[0] if own else "cuda" if gpu_vocabulary else None), gpu_vocabulary


def load_trace(path: Path | str) -> Trace:
    """Read one trace file (.json or .json.gz) into a Trace; raise TraceError naming the problem. The Trace
    may be shared with the process's other readers of that file (see `_loaded`): read it, never change it."""
    path = Path(path)
    raw, pieces = read_file(path)
    # Keyed by what was read: the file (its absolute path: the session names a trial's trace relative to where it
    # ran, its report absolute), the size and the CRC-32 of the bytes. The Trace records the path as given.
    key = (os.path.abspath(path), len(raw), zlib.crc32(raw)) if len(raw) <= KEPT_BYTES else None
    with _loaded_lock:
        kept = _loaded.get(key) if key is not None else None
        if kept is not None:
            _loaded.move_to_end(key)
            if pieces is not None:
                pieces.close()
            return kept[0] if kept[0].path == str(path) else replace(kept[0], path=str(path))
    with collector_paused():
        # A gzipped trace is decoded piece by piece as it inflates; one that does not split so, whole.
        sorter = EventSorter()
        decoded = decode_pieces(path, pieces, sorter.add) if pieces is not None else None
        if decoded is None:
            sorter = None  # sorted from the whole document instead
            text = json_text(path, raw)
            del raw
            size = len(text)
            doc = decode(path, text)
            del text
        else:
            doc, size = decoded
        if not doc.traceEvents:
            raise TraceError(path, "trace has no events ('traceEvents' is empty)")
        trace = build_trace(path, doc, sorter)
    if key is not None and size <= KEPT_BYTES:
        with _loaded_lock:
            _loaded[key] = (trace, size)
            while len(_loaded) > KEPT_TRACES or sum(n for _, n in _loaded.values()) > KEPT_BYTES:
                _loaded.popitem(last=False)
    return trace


# A process that reads one trace again parses it once: a notebook's analyze() run again, the report's views
# and the session's diagnoses of one trial, the analysis after `advisor analyze` of a folder. Keyed by the
# file's bytes as read (their CRC-32, which any change of one byte or of a few in a row changes: 31 ms for 54 MB
# of JSON that take 1.4 s to parse), not its stamps: the kernel stamps files from a clock that moves every few
# milliseconds, and a file rewritten within one tick at the same size (a byte changed) would look unchanged.
# A hit skips the gunzip too. Bounded:
# the last KEPT_TRACES files, at most KEPT_BYTES of JSON text together (a parsed trace takes about twice its
# text: 122 MB of memory for the 54 MB of a V100 trace with memory events). The count holds a whole session's
# trials, so that its report, which reads them in order after the session did, finds each (with 8 kept, the
# session's last 8 were each dropped just before the report came to them, and every trace was parsed twice).
KEPT_TRACES = 64
KEPT_BYTES = 128 * 2**20
_loaded: OrderedDict[tuple, tuple[Trace, int]] = OrderedDict()
_loaded_lock = threading.Lock()


def forget_traces() -> None:
    """Drop the traces this process keeps (`_loaded`)."""
    with _loaded_lock:
        _loaded.clear()


@contextmanager
def collector_paused():
    """Pause the cyclic garbage collector: a trace is hundreds of thousands of small acyclic objects,
    which the collector would only rescan again and again while they are created and analysed."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

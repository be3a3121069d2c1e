"""A Trace's columns say what its events say: on real traces, each array agrees with the events it was made
from, and the innermost operator around each launch found on the arrays is the one a walk with a stack finds
(the way the kernel mix found it before the columns)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from advisor.analysis.columns import DEVICE_GROUPS, LINKED, device_of
from advisor.analysis.events import decode
from advisor.analysis.kernels import launching_ops
from advisor.analysis.reading import json_text, read_file
from advisor.analysis.sorting import FIELDS, EventSorter
from advisor.analysis.trace import build_trace, load_trace
from conftest import SAMPLE_RUNS, TRACES
from trace_builder import TraceBuilder

REAL = [TRACES / "a100-rank3-of-8.pt.trace.json.gz", TRACES / "h200-gpt-attention-by-hand.pt.trace.json.gz",
        TRACES / "mi250-rocm-minitoy.pt.trace.json.gz", TRACES / "legacy-format-computeProperties.json.gz",
        next(SAMPLE_RUNS.glob("ddp_classifier/trials/00-baseline/*.pt.trace.json.gz"))]
GROUPS = ("steps", "ops", "runtime", "kernels", "memcpys", "memsets")


def same_partition(codes: np.ndarray, values: list) -> bool:
    """Whether two events share a code exactly where they share a value."""
    pairs = set(zip(codes.tolist(), values))
    return len(pairs) == len({c for c, _ in pairs}) == len({v for _, v in pairs})


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_columns_agree_with_the_events(path: Path):
    trace = load_trace(path)
    for name in GROUPS:
        events, c = getattr(trace, name), trace.columns[name]
        assert len(c) == len(events), name
        assert c.ts.tolist() == [float(e.ts) for e in events], name
        assert c.dur.tolist() == [float(e.dur) for e in events], name
        assert c.end.tolist() == [float(e.ts) + float(e.dur) for e in events], name
        assert [c.names[i] for i in c.name_code.tolist()] == [e.name for e in events], name
        assert same_partition(c.tid, [e.tid for e in events]), name
        if name in LINKED:
            assert same_partition(c.correlation, [e.correlation for e in events]), name
            assert ((c.correlation == -1).tolist() == [e.correlation is None for e in events]), name
        if name in DEVICE_GROUPS:
            devices = [device_of(e) for e in events]
            assert c.on_device.tolist() == [isinstance(d, int) for d in devices], name
            assert c.device[c.on_device].tolist() == [d for d in devices if isinstance(d, int)], name
    starts = [e.ts for e in trace.ops]
    assert starts == sorted(starts)  # sorted by start on the arrays, enclosing operators first
    assert all(a.dur >= b.dur for a, b in zip(trace.ops, trace.ops[1:]) if a.ts == b.ts)


def innermost_by_stack(trace, correlations: set) -> dict:
    """Correlation id → the innermost operator around its runtime call, found by walking each thread's
    operators and calls in time order with a stack of the enclosing operators."""
    ops_by_thread, calls_by_thread = {}, {}
    for op in trace.ops:
        if op.cat != "user_annotation":
            ops_by_thread.setdefault(op.tid, []).append(op)
    for r in trace.runtime:
        if r.args is not None and r.args.correlation in correlations:
            calls_by_thread.setdefault(r.tid, []).append(r)
    out = {}
    for tid, calls in calls_by_thread.items():
        ops, stack, i = ops_by_thread.get(tid, []), [], 0
        for r in calls:
            while i < len(ops) and ops[i].ts <= r.ts:
                while stack and stack[-1].end <= ops[i].ts:
                    stack.pop()
                stack.append(ops[i])
                i += 1
            while stack and stack[-1].end <= r.ts:
                stack.pop()
            if stack:
                out[r.args.correlation] = stack[-1]
    return out


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_the_innermost_operator_of_each_launch_is_the_one_a_stack_finds(path: Path):
    trace = load_trace(path)
    runtime = trace.columns["runtime"]
    asked = np.unique(runtime.correlation[runtime.correlation != -1])
    found = launching_ops(trace, asked)
    by_id = {int(i): trace.ops[j] for i, j in zip(asked.tolist(), found.tolist()) if j >= 0}
    code_of = {r.args.correlation: int(c) for r, c in zip(trace.runtime, runtime.correlation.tolist())
               if r.args is not None and r.args.correlation is not None}
    expected = innermost_by_stack(trace, set(code_of))
    assert {code_of[k]: v for k, v in expected.items()} == by_id
    if trace.kernels and trace.runtime and trace.ops:
        assert by_id, "some launch on a real GPU trace has an operator around it"


def test_a_launch_after_its_threads_operators_have_ended_has_no_operator(tmp_path: Path):
    """A thread whose operators all ended before its launch: the launch has no operator around it (the
    analysis once failed with an IndexError there)."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.op("aten::mm", 1, 10)
    b.launch("volta_sgemm_128x64_nn", 50, 5, 60, 100)
    trace = load_trace(b.write(tmp_path / "t.pt.trace.json"))
    assert launching_ops(trace, np.unique(trace.columns["runtime"].correlation)).tolist() == [-1]


@pytest.mark.parametrize("path", [TRACES / "h100-image-classifier-workers0.pt.trace.json.gz",
                                  next(SAMPLE_RUNS.glob("char_transformer/trials/00-baseline/*.pt.trace.json.gz"))],
                         ids=lambda p: p.parent.name if "sample_runs" in str(p) else p.name)
def test_memory_samples_agree_with_the_memory_events(path: Path):
    trace = load_trace(path)
    raw, _ = read_file(path)
    events = [e for e in decode(path, json_text(path, raw)).traceEvents if e.ph == "i" and e.name == "[memory]"]
    m = trace.memory
    assert len(m) == len(events) > 1000
    assert m.ts.tolist() == [float(e.ts) - trace.origin_us for e in events]
    assert m.device_type.tolist() == [int(e.args.device_type) for e in events]
    assert m.device_id.tolist() == [int(e.args.device_id) for e in events]
    assert m.bytes.tolist() == [float(e.args.alloc_bytes or 0) for e in events]
    for column, field in ((m.total_allocated, "total_allocated"), (m.total_reserved, "total_reserved")):
        values = [getattr(e.args, field) for e in events]
        assert np.isnan(column).tolist() == [v is None for v in values]
        assert column[~np.isnan(column)].tolist() == [float(v) for v in values if v is not None]


@pytest.mark.parametrize("path", [*REAL, TRACES / "v100-memory-events.pt.trace.json.gz"], ids=lambda p: p.name)
def test_the_fields_read_as_events_are_sorted_are_those_read_from_the_events(path: Path):
    """A Trace whose columns' fields were read as its events were sorted (`sorting.EventSorter`, what every
    trace Kineto writes gets) has the columns and memory samples of one whose fields were all read from the
    events afterwards (what a field not as Kineto writes it gets)."""
    raw, _ = read_file(path)
    doc = decode(path, json_text(path, raw))
    read, unread = EventSorter(), EventSorter()
    read.add(doc.traceEvents)
    unread.add(doc.traceEvents)
    unread.unread |= {*FIELDS, "memory"}
    # Every trace here but the legacy one (threads named by text, kernels without external ids) is read in full.
    assert not read.unread or ("legacy" in path.name and read.unread == {"tid", "external_id"})
    a, b = build_trace(path, doc, read), build_trace(path, decode(path, json_text(path, raw)), unread)
    for name in GROUPS:
        events, c = getattr(a, name), a.columns[name]
        assert c.names == tuple(dict.fromkeys(e.name for e in events)), name  # in order of first appearance
        assert [c.names[i] for i in c.name_code.tolist()] == [e.name for e in events], name
        if name == "ops":
            assert c.annotation.tolist() == [e.cat == "user_annotation" for e in events]
        for field in ("ts", "dur", "end", "names", "name_code", "tid", "correlation", "device", "on_device",
                      "annotation", "external_id"):
            x, y = getattr(a.columns[name], field), getattr(b.columns[name], field)
            if field == "external_id" and y is None:  # read from the events where a collective asks
                assert x is None or x.tolist() == [e.args.external_id for e in events], name
                continue
            assert type(x) is type(y), (name, field)
            if isinstance(x, np.ndarray):
                assert x.dtype == y.dtype and np.array_equal(x, y), (name, field)
            else:
                assert x == y, (name, field)
    for field in ("ts", "device_type", "device_id", "bytes", "total_allocated", "total_reserved"):
        x, y = getattr(a.memory, field), getattr(b.memory, field)
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), field
    assert a.host_pids == {e.pid for e in a.ops + a.runtime} and len(a.memory) == len(b.memory)

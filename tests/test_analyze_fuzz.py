"""Property-based tests (hypothesis): mutated traces through `advisor analyze`.

Real traces (tests/data/traces, sample_runs/) and traces built with `trace_builder` are mutated as a
hostile but fair user would (wrong field types, NaN/Inf/huge/negative numbers, missing fields, emptied or
duplicated events, truncation, byte flips, bytes that are not UTF-8, deep nesting, gzip damage, a trial.json
beside the trace with wrong types) and run through `advisor.cli.main`. Each run must either exit 0 with
figures that are finite, not negative and not absurd, or exit 2 with exactly one line
`advisor: error: <file>: ...`; anything else (a traceback) fails the test.

`make test` runs a bounded number of examples per property (`ADVISOR_FUZZ_EXAMPLES`, default below);
`make fuzz` runs the same properties with many more.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import io
import json
import math
import os
import re
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from advisor.cli import main
from conftest import SAMPLE_RUNS, TRACES, run_advisor
from trace_builder import V100, TraceBuilder

EXAMPLES = int(os.environ.get("ADVISOR_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

MAX_MS = 7 * 24 * 3600 * 1000.0  # no figure of a sane trace is longer than the longest trace allowed
MAX_BYTES = 2.0 ** 60


# --- base traces ------------------------------------------------------------------------------------

def built_gpu() -> dict:
    """Three GPU training steps: loader, a synchronous pageable copy, matmul kernels, optimizer, memory."""
    b = TraceBuilder(devices=(V100,))
    t = 0.0
    for step in range(1, 4):
        b.step(step, t, 1000)
        b.dataloader(t + 1, 100)
        b.copy(t + 110, 20, t + 120, 30, nbytes=1 << 20, sync_dur=25)
        b.op("aten::linear", t + 200, 300)
        b.op("aten::addmm", t + 210, 250)
        b.launch("volta_sgemm_128x64_nn", t + 220, 10, t + 300, 400)
        b.launch("volta_h884gemm_64x64_ldg8_nn", t + 240, 10, t + 710, 100)
        b.op("Optimizer.step#SGD.step", t + 600, 200, cat="user_annotation")
        b.launch("multi_tensor_apply_kernel", t + 620, 5, t + 815, 50)
        b.memory(t + 5, 1e9 + step * 1e6, 2e9, nbytes=1e6)
        t += 1000
    return b.document()


def built_cpu() -> dict:
    """Three CPU-only steps: the DataLoader and a few operators."""
    b = TraceBuilder(devices=None)
    t = 0.0
    for step in range(1, 4):
        b.step(step, t, 500)
        b.dataloader(t + 1, 200)
        for i in range(4):
            b.op("aten::mm", t + 210 + 60 * i, 50)
        t += 500
    return b.document()


def _load(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


SAMPLE_TRIAL = SAMPLE_RUNS / "image_classifier" / "trials" / "01-workers-2"


@lru_cache(maxsize=None)
def base_texts() -> dict[str, str]:
    """Every base trace as JSON text (parsed afresh for each example)."""
    texts = {"built-gpu": json.dumps(built_gpu()), "built-cpu": json.dumps(built_cpu())}
    for name in ("legacy-format-computeProperties.json.gz", "mi250-rocm-minitoy.pt.trace.json.gz"):
        if (TRACES / name).exists():
            texts[name] = json.dumps(_load(TRACES / name))
    (sample,) = SAMPLE_TRIAL.glob("*.pt.trace.json.gz")
    texts["sample-run-cpu"] = json.dumps(_load(sample))
    return texts


BASES = ("built-gpu", "built-cpu", "legacy-format-computeProperties.json.gz", "mi250-rocm-minitoy.pt.trace.json.gz",
         "sample-run-cpu")


# --- hostile values and mutations -------------------------------------------------------------------

SPECIAL_NUMBERS = [0, -1, 1, -0.0, 0.5, 1e-300, 5e-324, 1e300, -1e300, 1.7976931348623157e308, 2 ** 53 + 1,
                   2 ** 63, 2 ** 64, -2 ** 63, 10 ** 30, 1e17, 1.6e18, 4545356948923.315]
SPECIAL_TEXT = ["", "ProfilerStep#", "ProfilerStep#abc", "ProfilerStep#99999999999999999999", "ProfilerStep#-3",
                "\x1b[31mred\x1b[0m", "\x00", "é", "cudaLaunchKernel", "cudaMemcpy", "kernel", "cpu_op",
                "gpu_memcpy", "cuda_runtime", "user_annotation", "X", "i", "M", "[memory]", "ns", "us",
                "Memcpy HtoD (Pageable -> Device)", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                "Optimizer.step#SGD.step", "nccl:all_reduce"]

NEST = "__nested__"  # replaced by deeply nested arrays in the file's bytes (json.dumps would recurse)
hostile = st.one_of(
    st.none(), st.booleans(), st.sampled_from(SPECIAL_NUMBERS), st.integers(), st.floats(),
    st.sampled_from(SPECIAL_TEXT), st.text(max_size=6), st.just(NEST),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.sampled_from(["a", "device", "ts"]),
                                                              st.integers(-3, 3), max_size=2),
)
# Values of the type a field has, but hostile ones (most mutations should get past the decoder's types, to
# reach the figures), and anything at all now and then.
numbers = st.one_of(st.sampled_from(SPECIAL_NUMBERS), st.integers(), st.floats(allow_nan=False, allow_infinity=False))
texts = st.one_of(st.sampled_from(SPECIAL_TEXT), st.text(max_size=6))
FIELD_VALUES = {"ph": texts, "name": texts, "cat": texts, "ts": numbers, "dur": numbers, "pid": st.one_of(numbers, texts),
                "tid": st.one_of(numbers, texts)}
EVENT_KEYS = ["ph", "name", "cat", "ts", "dur", "pid", "tid", "args", "s", "id"]
ARG_KEYS = ["External id", "external id", "correlation", "device", "bytes", "kind", "Device Type", "Device Id",
            "Bytes", "Total Allocated", "Total Reserved", "stream"]
DEVICE_KEYS = ["id", "name", "totalGlobalMem", "computeMajor", "computeMinor", "major", "minor", "numSms"]


def _event_index(draw, events: list) -> int | None:
    if not events:
        return None
    complete = [i for i, e in enumerate(events) if isinstance(e, dict) and e.get("ph") in ("X", "i")]
    if complete and draw(st.booleans()):
        return complete[draw(st.integers(0, len(complete) - 1))]
    return draw(st.integers(0, len(events) - 1))


def _events(doc) -> list:
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return doc["traceEvents"]
    return []


def set_field(draw, doc):
    events = _events(doc)
    i = _event_index(draw, events)
    if i is not None and isinstance(events[i], dict):
        key = draw(st.sampled_from(EVENT_KEYS))
        typed = FIELD_VALUES.get(key)
        events[i][key] = draw(typed if typed is not None and draw(st.integers(0, 3)) else hostile)


def delete_field(draw, doc):
    events = _events(doc)
    i = _event_index(draw, events)
    if i is not None and isinstance(events[i], dict):
        events[i].pop(draw(st.sampled_from(EVENT_KEYS)), None)


def set_arg(draw, doc):
    events = _events(doc)
    i = _event_index(draw, events)
    if i is not None and isinstance(events[i], dict):
        args = events[i].get("args")
        if not isinstance(args, dict):
            args = events[i]["args"] = {}
        key = draw(st.sampled_from(ARG_KEYS))
        args[key] = draw(st.one_of(numbers, st.none()) if key != "kind" and draw(st.integers(0, 3)) else hostile)


def set_device(draw, doc):
    key = draw(st.sampled_from(["deviceProperties", "computeProperties"]))
    if not isinstance(doc, dict):
        return
    props = doc.get(key)
    if isinstance(props, list) and props and isinstance(props[0], dict) and draw(st.booleans()):
        key = draw(st.sampled_from(DEVICE_KEYS))
        props[0][key] = draw(st.one_of(st.integers(-5, 2 ** 70), numbers) if key != "name" and draw(st.booleans())
                             else hostile)
    else:
        doc[key] = draw(hostile)


def set_top(draw, doc):
    if isinstance(doc, dict):
        key = draw(st.sampled_from(["traceEvents", "traceTimeUnit", "distributedInfo", "displayTimeUnit"]))
        doc[key] = draw(st.one_of(hostile, st.sampled_from(["ns", "us", "ms"])))


def drop_events(draw, doc):
    events = _events(doc)
    if not events:
        return
    how = draw(st.sampled_from(["steps", "kernels", "runtime", "ops", "memory", "all-but-metadata", "all",
                                "keep-first", "keep-one"]))
    cats = {"kernels": ("kernel", "Kernel"), "runtime": ("cuda_runtime", "Runtime", "cuda_driver"),
            "ops": ("cpu_op", "Operator", "user_annotation")}
    # An earlier mutation may have replaced an event with a number or a string: a drop keeps those.
    def field(e, key):
        return e.get(key) if isinstance(e, dict) else None
    if how == "steps":
        kept = [e for e in events if not str(field(e, "name") or "").startswith("ProfilerStep#")]
    elif how in cats:
        kept = [e for e in events if field(e, "cat") not in cats[how]]
    elif how == "memory":
        kept = [e for e in events if field(e, "name") != "[memory]"]
    elif how == "all-but-metadata":
        kept = [e for e in events if field(e, "ph") == "M"] or [{"ph": "M", "name": "process_name", "pid": 1}]
    elif how == "all":
        kept = draw(st.sampled_from([[], [{}], [{}, {}]]))
    elif how == "keep-first":
        kept = events[:draw(st.integers(0, 20))]
    else:
        kept = [events[draw(st.integers(0, len(events) - 1))]]
    doc["traceEvents"] = kept


def duplicate_event(draw, doc):
    events = _events(doc)
    i = _event_index(draw, events)
    if i is not None:
        events.insert(draw(st.integers(0, len(events))), copy.deepcopy(events[i]))


def zero_durations(draw, doc):
    which = draw(st.sampled_from(["steps", "all", "one"]))
    events = _events(doc)
    for e in events:
        if isinstance(e, dict) and "dur" in e and (
                which == "all" or (which == "steps" and str(e.get("name", "")).startswith("ProfilerStep#"))):
            e["dur"] = 0
    if which == "one":
        i = _event_index(draw, events)
        if i is not None and isinstance(events[i], dict):
            events[i]["dur"] = 0


def shift_event(draw, doc):
    events = _events(doc)
    i = _event_index(draw, events)
    if i is not None and isinstance(events[i], dict) and isinstance(events[i].get("ts"), (int, float)):
        events[i]["ts"] += draw(st.sampled_from([-1e12, -1e6, -1, 1e6, 1e9, 1e12, 1e15, 1e18]))


def strip_memory_totals(draw, doc):
    """[memory] events without 'Total Allocated'/'Total Reserved': memory figures from net allocations."""
    for e in _events(doc):
        if isinstance(e, dict) and e.get("name") == "[memory]" and isinstance(e.get("args"), dict):
            e["args"].pop("Total Allocated", None)
            e["args"].pop("Total Reserved", None)
            size = e["args"].get("Bytes")
            if draw(st.integers(0, 3)) == 0 and isinstance(size, (int, float)) and not isinstance(size, bool):
                e["args"]["Bytes"] = -abs(size)  # a free before the allocations


MUTATIONS = [set_field, delete_field, set_arg, set_arg, set_device, set_top, drop_events, duplicate_event,
             zero_durations, shift_event, strip_memory_totals]


def _serialize(draw, doc) -> bytes:
    """JSON text of a mutated document, then (maybe) damaged as bytes: truncated, a byte flipped, a byte
    that is not UTF-8 put inside a string; NEST values become deeply nested arrays."""
    data = json.dumps(doc).encode()  # NaN/Infinity become their (non-JSON) literals, as Python writes them
    if NEST.encode() in data:
        depth = draw(st.sampled_from([2, 100, 5000, 100000]))
        data = data.replace(b'"%s"' % NEST.encode(), b"[" * depth + b"]" * depth)
    damage = draw(st.sampled_from([None] * 9 + ["truncate", "flip", "non-utf8"]))
    if damage == "truncate":
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif damage == "flip" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    elif damage == "non-utf8":
        quotes = [m.start() for m in re.finditer(rb'"[A-Za-z]', data)]
        if quotes:
            i = quotes[draw(st.integers(0, len(quotes) - 1))] + 1
            data = data[:i] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"])) + data[i:]
    return data


@st.composite
def mutated_trace(draw) -> tuple[str, bytes, bool]:
    """(base name, file bytes, gzipped) of a mutated trace."""
    texts = base_texts()
    name = draw(st.sampled_from([b for b in BASES if b in texts]))
    doc = json.loads(texts[name])
    for _ in range(draw(st.integers(0, 3))):
        draw(st.sampled_from(MUTATIONS))(draw, doc)
    data = _serialize(draw, doc)
    gz = draw(st.integers(0, 3)) == 0
    if gz:
        data = gzip.compress(data, compresslevel=1)
        damage = draw(st.sampled_from([None] * 4 + ["truncate", "flip"]))
        if damage == "truncate":
            data = data[:draw(st.integers(0, len(data) - 1))]
        elif damage == "flip":
            i = draw(st.integers(0, len(data) - 1))
            data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    return name, data, gz


# --- running advisor analyze in-process and judging what it did -------------------------------------

def run_main(*args: str) -> tuple[int, str, str]:
    """`advisor ARGS` in this process: (exit code, stdout, stderr). Any uncaught exception propagates."""
    out, err = io.BytesIO(), io.StringIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(err):
        rc = main(list(args))
    stdout.flush()
    return rc, out.getvalue().decode("utf-8"), err.getvalue()


SHARE_KEYS = {"dataloader_share", "dataloader_wait_share", "loader_steady_share", "gpu_utilization",
              "tensor_core_share", "eligible_share", "eligible_op_share", "layout_share", "share",
              "overlap_with_kernels", "headroom", "predicted_gain", "utilization_by_device", "breakdown_share",
              "bound_shares"}


def check_figures(node, where: str = "", share: bool = False) -> None:
    """Every number finite and not negative; shares within 0..1; times and sizes not absurd."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("trial", "distributed"):
                continue  # records echoed as written (a loss may be negative, a rank anything): not figures
            check_figures(value, f"{where}.{key}", share or key in SHARE_KEYS)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            check_figures(value, f"{where}[{i}]", share)
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        assert math.isfinite(node), f"{where} = {node}"
        assert node >= 0, f"{where} = {node} is negative"
        if share or where.endswith(".value"):
            assert node <= 1 + 1e-9, f"{where} = {node} is not a share"
        elif where.endswith("_ms") or "timeline_ms" in where:
            assert node <= MAX_MS, f"{where} = {node} ms is absurd"
        else:
            assert node <= MAX_BYTES * 1e3, f"{where} = {node} is absurd"


def check_run(path: Path, rc: int, out: str, err: str, json_output: bool, names: tuple[str, ...] = (),
              record: bool = True) -> None:
    """Exit 0 with sane figures, or exit 2 with one line naming the file (or one of `names`)."""
    if record:  # what happened, for --hypothesis-show-statistics (how much reached the figures)
        event(f"exit {rc}" + (f": {re.sub(r'[0-9]+', 'N', err.split(': ', 3)[-1])[:40]}" if rc else ""))
    if rc == 0:
        assert err == "", err
        if json_output:
            doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON document"))
            check_figures(doc)
        else:
            assert "\x1b" not in out, "a control character from the trace reached the terminal"
            assert not re.search(r"\bnan\b\s*(ms|%|GB|MB)|\binf\b\s*(ms|%|GB|MB)", out, re.IGNORECASE), out
            assert not re.search(r"(?<![\w.])-\d[\d.]*\s*(ms|%|GB|MB)", out), out
        return
    assert rc == 2, (rc, out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    prefixes = tuple(f"advisor: error: {p}: " for p in (str(path), *names)) + tuple(
        f"advisor: error: {n} " for n in names if n.startswith("--"))
    assert lines[0].startswith(prefixes), lines[0]
    assert out == ""


def check_diagnoses(path: Path, steps: str | None = None) -> None:
    """The in-process figures (before JSON turns NaN into null) are finite, not negative, not absurd."""
    from advisor.analysis.analyze import analysis_document, analyze_path
    from advisor.errors import AdvisorError

    try:
        diagnoses = analyze_path(path, steps)
    except AdvisorError:
        return
    check_figures(analysis_document(path, diagnoses))


# --- the properties ---------------------------------------------------------------------------------

@FUZZ
@given(case=mutated_trace(), as_json=st.booleans())
def test_mutated_traces_give_figures_or_one_line(tmp_path_factory, case, as_json):
    name, data, gz = case
    path = tmp_path_factory.mktemp("fuzz") / ("trace.json.gz" if gz else "trace.json")
    path.write_bytes(data)
    rc, out, err = run_main("analyze", *(["--json"] if as_json else []), str(path))
    check_run(path, rc, out, err, as_json)
    if rc == 0:
        check_diagnoses(path)


@settings(FUZZ, max_examples=max(5, EXAMPLES // 4))
@given(case=mutated_trace())
def test_mutated_traces_in_the_report(tmp_path_factory, case):
    """`advisor report TRACE` reads traces through the same loader: an HTML page or one line, never a traceback."""
    name, data, gz = case
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / ("trace.json.gz" if gz else "trace.json")
    path.write_bytes(data)
    rc, out, err = run_main("report", str(path), "-o", str(folder / "report.html"))
    if rc == 0:
        assert (folder / "report.html").stat().st_size > 1000
        out = ""  # "report: PATH" on success
    check_run(path, rc, out, err, json_output=False)


STEPS_ARGUMENTS = ["1", "2-3", "1-100000000", "abc", "3-", "-", "5-1", ",", " 1 , 2 ", "1-2-3",
                   "99999999999999999999999", "0", "-1", "1e3", "２", "1,,2", "\x1b[2J"]


@FUZZ
@given(case=mutated_trace(), steps=st.one_of(st.sampled_from(STEPS_ARGUMENTS), st.text(max_size=8)))
def test_steps_argument_is_figures_or_one_line(tmp_path_factory, case, steps):
    name, data, gz = case
    path = tmp_path_factory.mktemp("fuzz") / ("trace.json.gz" if gz else "trace.json")
    path.write_bytes(data)
    rc, out, err = run_main("analyze", "--json", f"--steps={steps}", str(path))  # a value may start with "-"
    check_run(path, rc, out, err, True, names=("--steps",))


TRIAL_PATHS = ["summary", "summary.samples_per_s", "summary.batch_size", "summary.memory_growth",
               "summary.memory_growth.bytes_per_step", "summary.memory_growth.r2", "summary.accumulation_steps",
               "summary.activations", "summary.activations.checkpoint_candidates", "summary.activations.by_class",
               "summary.peak_memory_bytes", "steps", "knobs", "knobs.num_workers", "knobs.amp", "user_values",
               "dataloaders", "device_facts", "device_facts.cpu", "device_facts.cpu.bf16_instructions",
               "device_facts.type", "memory_limit", "status", "name", "script", "schema"]


def _set_path(record: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    node = record
    for key in parents:
        child = node.get(key) if isinstance(node, dict) else None
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[last] = value


SCRIPT = "train.py"
SCRIPT_TEXT = ("import torch\ntotal = 0\nfor x, y in loader:\n    loss = criterion(model(x), y)\n"
               "    loss.backward()\n    total += loss\n")


@st.composite
def mutated_trial(draw) -> dict:
    record = json.loads((SAMPLE_TRIAL / "trial.json").read_text())
    record["script"] = SCRIPT  # the test puts a small script there (the recorded one is on another machine)
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from(TRIAL_PATHS + ["steps[]"]))
        if where == "steps[]":
            steps = record.get("steps") if isinstance(record.get("steps"), list) else []
            if steps and isinstance(steps[0], dict):
                i = draw(st.integers(0, len(steps) - 1))
                steps[i] = dict(steps[i]) if isinstance(steps[i], dict) else {}
                steps[i][draw(st.sampled_from(["wall_s", "call_s"]))] = draw(hostile)
        else:
            _set_path(record, where, draw(st.one_of(hostile, st.just(float("nan")))))
    return record


@FUZZ
@given(record=mutated_trial(), base=st.sampled_from(["built-gpu", "sample-run-cpu"]), as_json=st.booleans())
def test_trial_record_with_wrong_types_beside_a_trace(tmp_path_factory, record, base, as_json):
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / "trace.json"
    path.write_text(base_texts()[base])
    (folder / SCRIPT).write_text(SCRIPT_TEXT)
    if record.get("script") == SCRIPT:
        record["script"] = str(folder / SCRIPT)
    (folder / "trial.json").write_text(json.dumps(record))
    rc, out, err = run_main("analyze", *(["--json"] if as_json else []), str(path))
    check_run(path, rc, out, err, as_json, names=(str(folder / "trial.json"),))
    if rc == 0:
        check_diagnoses(path)


SESSION_PATHS = ["target", "status", "speedup", "best", "baseline", "device", "options", "final_knobs", "notes",
                 "patch", "memory_cap", "memory_cap.bytes", "lint", "recommendations", "trials"]
ROW_KEYS = ["index", "name", "folder", "change", "decision", "status", "samples_per_s", "speedup", "gain",
            "predicted_gain", "noise", "interval", "batch_size", "peak_memory_bytes", "median_step_s", "knobs",
            "helps_now", "tried_under", "bound", "capacity_bytes"]


@lru_cache(maxsize=None)
def fuzz_session(root: str) -> Path:
    """One session folder (two real trials), built once; each example rewrites its session.json."""
    from report_helpers import LadderRow, build_session

    return build_session(Path(root) / "session", [LadderRow("00-baseline", "baseline", "baseline"),
                                                  LadderRow("01-x", "x", "kept", throughput=1.5)])


@settings(FUZZ, max_examples=max(5, EXAMPLES // 6))
@given(data=st.data())
def test_hand_edited_session_json_renders_or_is_one_line(tmp_path_factory, data):
    """`advisor report` of a session.json edited by hand: a page (saying what it could not read) or one line."""
    from advisor.errors import AdvisorError
    from advisor.report.html import render_session_report

    folder = fuzz_session(str(tmp_path_factory.getbasetemp()))
    base = json.loads((folder / "session.base.json").read_text()) if (folder / "session.base.json").exists() else None
    if base is None:
        base = json.loads((folder / "session.json").read_text())
        (folder / "session.base.json").write_text(json.dumps(base))
    record = copy.deepcopy(base)
    for _ in range(data.draw(st.integers(1, 4))):
        if data.draw(st.booleans()) and isinstance(record.get("trials"), list) and record["trials"]:
            row = record["trials"][data.draw(st.integers(0, len(record["trials"]) - 1))]
            if isinstance(row, dict):
                row[data.draw(st.sampled_from(ROW_KEYS))] = data.draw(st.one_of(hostile, st.just(float("nan"))))
        else:
            _set_path(record, data.draw(st.sampled_from(SESSION_PATHS)), data.draw(st.one_of(hostile, numbers)))
    (folder / "session.json").write_text(json.dumps(record).replace('"__nested__"', "[" * 3000 + "]" * 3000))
    try:
        html = render_session_report(folder)
    except AdvisorError as exc:
        event("error: " + str(exc).split(": ", 1)[1][:60])
        assert "\n" not in str(exc) and str(exc).startswith(str(folder / "session.json"))
        return
    event("rendered" + (" (saying what it could not read)" if 'id="unread"' in html else ""))
    # No row left measured (each one's decision or samples/s edited away): the page says what failed instead.
    assert "<h2>Ladder</h2>" in html or "<dt>What failed</dt>" in html


# --- a handful through a real process: no traceback, one line or figures ----------------------------

@pytest.mark.parametrize("content", [
    b"[{}]",
    b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a\xff", "ts": 1, "dur": 2}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 0}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": NaN, "dur": 1}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "ts": 10, "dur": -5}]}',
], ids=["empty-event", "not-utf8", "zero-length-op", "nan-ts", "negative-step"])
def test_real_process_never_shows_a_traceback(tmp_path, content):
    path = tmp_path / "trace.json"
    path.write_bytes(content)
    for args in (["analyze", str(path)], ["analyze", "--json", str(path)]):
        proc = run_advisor(*args)
        assert "Traceback" not in proc.stderr, proc.stderr
        check_run(path, proc.returncode, proc.stdout, proc.stderr, "--json" in args, record=False)

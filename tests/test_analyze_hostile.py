"""`advisor analyze` on hostile input: the smallest failing cases of the fuzz run kept as regressions, the
trace validation (refused, or skipped and counted), the gzip bound, --steps, trial.json with wrong types,
FIFOs, unsearchable folders, and control characters in names."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import subprocess
import sys
import re
import tracemalloc
from pathlib import Path

import pytest

from advisor.cli import main
from advisor.analysis.analyze import analyze_file
from advisor.analysis.steps import parse_steps
from conftest import SAMPLE_RUNS, run_advisor
from trace_builder import H100, TraceBuilder


def run_cli(*args: str) -> tuple[int, str, str]:
    """`advisor ARGS` in this process: (exit code, stdout, stderr)."""
    out, err = io.BytesIO(), io.StringIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue().decode("utf-8"), err.getvalue()


def one_line_error(path, rc: int, out: str, err: str) -> str:
    """The problem of a one-line `advisor: error: PATH: ...`, exit 2, nothing on stdout."""
    assert rc == 2 and out == "", (rc, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    prefix = f"advisor: error: {path}: "
    assert err.startswith(prefix), err
    return err[len(prefix):].strip()


def op(name="aten::mm", cat="cpu_op", **fields) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, **fields}


def document(*events, **top) -> bytes:
    return json.dumps({"traceEvents": list(events), **top}).encode()


# --- the smallest failing cases found by the fuzz run (tests/test_analyze_fuzz.py) and the issue -----

V100_PROPS = [{"id": 0, "name": "Tesla V100", "totalGlobalMem": 34089730048, "computeMajor": 7, "computeMinor": 0}]
GPU_STEP = [op("ProfilerStep#1", "user_annotation", ts=0, dur=100), op(ts=1, dur=50),
            op("cudaLaunchKernel", "cuda_runtime", ts=2, dur=5, args={"correlation": 1}),
            {"ph": "X", "cat": "kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": 10, "dur": 20,
             "args": {"correlation": 1, "device": 0}}]

# name: (file content, the problem the one-line error names); each crashed or printed nonsense before.
REFUSED = {
    "empty-event": (b"[{}]", "no events the analysis can use"),  # was: min() arg is an empty sequence
    "metadata-only": (document({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}}),
                      "no events the analysis can use"),
    "one-zero-length-op": (document(op(ts=1, dur=0)), "span no time"),  # was: ZeroDivisionError
    "not-utf8-in-a-name": (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "mm\xff", "ts": 1, "dur": 2}]}',
                           "not UTF-8 text: byte 0xff at offset 57"),  # was: UnicodeDecodeError
    "nan-time": (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "mm", "ts": NaN, "dur": 2}]}',
                 "not valid JSON"),
    "overflowing-time": (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "mm", "ts": 1e400, "dur": 2}]}',
                         "not a torch.profiler trace: event 0 ('mm'): Number out of range"),
    "negative-step": (document(op("ProfilerStep#1", "user_annotation", ts=10, dur=-5), op(ts=1, dur=3)),
                      "event 0 ('ProfilerStep#1') has a negative duration"),  # was: ZeroDivisionError
    "negative-op": (document(op(ts=10, dur=-4670)), "event 0 ('aten::mm') has a negative duration"),  # -4.67 ms
    "300-digit-duration": (document(op(ts=1, dur=1e300)), "event 0 ('aten::mm') lasts longer than a week"),
    "300-digit-time": (document(op(ts=1, dur=2), op(ts=1e300, dur=2)),
                       "event 1 ('aten::mm') lies more than a week from the rest of the trace"),
    "30-digit-integer-time": (document(op(ts=1, dur=2), op(ts=10**30, dur=2)), "event 1 ('aten::mm') lies more"),
    "huge-device-memory": (document(*GPU_STEP, deviceProperties=[dict(V100_PROPS[0], totalGlobalMem=1e300)]),
                           "deviceProperties[0] has 'totalGlobalMem': 1e+300, not a memory size"),
    "huge-compute-capability": (document(*GPU_STEP, deviceProperties=[dict(V100_PROPS[0], computeMajor=10**30)]),
                                "deviceProperties[0] has compute capability"),
    "negative-copy-bytes": (document(*GPU_STEP, {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> "
                                                 "Device)", "pid": 0, "tid": 7, "ts": 40, "dur": 5,
                                                 "args": {"bytes": -5e9}}), "has 'bytes': -5000000000.0"),
    "huge-allocation": (document(op(ts=1, dur=2), {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1,
                                                    "args": {"Device Type": 0, "Bytes": 1e300}}),
                        "event 1 ('[memory]') has 'Bytes': 1e+300, not a byte count"),
    "deep-nesting": (b'{"traceEvents": [{"ph": "X", "args": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}]}",
                     "nested too deeply"),
    "pid-is-a-list": (document(op(ts=1, dur=2, pid=[1])), "event 0 ('aten::mm'): Expected `int | str | null`"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_regression_refused_with_one_line_naming_file_and_event(tmp_path, name):
    content, problem = REFUSED[name]
    path = tmp_path / f"{name}.json"
    path.write_bytes(content)
    for args in (["analyze", str(path)], ["analyze", "--json", str(path)]):
        assert problem in one_line_error(path, *run_cli(*args)), name


# name: (file content, what the analysis must show); each crashed or printed nonsense before.
ANALYSED = {
    # min() of nothing: only memsets, no operator to make the whole-trace step of
    "memset-only": document({"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7,
                             "ts": 1, "dur": 2}),
    # int('abc') with --steps; a zero-length step divided by zero
    "step-name-not-a-number": document(op("ProfilerStep#abc", "user_annotation", ts=0, dur=10), op(ts=1, dur=3)),
    "zero-length-step": document(op("ProfilerStep#1", "user_annotation", ts=0, dur=0), op(ts=1, dur=3)),
    # a peak above the capacity printed a negative headroom; a peak of 0 divided by zero in larger-batch
    "memory-above-capacity": document(*GPU_STEP, {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 5, "args": {
        "Device Type": 1, "Device Id": 0, "Total Allocated": 1e15, "Total Reserved": 1e15}}, deviceProperties=V100_PROPS),
    # memory freed before any allocation, without totals: the net allocations went negative
    "frees-before-allocations": document(op(ts=0, dur=100), *[
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 10 + i, "args": {"Device Type": 1, "Bytes": b}}
        for i, b in enumerate([-100, 50, -30])]),
    # device activity whose pid says nothing about the device
    "kernel-pid-null": document(op(ts=0, dur=40), {"ph": "X", "cat": "kernel", "name": "k", "pid": None, "tid": 7,
                                                   "ts": 10, "dur": 20}),
    "kernel-pid-empty": document(op(ts=0, dur=40), {"ph": "X", "cat": "kernel", "name": "k", "pid": "", "tid": 7,
                                                    "ts": 10, "dur": 20}),
    "kernel-pid-negative": document(op(ts=0, dur=40), {"ph": "X", "cat": "kernel", "name": "k", "pid": -1, "tid": 7,
                                                       "ts": 10, "dur": 20}),
}


def finite_and_not_negative(node, where="") -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key not in ("trial", "distributed"):
                finite_and_not_negative(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            finite_and_not_negative(value, f"{where}[{i}]")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        assert math.isfinite(node) and node >= 0, f"{where} = {node}"


@pytest.mark.parametrize("name", sorted(ANALYSED))
def test_regression_analysed_with_sane_figures(tmp_path, name):
    path = tmp_path / f"{name}.json"
    path.write_bytes(ANALYSED[name])
    rc, out, err = run_cli("analyze", "--json", str(path))
    assert rc == 0 and err == "", err
    finite_and_not_negative(json.loads(out))
    rc, out, err = run_cli("analyze", str(path))
    assert rc == 0 and err == "" and "nan" not in out and "-" not in out.split("Steps:")[1].split("\n")[0], out


def test_peak_memory_of_zero_gives_a_bounded_batch_factor(tmp_path):
    """An idle GPU whose trace says 0 bytes allocated: larger-batch divided by zero (1 − headroom)."""
    b = TraceBuilder(devices=(H100,))
    b.step(1, 0, 1000)
    for i in range(12):
        b.op("aten::mm", 10 + 70 * i, 60)
        b.launch("sm90_xmma_gemm_bf16bf16_bf16f32", 12 + 70 * i, 5, 20 + 70 * i, 10)
    b.memory(5, total_allocated=0, total_reserved=0)
    d = analyze_file(b.write(tmp_path / "t.json"))
    batch = next(r for r in d.recommendations if r.id == "larger-batch")
    assert batch.details["max_factor"] == 64 and batch.details["headroom"] == 1.0


def test_skipped_steps_are_counted_and_reported(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(document(op("ProfilerStep#1", "user_annotation", ts=0, dur=10),
                              op("ProfilerStep#2", "user_annotation", ts=5, dur=10),  # overlaps #1
                              op("ProfilerStep#3", "user_annotation", ts=20, dur=0),  # no length
                              op(ts=1, dur=3)))
    d = analyze_file(path)
    assert [s.name for s in d.steps] == ["ProfilerStep#1"]
    assert dict(d.skipped_events) == {"ProfilerStep# spans that overlap the step before": 1,
                                      "ProfilerStep# spans of zero length": 1}
    assert [f.code for f in d.findings].count("skipped-events") == 2
    doc = json.loads(run_cli("analyze", "--json", str(path))[1])
    assert {"reason": "ProfilerStep# spans of zero length", "count": 1} in doc["traces"][0]["skipped_events"]
    assert "1 ProfilerStep# spans of zero length left out of the analysis" in run_cli("analyze", str(path))[1]


def test_figures_of_the_real_traces_are_unchanged_by_validation():
    """Validation refuses nothing real and skips nothing: every recorded GPU trace and sample trace loads as before."""
    from conftest import TRACES

    paths = sorted(TRACES.glob("*.json*")) + sorted(SAMPLE_RUNS.glob("*/trials/*/*.pt.trace.json.gz"))
    assert paths
    for path in paths:
        d = analyze_file(path)
        assert d.skipped_events == () and d.step_time_us > 0, path


# --- decompression bound -----------------------------------------------------------------------------

def gzip_bomb(path: Path, gib: int = 2) -> Path:
    """A file of about 2 MB that inflates to `gib` GiB: gzip members of 64 MiB of zeros, repeated."""
    member = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    path.write_bytes(member * (gib * 16))
    return path


def test_gzip_bomb_is_refused_early_in_little_memory(tmp_path):
    bomb = gzip_bomb(tmp_path / "bomb.pt.trace.json.gz")
    assert bomb.stat().st_size < 3e6
    # Started by a small Python in between: Linux carries a process's peak RSS over fork and exec, so a
    # child of this test worker (torch loaded, sessions run) would report the worker's peak as its own.
    between = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "sys.stdout.write(f'{r.returncode} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}'); "
               "sys.stderr.write(r.stderr)")
    proc = subprocess.run([sys.executable, "-c", between, sys.executable, "-m", "advisor.cli", "analyze", str(bomb)],
                          capture_output=True, text=True)
    code, peak_kb = map(int, proc.stdout.split())
    err = proc.stderr
    assert code == 2 and err.count("\n") == 1, err
    assert "refused to inflate" in err and "inflates to more than 268,435,456 bytes" in err
    # Early: refused at the bound (256 MiB inflated, the message says), not after reading the 2 GiB whole.
    assert peak_kb < 900 * 1024, f"peak {peak_kb / 1024:.0f} MB: the bomb was read whole"


def test_decompression_bound_can_be_set(tmp_path, monkeypatch):
    trace = TraceBuilder(devices=(H100,))
    trace.step(1, 0, 100)
    for i in range(20):
        trace.op("aten::mm", 1 + 4 * i, 3)
    path = trace.write(tmp_path / "small.pt.trace.json.gz")
    monkeypatch.setenv("ADVISOR_MAX_TRACE_BYTES", "1000")
    problem = one_line_error(path, *run_cli("analyze", str(path)))
    assert "inflates to more than 1,000 bytes" in problem and "ADVISOR_MAX_TRACE_BYTES allows 1,000" in problem
    monkeypatch.setenv("ADVISOR_MAX_TRACE_BYTES", "lots")
    assert "not a positive number of bytes" in one_line_error(path, *run_cli("analyze", str(path)))
    monkeypatch.delenv("ADVISOR_MAX_TRACE_BYTES")
    assert run_cli("analyze", str(path))[0] == 0


def test_gzip_members_and_padding_are_read_and_trailing_bytes_refused(tmp_path):
    text = json.dumps(json.loads(document(op("ProfilerStep#1", "user_annotation", ts=0, dur=10), op(ts=1, dur=3))))
    half = len(text) // 2
    two_members = gzip.compress(text[:half].encode()) + gzip.compress(text[half:].encode()) + b"\0" * 8
    (tmp_path / "two.json.gz").write_bytes(two_members)
    assert run_cli("analyze", str(tmp_path / "two.json.gz"))[0] == 0
    (tmp_path / "trailing.json.gz").write_bytes(gzip.compress(text.encode()) + b"garbage")
    trailing = tmp_path / "trailing.json.gz"
    assert "bytes after the end of the gzip stream" in one_line_error(trailing, *run_cli("analyze", str(trailing)))


# --- --steps -----------------------------------------------------------------------------------------

def test_steps_range_is_not_expanded(tmp_path):
    path = gpu_like_trace(tmp_path)
    assert parse_steps("1-100000000") == ((1, 100000000),)
    tracemalloc.start()
    try:
        rc, out, err = run_cli("analyze", "--json", "--steps", "1-100000000", str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # A set of 10^8 step numbers would take gigabytes; the analysis of this small trace takes a few MB.
    assert rc == 0 and peak < 64 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    assert json.loads(out)["traces"][0]["steps"]["count"] == 3


@pytest.mark.parametrize("steps", ["abc", "3-", "-", "-1", "-:", "5-1", "1,,2", "1-2-3", "٣", "9" * 5000])
def test_malformed_steps_are_one_line(tmp_path, steps):
    path = gpu_like_trace(tmp_path)
    rc, out, err = run_cli("analyze", f"--steps={steps}", str(path))
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("advisor: error: --steps "), err


def test_malformed_steps_in_a_real_process():
    proc = run_advisor("analyze", "--steps", "abc", str(SAMPLE_RUNS))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "--steps 'abc': expected ProfilerStep numbers" in proc.stderr


def gpu_like_trace(tmp_path: Path) -> Path:
    b = TraceBuilder(devices=(H100,))
    for n in range(1, 4):
        t = (n - 1) * 1000.0
        b.step(n, t, 900)
        for i in range(12):
            b.op("aten::mm", t + 10 + 60 * i, 50)
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32", t + 12 + 60 * i, 5, t + 20 + 60 * i, 40)
    return b.write(tmp_path / "gpu.pt.trace.json")


# --- trial.json beside a trace: wrong types ignored and said, not an AttributeError ------------------

def test_trial_record_with_wrong_types_is_used_for_what_fits(tmp_path):
    trial_dir = SAMPLE_RUNS / "image_classifier" / "trials" / "01-workers-2"
    (trace,) = trial_dir.glob("*.pt.trace.json.gz")
    record = json.loads((trial_dir / "trial.json").read_text())
    record["summary"] = "fast"  # was: AttributeError: 'str' object has no attribute 'get'
    record["knobs"] = ["num_workers", 2]
    record["steps"][2]["wall_s"] = "0.1"
    record["device_facts"]["cpu"]["bf16_instructions"] = 3
    (tmp_path / trace.name).write_bytes(trace.read_bytes())
    text = re.sub(r'"call_s": [0-9.e-]+', '"call_s": NaN', json.dumps(record), count=1)  # older versions wrote NaN
    (tmp_path / "trial.json").write_text(text)
    d = analyze_file(tmp_path / trace.name)
    assert d.trial["name"] == "01-workers-2" and "summary" not in d.trial and "knobs" not in d.trial
    (line,) = [m for m in d.missing if m.startswith("a trial.json the analysis can use in full")]
    assert "summary: text where an object goes" in line and "knobs: a list where an object goes" in line
    assert "steps[2].wall_s: text where a number from 0 to 1e18 goes" in line and "steps[0].call_s: NaN" in line
    rc, out, err = run_cli("analyze", str(tmp_path / trace.name))
    assert rc == 0 and "trial.json the analysis can use in full" in out


# The smallest trial.json edits that crashed the analysis of the trace beside them: (dotted field, value).
TRIAL_EDITS = {
    "summary-text": ("summary", "fast"),  # AttributeError: 'str' object has no attribute 'get'
    "steps-text": ("steps", "many"),
    "memory-growth-list": ("summary.memory_growth", ["x"]),
    "wall-time-text": ("steps.2.wall_s", "0.1"),  # TypeError: str - float
    "workers-text": ("dataloaders.0.effective.num_workers", "two"),  # int('two')
    "workers-nan": ("dataloaders.0.effective.num_workers", float("nan")),  # int(nan), as older records hold it
    "memory-limit-text": ("memory_limit", "1GB"),  # min(int, str)
    "bf16-instructions-number": ("device_facts.cpu.bf16_instructions", 3),  # list(3)
}


@pytest.mark.parametrize("edit", sorted(TRIAL_EDITS))
def test_regression_trial_record_field_of_the_wrong_type(tmp_path, edit):
    where, value = TRIAL_EDITS[edit]
    trial_dir = SAMPLE_RUNS / "image_classifier" / "trials" / "01-workers-2"
    (trace,) = trial_dir.glob("*.pt.trace.json.gz")
    record = json.loads((trial_dir / "trial.json").read_text())
    *parents, last = where.split(".")
    node = record
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    (tmp_path / trace.name).write_bytes(trace.read_bytes())
    (tmp_path / "trial.json").write_text(json.dumps(record))
    for args in (["analyze", str(tmp_path / trace.name)], ["analyze", "--json", str(tmp_path / trace.name)]):
        rc, out, err = run_cli(*args)
        assert rc == 0 and err == "", err
    shown = where.replace(".0.", "[0].").replace(".2.", "[2].").replace("steps.2", "steps[2]")
    assert f"{shown}:" in out, (shown, json.loads(out)["traces"][0]["missing"])


def test_trial_record_that_is_not_one_is_one_line(tmp_path):
    (trace,) = (SAMPLE_RUNS / "image_classifier" / "trials" / "01-workers-2").glob("*.pt.trace.json.gz")
    (tmp_path / trace.name).write_bytes(trace.read_bytes())
    for content in (b"[1, 2]", b'{"schema": 5}', b"\xff\xfe", b"[" * 100000):
        (tmp_path / "trial.json").write_bytes(content)
        problem = one_line_error(tmp_path / "trial.json", *run_cli("analyze", str(tmp_path / trace.name)))
        assert problem.startswith(("not an advisor trial record", "not valid JSON")), problem


# --- files that are not regular, folders that cannot be searched, names that are not text ------------

def test_fifo_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    proc = run_advisor("analyze", str(fifo), timeout=60)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr and proc.stderr.count("\n") == 1
    os.mkfifo(tmp_path / "trial.json")  # beside a real trace: not opened, and said
    trace = gpu_like_trace(tmp_path)
    d = analyze_file(trace)
    assert d.trial is None and any("not a regular file" in m for m in d.missing)


def _drop_file_capabilities() -> None:
    """In the child, before exec: root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH is refused a folder
    of mode 000 like anyone else (PR_CAPBSET_DROP; root keeps its uid, so the interpreter stays runnable)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def run_as_unprivileged(*args: str) -> subprocess.CompletedProcess:
    """The CLI as a user who cannot search a folder of mode 000 (root, with its file capabilities dropped)."""
    preexec = _drop_file_capabilities if os.geteuid() == 0 else None
    return subprocess.run([sys.executable, "-m", "advisor.cli", *args], capture_output=True, text=True, timeout=120,
                          preexec_fn=preexec)


@pytest.mark.parametrize("command", ["analyze", "report", "lint"])
def test_file_in_an_unsearchable_folder_is_one_line(tmp_path, command):
    locked = tmp_path / "locked"
    locked.mkdir()
    target = locked / ("train.py" if command == "lint" else "trace.json")
    target.write_text("x = 1\n" if command == "lint" else document(op(ts=0, dur=5)).decode())
    locked.chmod(0o000)
    try:
        proc = run_as_unprivileged(command, str(target))
    finally:
        locked.chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "permission denied" in proc.stderr and str(target) in proc.stderr


def test_control_characters_in_names_are_escaped_on_the_terminal(tmp_path):
    b = TraceBuilder(devices=(H100,))
    b.step(1, 0, 1000)
    for i in range(12):
        b.op("aten::mm", 10 + 70 * i, 60)
    b.op("Optimizer.step#\x1b[2J\x07Evil.step", 900, 90, cat="user_annotation")
    evil = tmp_path / "e\x1b]0;title\x07vil.json"
    b.write(evil)
    rc, out, err = run_cli("analyze", str(evil))
    assert rc == 0 and "\x1b" not in out and "\x07" not in out, repr(out)
    assert "e\\x1b]0;title\\x07vil.json" in out
    rc, out, err = run_cli("analyze", str(tmp_path / "missing\x1b[31m.json"))
    assert rc == 2 and "\x1b" not in err and "missing\\x1b[31m.json" in err


def test_file_name_that_is_not_utf8_in_json_and_terminal(tmp_path):
    trace = gpu_like_trace(tmp_path)
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/tr\xffce.pt.trace.json"))
    trace.rename(odd)
    rc, out, err = run_cli("analyze", "--json", str(odd))
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["traces"][0]["source"].endswith("tr\\xffce.pt.trace.json")
    rc, out, err = run_cli("analyze", str(tmp_path))
    assert rc == 0 and "tr\\xffce.pt.trace.json" in out

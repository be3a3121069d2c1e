"""One trial: the user's script run in a fresh subprocess with a set of `Knobs`, its step profiled.

The parent side, torch-free at import. `run_trial` starts `advisor.harness` in a new process group,
waits (time limit, Ctrl-C), ends the whole group (DataLoader workers included), and writes `trial.json`.
`add_profile_arguments` declares the trial's options of `advisor profile`; the command itself is the
session's (`advisor.session.profile_command`), which runs trials through `run_trial`.

trial.json (schema "advisor.trial/1"), written atomically at the start (status "running") and at the end:

    schema          "advisor.trial/1"
    name            trial name, e.g. "00-baseline"
    target          "train_step" or "Class.method", or null: no step function (each optimizer step ends a step)
    step            "pkg.module:name" or "path/module.py:name" when the step is defined in a module the script
                    imports, else null
    script          absolute path of the user's script
    script_args     list of arguments passed to the script
    device          requested device: "auto" | "cpu" | "cuda"
    knobs           every Knobs field (null = the user's value)
    knob_outcomes   {knob: "applied" | "not applicable: <why>"} for each requested knob
    user_values     the user's own values of the knobs, or null: the DataLoader values (batch_size, num_workers,
                    pin_memory, persistent_workers, prefetch_factor) of the training loader (the first
                    loader built when no step took a batch from one) and torch's intra-op `threads`
    dataloaders     [{user, effective, outcomes, site, ordinal, fetches, steps, training}] for every DataLoader
                    the script built: site is "file.py:LINE" of the DataLoader(...) call in the user's code,
                    ordinal counts the loaders built there before, fetches the batches it handed out, steps
                    the steps whose last batch came from it; the training loader fed the most steps
    training_loader {site, ordinal, index} of the training loader, or null (no step took a batch from a
                    DataLoader: steps/s is measured instead of samples/s)
    model_dtypes    bytes of the model's parameters by dtype after the first step ({"float32": n}), or null
    sites           where the user's code does what a patch changes: {backward: {file, line, function}} (the
                    first backward() of a scalar, and the function that holds it)
    accumulation    null, or when the accumulation_steps knob ran: {steps: k, micro_steps,
                    optimizer_steps, optimizer_steps_deferred, zero_grads, zero_grads_skipped}
    schedule        {wait, warmup, active, queue_depth, settle, windows, window_s, min_window_steps,
                     windows_measured}: steps skipped (wait includes queue_depth: workers × prefetch_factor
                     batches queued before the first step), warmed up, profiled; then settle steps and
                     measurement windows of at least window_s seconds and min_window_steps steps
    profiled        false for a timing-only trial (no profiler, no trace)
    memory_limit    the --memory-limit in bytes, or null
    memory_cap      what the limit capped, or null: {device: "cpu"|"cuda:N", bytes, what, how}; on a CUDA
                    device the caching allocator's share of device memory
                    (torch.cuda.set_per_process_memory_fraction), on the CPU the process's writable
                    memory (RLIMIT_DATA: heap and anonymous mappings; not the address space, of which
                    CUDA's libraries reserve far more than they use)
    status          "running" | "ok" | "error" | "oom" | "timeout" | "interrupted" | "target-not-found"
    message         one line saying what happened
    error_type      exception class name (error/oom), else absent
    traceback       the user's traceback text (our frames left out), else absent
    device_facts    {type: "cpu"|"cuda", torch, python, platform,
                     cpu: {model, logical_cores, physical_cores, torch_threads, ram_bytes, bf16_instructions},
                     gpu: {name, compute_capability, total_memory_bytes, ..., nvml: {...}} (CUDA only)}
    steps           [{index, wall_s, call_s, data_s, loader, recorded, phase, window?, batch_size, batch_size_source,
                      loss, rss_bytes,
                      vms_bytes, data_bytes, cuda_allocated_bytes?, cuda_max_allocated_bytes?, cuda_max_reserved_bytes?,
                      profiler_allocated_bytes?}]
                    wall_s is the span ProfilerStep#index: from the end of the previous step to the end
                    of this call (the user's data loading plus the call); call_s is the call alone (with
                    no step function: wall_s less data_s); data_s is the time spent in DataLoader
                    __next__ since the previous step; loader indexes `dataloaders` (the loader whose batch
                    came last); loss is the returned loss, else the last scalar backward() ran from;
                    phase: "wait" (skipped: the first --wait steps and the batches the workers queued
                    before the first step), "warmup", "profiled" (recorded: in the trace), "settle"
                    (the queue refilled while the trace was written), "window" (measured, in window k);
                    profiler_allocated_bytes (profiled steps) is the trace's CPU `Total Allocated` at the
                    end of the step: live bytes of the CPU allocator counted from the profiler's start
    summary         {steps_recorded, median_step_s, median_call_s, samples_per_s, batch_size, loss,
                     peak_memory_bytes, peak_memory_source, peak_rss_bytes, peak_vms_bytes, peak_data_bytes,
                     profiler_peak_allocated_bytes, cuda_max_allocated_bytes?, cuda_total_bytes?,
                     accumulation_steps, micro_batch_size, effective_batch_size}
                    steady: the measurement windows (`advisor.search.measurement.Measurement`):
                      {samples_per_s, relative_se, interval: [low, high] (95%), windows: [samples/s of
                      each], steps, seconds, source, wait_share (share of the time outside the step:
                      the loop waiting for data)}, or null for a trial measured without windows
                    samples_per_s = steady.samples_per_s where windows were measured, else
                    profiled_samples_per_s = sum of batch sizes / sum of wall_s over the recorded steps; with
                    gradient accumulation each step is one micro-step, so batch_size = micro_batch_size
                    and effective_batch_size = micro_batch_size × accumulation_steps (1 when off)
                    memory_growth_per_step_bytes: memory_growth.bytes_per_step, or null
                    memory_growth: {bytes_per_step, r2, median_difference_bytes, steps, source,
                      first_index} or null (`memory_growth`): least-squares slope of the steps'
                      cuda_allocated_bytes, else of the profiled steps' profiler_allocated_bytes, else
                      of rss_bytes (first step left out); a leak has slope ≈ median difference > 0
                    memory_breakdown: null, or where memory was at an out-of-memory failure
                      (when "at failure") or after the last step (when "end"):
                      {when, parameters, gradients, optimizer_state, activations (bytes; activations
                       estimated, or null), activations_source, activations_saved_bytes, source,
                       total_bytes, rss_bytes, vms_bytes, peak_rss_bytes, peak_vms_bytes,
                       optimizers_found, modules_found,
                       cuda_allocated_bytes?, cuda_reserved_bytes?, cuda_max_allocated_bytes?}
                      parameters/gradients/optimizer_state: tensors on the step's device of every
                      module and optimizer the process holds (found by a gc scan); activations: on
                      CUDA the allocator's figure minus those three, on the CPU the bytes saved for
                      backward in the recorded step; or {when, unavailable} when it could not be read
                    activations: null, or the first step's activation memory per module:
                      {step, complete (false: the step failed part-way), saved_bytes, roots,
                       checkpoint_candidates: [class names], by_class: [{class, module, count, calls,
                       bytes, share, output_bytes, leaf, names}], by_module: [{name, class, module,
                       calls, bytes, share, output_bytes, leaf, nested}], source}
                      bytes = tensors autograd saved for backward while the module's forward ran
                      (what checkpointing it would free), each storage counted once per module;
                      share = bytes / saved_bytes; count = instances (not nested in one of the same
                      class); a lone outermost module (the whole model, named in roots) is left out;
                      checkpoint_candidates = repeated classes with submodules, largest first
    trace_files     names of the *.pt.trace.json.gz files in the trial folder
    log_file        "output.log": the script's stdout and stderr
    pid             the trial process (also its process group id)
    times           {started_at, ended_at, duration_s, setup_s, harness_s, first_step_at, last_step_at}
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import gzip
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

from advisor.errors import AdvisorError
from advisor.driver import STEPS_FILE
from advisor.harness import RESULT_FILE, TargetNotFound, locate_target
from advisor.records import number, write_json_atomic
from advisor.knobs import DATALOADER_KNOBS, Knobs
from advisor.search.measurement import measure

SCHEMA = "advisor.trial/1"
TRIAL_FILE = "trial.json"
TRIAL_MARKER = ".advisor-trial"  # in every folder a trial made
LOG_FILE = "output.log"
STATUSES = ("running", "ok", "error", "oom", "timeout", "interrupted", "target-not-found")
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
_HARNESS_ENTRY = "import sys; from advisor.harness import main; main(sys.argv[1:])"


class TrialFailed(AdvisorError):
    """A trial that did not finish: the CLI prints one line (after the user's traceback, if any)."""

    exit_code = 1


@dataclass(frozen=True)
class TrialResult:
    """What a finished trial measured; the full record is `trial.json` in `path`."""

    name: str
    status: str
    message: str
    path: Path
    knobs: Knobs
    knob_outcomes: dict[str, str]
    median_step_s: float | None = None
    samples_per_s: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_source: str | None = None
    batch_size: int | None = None
    loss: float | None = None
    steps_recorded: int = 0
    traceback: str | None = None

    @property
    def ok(self) -> bool:
        """True when the recorded steps all ran."""
        return self.status == "ok"

    @classmethod
    def from_record(cls, record: dict[str, Any], path: Path) -> "TrialResult":
        """Build from a trial.json document."""
        summary = record.get("summary") or {}
        return cls(
            name=record["name"],
            status=record["status"],
            message=record.get("message", ""),
            path=Path(path),
            knobs=Knobs.from_dict(record.get("knobs") or {}),
            knob_outcomes=record.get("knob_outcomes") or {},
            median_step_s=summary.get("median_step_s"),
            samples_per_s=summary.get("samples_per_s"),
            peak_memory_bytes=summary.get("peak_memory_bytes"),
            peak_memory_source=summary.get("peak_memory_source"),
            batch_size=summary.get("batch_size"),
            loss=summary.get("loss"),
            steps_recorded=summary.get("steps_recorded", 0),
            traceback=record.get("traceback"),
        )


def load_trial(path: str | os.PathLike) -> TrialResult:
    """Read a trial folder (or its trial.json) back into a TrialResult."""
    path = Path(path)
    folder = path.parent if path.name == TRIAL_FILE else path
    try:
        record = json.loads((folder / TRIAL_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise AdvisorError(f"{folder / TRIAL_FILE}: cannot read trial: {exc}") from None
    if record.get("schema") != SCHEMA:
        raise AdvisorError(f"{folder / TRIAL_FILE}: not an {SCHEMA} document")
    return TrialResult.from_record(record, folder)


def parse_target(target: str) -> tuple[Path, str | None]:
    """`script.py`, `script.py:train_step` or `script.py:Class.method` -> (script path, name or None:
    no target, the steps are found where the optimizer steps); one-line errors."""
    script, sep, name = target.rpartition(":") if not target.endswith(".py") else ("", "", "")
    if not sep:
        script, name = target, None
    elif not script or not name:
        raise AdvisorError(f"{target}: expected script.py, script.py:function or script.py:Class.method")
    if name is not None:
        check_name(target, name)
    path = Path(script)
    if not path.is_file():
        raise AdvisorError(f"{script}: no such file")
    if path.suffix != ".py":
        raise AdvisorError(f"{script}: not a Python script (.py)")
    return path.resolve(), name


def check_name(text: str, name: str) -> None:
    """A function name or Class.method; a one-line error otherwise."""
    parts = name.split(".")
    if len(parts) > 2 or not all(p.isidentifier() for p in parts):
        raise AdvisorError(f"{text}: {name!r} is not a function name or Class.method")


def parse_step(step: str, script: Path) -> tuple[dict[str, str | None], Path, str]:
    """`--step pkg.module:Class.method` or `--step path/to/module.py:Class.method` (a step defined in a module
    the script imports) -> (where the harness finds the module, its file, the name); one-line errors."""
    where, sep, name = step.rpartition(":")
    if not sep or not where or not name:
        raise AdvisorError(f"--step {step}: expected pkg.module:function or path/to/module.py:Class.method")
    check_name(f"--step {step}", name)
    if where.endswith(".py"):
        path = Path(where) if Path(where).is_absolute() or Path(where).is_file() else script.parent / where
        if not path.is_file():
            raise AdvisorError(f"--step {step}: {where}: no such file")
        return {"module": None, "file": str(path.resolve())}, path.resolve(), name
    if not all(part.isidentifier() for part in where.split(".")):
        raise AdvisorError(f"--step {step}: {where!r} is not a module name or a .py file")
    found = module_file(where, script.parent)
    if found is None:
        raise AdvisorError(f"--step {step}: module {where} is not found beside {script.name} "
                           "(it is looked for from the script's folder, as the script imports it)")
    return {"module": where, "file": None}, found, name


def module_file(module: str, folder: Path) -> Path | None:
    """The .py file of a module as a script in `folder` would import it (a package's __init__ or a file)."""
    base = folder.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    return None


# --------------------------------------------------------------------------------------------------
# Summary figures (pure)


def summarize(steps: list[dict[str, Any]], harness: dict[str, Any], profiler_peak: int | None = None) -> dict[str, Any]:
    """The trial's headline figures from its step records, the harness's memory readings and the
    trace's peak `Total Allocated` (`add_profiler_memory`)."""
    recorded = [s for s in steps if s.get("recorded")]
    walls = [s["wall_s"] for s in recorded]
    batches = [s["batch_size"] for s in recorded if s.get("batch_size")]
    losses = [x for x in (number(s, "loss") for s in recorded) if x is not None]
    memory = harness.get("memory") or {}
    summary: dict[str, Any] = {
        "steps_recorded": len(recorded),
        "median_step_s": statistics.median(walls) if walls else None,
        "median_call_s": statistics.median([s["call_s"] for s in recorded]) if recorded else None,
        "samples_per_s": None,
        "batch_size": statistics.median(batches) if batches else None,
        "loss": losses[-1] if losses else None,
        "peak_rss_bytes": memory.get("peak_rss_bytes"),
        "peak_vms_bytes": memory.get("peak_vms_bytes")
        or max((s["vms_bytes"] for s in steps if s.get("vms_bytes")), default=None),
        # Linux keeps no peak of the writable data: the largest a step ended with.
        "peak_data_bytes": max((s["data_bytes"] for s in steps if s.get("data_bytes")), default=None),
        "profiler_peak_allocated_bytes": profiler_peak,
    }
    if batches and len(batches) == len(recorded) and sum(walls) > 0:
        summary["samples_per_s"] = sum(batches) / sum(walls)
    summary["profiled_samples_per_s"] = summary["samples_per_s"]
    steady = measure([steps])
    summary["steady"] = steady.to_dict() if steady.source == "windows" else None
    if summary["steady"] is not None:  # the steady state, where it was measured, is the trial's figure
        summary["samples_per_s"] = steady.samples_per_s
    if isinstance(summary["batch_size"], float) and summary["batch_size"].is_integer():
        summary["batch_size"] = int(summary["batch_size"])
    summary["memory_breakdown"] = harness.get("memory_breakdown")
    summary["activations"] = harness.get("activations")
    growth = memory_growth(steps)
    summary["memory_growth"] = growth
    summary["memory_growth_per_step_bytes"] = growth["bytes_per_step"] if growth else None
    # Each call of the target is one micro-step: batch_size and samples_per_s are per micro-step.
    k = (harness.get("accumulation") or {}).get("steps") or 1
    summary.update(
        accumulation_steps=k,
        micro_batch_size=summary["batch_size"],
        effective_batch_size=summary["batch_size"] * k if summary["batch_size"] is not None else None,
    )
    if "cuda_max_allocated_bytes" in memory:
        summary.update(
            cuda_max_allocated_bytes=memory["cuda_max_allocated_bytes"],
            cuda_max_reserved_bytes=memory.get("cuda_max_reserved_bytes"),
            cuda_total_bytes=memory.get("cuda_total_bytes"),
            peak_memory_bytes=memory["cuda_max_allocated_bytes"],
            peak_memory_source="torch.cuda.max_memory_allocated over the recorded steps",
        )
    else:
        summary.update(
            peak_memory_bytes=memory.get("peak_rss_bytes"),
            peak_memory_source="process peak RSS (getrusage ru_maxrss)",
        )
    return summary


def memory_growth(steps: list[dict[str, Any]], skip: int = 1) -> dict[str, Any] | None:
    """Memory growth per step: least-squares slope of per-step memory over the step index, with R².

    The most precise figure the steps have: `cuda_allocated_bytes` (the CUDA allocator's), else the
    profiled steps' `profiler_allocated_bytes` (the CPU allocator's live bytes from the trace), else
    `rss_bytes` (with the profiler recording, its own buffers add to the resident set every step).
    For CUDA and rss the first `skip` steps are left out: they allocate what every later step reuses
    (optimizer state, allocator pools). None with fewer than 3 points.
    """
    if any("cuda_allocated_bytes" in s for s in steps):
        source, candidates = "cuda_allocated_bytes", steps[skip:]
    elif sum("profiler_allocated_bytes" in s for s in steps) >= 3:
        source, candidates = "profiler_allocated_bytes", steps
    else:
        source, candidates = "rss_bytes", steps[skip:]
    points = [(s["index"], s[source]) for s in candidates if isinstance(s.get(source), (int, float))]
    if len(points) < 3:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    syy = sum((y - mean_y) ** 2 for _, y in points)
    slope = sxy / sxx if sxx else 0.0
    r2 = (sxy * sxy / (sxx * syy)) if sxx and syy else 0.0
    # A leak adds about the same every step; a one-time allocation (optimizer state created at the first
    # optimizer step) is one jump: the median difference between consecutive steps tells them apart.
    differences = [b[1] - a[1] for a, b in zip(points, points[1:])]
    return {"bytes_per_step": slope, "r2": r2, "median_difference_bytes": statistics.median(differences),
            "steps": n, "source": source, "first_index": points[0][0]}


def profiler_memory(trace_path: Path) -> tuple[int | None, dict[int, int]]:
    """From the trace's CPU `[memory]` events (profile_memory=True): the largest `Total Allocated`, and
    per `ProfilerStep#N` the `Total Allocated` at the step's end.

    The profiler counts only allocations made while it records, so the per-step figure is the CPU
    allocator's live bytes relative to the profiler's start: exact for growth, unlike the resident set,
    which the profiler's own event buffers inflate step after step.
    """
    try:
        opener = gzip.open if trace_path.suffix == ".gz" else open
        with opener(trace_path, "rt") as f:
            events = json.load(f).get("traceEvents", [])
    except (OSError, ValueError, EOFError):
        return None, {}
    memory = sorted(
        (e["ts"], e["args"]["Total Allocated"])
        for e in events
        if e.get("name") == "[memory]" and isinstance(e.get("args"), dict) and "Total Allocated" in e["args"]
        and e["args"].get("Device Type", 0) == 0 and isinstance(e.get("ts"), (int, float))
    )
    ends = {}
    for e in events:
        name = str(e.get("name", ""))
        if e.get("ph") == "X" and name.startswith("ProfilerStep#") and name[13:].isdigit():
            ends[int(name[13:])] = e["ts"] + e.get("dur", 0)
    by_step, position, current = {}, 0, None
    for step, end in sorted(ends.items(), key=lambda item: item[1]):
        while position < len(memory) and memory[position][0] <= end:
            current = memory[position][1]
            position += 1
        if current is not None:
            by_step[step] = current
    return (max(v for _, v in memory) if memory else None), by_step


def add_profiler_memory(steps: list[dict[str, Any]], trace_paths: list[Path]) -> int | None:
    """Give each profiled step its `profiler_allocated_bytes`; return the traces' peak `Total Allocated`."""
    peaks, by_step = [], {}
    for path in trace_paths:
        peak, figures = profiler_memory(path)
        if peak is not None:
            peaks.append(peak)
        by_step.update(figures)
    for step in steps:
        if step.get("index") in by_step:
            step["profiler_allocated_bytes"] = by_step[step["index"]]
    return max(peaks, default=None)


def read_steps(path: Path) -> list[dict[str, Any]]:
    """The step records the harness appended; a torn last line (a killed trial) is dropped."""
    steps = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return steps
    for line in lines:
        try:
            steps.append(json.loads(line))
        except ValueError:
            break
    return steps


# --------------------------------------------------------------------------------------------------
# Running a trial


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in a process group: what a finished trial must not leave behind."""
    import psutil

    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


TRIAL_TOKEN = "ADVISOR_TRIAL"  # in the environment of every process a trial starts: found even after setsid


def trial_processes(pgid: int, token: str | None = None) -> list[Any]:
    """The live processes of a trial: its process group, the descendants of its first process, and any
    process whose environment carries the trial's token (a daemon that double-forked out of both). With
    a token, only processes that carry it: a recycled process id is never taken for the trial's."""
    import psutil

    found: dict[int, Any] = {}
    for pid in group_members(pgid):
        found[pid] = None
    try:
        for child in psutil.Process(pgid).children(recursive=True):
            found[child.pid] = child
    except psutil.Error:
        pass
    for proc in psutil.process_iter() if token else ():
        found.setdefault(proc.pid, proc)
    processes = []
    for pid, proc in found.items():
        try:
            proc = proc or psutil.Process(pid)
            if pid == os.getpid() or not _alive(proc):
                continue
            if token and proc.environ().get(TRIAL_TOKEN) != token:
                continue
            processes.append(proc)
        except psutil.Error:
            continue
    return processes


def end_trial_processes(pgid: int, token: str | None = None) -> None:
    """End a trial: SIGTERM to all its processes (`trial_processes`), a moment to exit, then SIGKILL."""
    import psutil

    processes = trial_processes(pgid, token)
    if not processes:
        return
    for send in (signal.SIGTERM, signal.SIGKILL):
        for proc in processes:
            try:
                proc.send_signal(send)
            except psutil.Error:
                pass
        # A moment to exit on SIGTERM; after SIGKILL, until the kernel has ended them.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(_alive(p) for p in processes):
            time.sleep(0.05)


def _alive(process: Any) -> bool:
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def run_trial(
    target: str,
    knobs: Knobs | None,
    out_dir: str | os.PathLike,
    *,
    name: str | None = None,
    steps: int = 5,
    wait: int = 2,
    warmup: int = 1,
    device: str = "auto",
    script_args: Sequence[str] = (),
    timeout_s: float = 600.0,
    memory_limit: int | None = None,
    profile: bool = True,
    python: str | None = None,
    env: dict[str, str] | None = None,
    windows: int = 0,
    window_s: float = 1.0,
    step: str | None = None,
    loader: dict[str, Any] | None = None,
    on_start: Callable[[int, str], None] | None = None,
) -> TrialResult:
    """Run `script.py[:target]` once in a fresh subprocess with `knobs`; write and return its results.

    No target: the script runs unchanged and each optimizer step ends a step. `step`: the step is a
    function of a module the script imports (`pkg.module:Class.method` or `path/module.py:name`).
    `loader`: the training loader's site and ordinal (from an earlier trial's `training_loader`): the
    DataLoader knobs go to that loader only. `on_start(pid, token)`: called once the trial process runs
    (the session records both, to end a trial its killed predecessor left behind).

    A trial that fails (error, oom, timeout, target-not-found) returns a result with that status;
    bad arguments raise AdvisorError; Ctrl-C marks the trial "interrupted" and re-raises
    KeyboardInterrupt once the trial's processes are gone.
    """
    knobs = knobs or Knobs()  # None: the user's own settings
    script, func = parse_target(target)
    step_module, defined_in = None, script
    if step is not None:
        if func is not None:
            raise AdvisorError(f"{target}: give the step either after the script (script.py:name) or with --step")
        step_module, defined_in, func = parse_step(step, script)
    if steps < 1 or wait < 0 or warmup < 0:
        raise AdvisorError(f"--steps must be >= 1 (got steps={steps}, wait={wait}, warmup={warmup})")
    if windows < 0 or (windows and not (math.isfinite(window_s) and window_s > 0)):
        raise AdvisorError(f"--windows must be >= 0 and --window > 0 (got {windows} windows of {window_s} s)")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise AdvisorError(f"--timeout must be a positive number of seconds, not {timeout_s}")
    if device not in ("auto", "cpu", "cuda"):
        raise AdvisorError(f"--device: expected auto, cpu or cuda, not {device!r}")
    out = Path(out_dir).resolve()
    if (out / TRIAL_FILE).exists():
        raise AdvisorError(f"{out}: already holds a trial; choose another folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / TRIAL_MARKER).touch()  # this folder is a trial's: --resume may remove it, never a folder without
    except OSError as exc:
        raise AdvisorError(f"{out}: cannot create the trial folder: {exc.strerror}") from None
    started = time.time()
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "name": name or out.name,
        "target": func,
        "step": step,
        "script": str(script),
        "script_args": list(script_args),
        "device": device,
        "knobs": knobs.to_dict(),
        "knob_outcomes": {},
        "user_values": None,
        "dataloaders": [],
        "training_loader": None,
        "accumulation": None,
        "schedule": {"wait": wait, "warmup": warmup, "active": steps, "windows": windows, "window_s": window_s},
        "profiled": profile,
        "memory_limit": memory_limit,
        "memory_cap": None,
        "status": "running",
        "message": "",
        "device_facts": None,
        "steps": [],
        "summary": None,
        "trace_files": [],
        "log_file": LOG_FILE,
        "pid": None,
        "token": uuid.uuid4().hex,
        "times": {"started_at": started},
    }
    try:
        tree = ast.parse(script.read_text(), filename=str(script))
        if defined_in != script:
            tree = ast.parse(defined_in.read_text(), filename=str(defined_in))
        if func is not None:
            locate_target(tree, func)
    except SyntaxError as exc:
        raise AdvisorError(f"{exc.filename}:{exc.lineno}: cannot parse the script: {exc.msg}") from None
    except TargetNotFound as exc:
        record.update(status="target-not-found", message=f"{defined_in.name}: {exc}")
        return _finish(record, out, started)

    config = {
        "script": str(script),
        "target": func,
        "step_module": step_module,
        "loader": loader,
        "script_args": list(script_args),
        "knobs": knobs.to_dict(),
        "out_dir": str(out),
        "wait": wait,
        "warmup": warmup,
        "active": steps,
        "device": device,
        "memory_limit": memory_limit,
        "profile": profile,
        "measure": {"windows": windows, "window_s": window_s},
        "parent": os.getpid(),
    }
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, child_env.get("PYTHONPATH")]))
    child_env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        child_env["CUDA_VISIBLE_DEVICES"] = ""  # the script's own "cuda if available" picks the CPU
    child_env[TRIAL_TOKEN] = record["token"]
    write_json_atomic(out / TRIAL_FILE, record)
    proc = None
    previous_sigterm = _sigterm_as_interrupt()
    try:
        with open(out / LOG_FILE, "wb") as log:
            proc = subprocess.Popen(
                [python or sys.executable, "-c", _HARNESS_ENTRY, json.dumps(config)],
                cwd=script.parent,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env,
                start_new_session=True,  # its own process group: one killpg ends it and its workers
            )
        record["pid"] = proc.pid
        write_json_atomic(out / TRIAL_FILE, record)
        if on_start is not None:
            on_start(proc.pid, record["token"])
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            end_trial_processes(proc.pid, record["token"])
            proc.wait()
            record.update(status="timeout", message=f"the trial exceeded its time limit of {timeout_s:g} s")
    except KeyboardInterrupt:
        with _interrupts_held():  # a second Ctrl-C must not leave the record at "running"
            if proc is not None:
                end_trial_processes(proc.pid, record["token"])
                proc.wait()
            record.update(status="interrupted", message="interrupted (Ctrl-C); the trial's processes were stopped")
            _finish(record, out, started)
        raise
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
        if proc is not None:
            # Workers the harness could not reach, a script that double-forked out of the group.
            end_trial_processes(proc.pid, record["token"])
    if record["status"] == "running" and not (out / RESULT_FILE).exists():
        code = proc.returncode
        if code == -signal.SIGKILL:
            # Nobody here sent it: on Linux that is almost always the kernel's out-of-memory killer.
            record.update(status="oom", message="the trial process was killed (SIGKILL), most likely by the "
                          f"kernel's out-of-memory killer; see {out / LOG_FILE}")
        else:
            why = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            record.update(status="error", message=f"the trial process {why}; see {out / LOG_FILE}")
    return _finish(record, out, started)


@contextlib.contextmanager
def _interrupts_held():
    """Ctrl-C (and SIGTERM) are ignored while a trial's record is finished (main thread only)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _sigterm_as_interrupt():
    """While a trial runs, SIGTERM to the advisor is handled like Ctrl-C (main thread only)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)


def user_values(dataloaders: list[dict[str, Any]], threads: int | None) -> dict[str, Any] | None:
    """The user's own values of the knobs: the training loader's (else the first loader's) and torch's threads."""
    loader = next((d for d in dataloaders if d.get("training")), dataloaders[0] if dataloaders else None)
    values = {k: loader["user"].get(k) for k in DATALOADER_KNOBS} if loader is not None else {}
    if threads is not None:
        values["threads"] = threads
    return values or None


def _finish(record: dict[str, Any], out: Path, started: float) -> TrialResult:
    """Merge the harness's files into the record, write trial.json, return the result."""
    harness: dict[str, Any] = {}
    harness_file = out / RESULT_FILE
    if harness_file.exists():
        try:
            harness = json.loads(harness_file.read_text())
        except ValueError:
            harness = {}
    if record["status"] == "running" and harness:
        record["status"] = harness.get("status", "error")
        record["message"] = harness.get("message", "")
    for key in ("error_type", "traceback"):
        if harness.get(key):
            record[key] = harness[key]
    record["device_facts"] = harness.get("device")
    record["memory_cap"] = harness.get("memory_cap")
    record["knob_outcomes"] = harness.get("outcomes", {})
    record["dataloaders"] = harness.get("dataloaders", [])
    record["training_loader"] = harness.get("training_loader")
    record["sites"] = harness.get("sites") or {}
    record["model_dtypes"] = harness.get("model_dtypes")
    record["accumulation"] = harness.get("accumulation")
    record["user_values"] = user_values(record["dataloaders"], harness.get("user_threads"))
    record["steps"] = read_steps(out / STEPS_FILE)
    traces = sorted(out.glob("*.pt.trace.json*"))
    record["trace_files"] = [p.name for p in traces]
    profiler_peak = add_profiler_memory(record["steps"], traces)
    record["summary"] = summarize(record["steps"], harness, profiler_peak)
    ended = time.time()
    record["schedule"].update(harness.get("schedule") or {})
    record["times"].update(harness.get("times", {}))
    record["times"].update(ended_at=ended, duration_s=ended - started)
    write_json_atomic(out / TRIAL_FILE, record)
    for leftover in (harness_file, out / STEPS_FILE):
        leftover.unlink(missing_ok=True)
    return TrialResult.from_record(record, out)


# --------------------------------------------------------------------------------------------------
# `advisor profile`: the trial's options


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `advisor profile`."""
    parser.add_argument("target", nargs="?",
                        help="script.py (the steps are found where its optimizer steps), or script.py:train_step "
                             "or script.py:Class.method (each call one step)")
    parser.add_argument("--step", metavar="MODULE:NAME",
                        help="the step function, defined in a module the script imports: pkg.module:Class.method "
                             "or path/to/module.py:function")
    parser.add_argument("--steps", type=int, default=5, help="steps recorded by the profiler (default 5)")
    parser.add_argument("--wait", type=int, default=2, help="first steps left out of the trace (default 2)")
    parser.add_argument("--warmup", type=int, default=1, help="profiler warm-up steps (default 1)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--out", help="output folder (default runs/<script>-<timestamp>)")
    parser.add_argument("--no-apply", action="store_true", help="only run the baseline trial and diagnose it")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a trial may take (default 600)")
    parser.add_argument("--memory-limit", help="cap the trial's memory, e.g. 4G or 800M: device memory on a GPU, "
                        "the process's writable memory on the CPU")
    parser.set_defaults(script_args=[])
    parser.epilog = "Arguments after -- are passed to the script: advisor profile train.py -- --lr 0.1"
    # argparse cannot take options after the target and still hand the rest after `--` to a
    # positional, so the script's arguments are split off before argparse sees them.
    original = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        script_args = []
        if "--" in args:
            split = args.index("--")
            args, script_args = args[:split], args[split + 1 :]
        namespace, extras = original(args, namespace)
        namespace.script_args = script_args
        return namespace, extras

    parser.parse_known_args = parse_known_args


def parse_size(text: str) -> int:
    """`4G`, `800M`, `1.5GiB` or plain bytes -> bytes; one-line error otherwise."""
    units = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    raw = text.strip().lower().removesuffix("ib").removesuffix("b")
    number, unit = (raw[:-1], raw[-1]) if raw and raw[-1] in units else (raw, "")
    try:
        value = int(float(number) * units[unit])
    except (ValueError, OverflowError):  # "lots", "inf", "nan"
        raise AdvisorError(f"--memory-limit: cannot read {text!r} as a size like 4G or 800M") from None
    if value <= 0:
        raise AdvisorError(f"--memory-limit: must be positive, not {text!r}")
    return value


def default_out_dir(script: Path) -> Path:
    """`runs/<script-stem>-<timestamp>` in the current folder."""
    return Path("runs") / f"{script.stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


__all__ = [
    "SCHEMA",
    "TrialFailed",
    "TrialResult",
    "add_profile_arguments",
    "load_trial",
    "parse_target",
    "run_trial",
]

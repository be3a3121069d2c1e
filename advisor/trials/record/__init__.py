"""A trial's record, `trial.json`: what it ran with, what each step measured, and the figures of both.

Written by the runner that ran the trial (`advisor.trials.launch.runner` in a subprocess,
`advisor.trials.launch.inprocess` in the notebook's process) and read by the search, the report and the
analysis. Torch-free.

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
                     windows_measured, against?, verdict?}: steps skipped (wait includes queue_depth: workers × prefetch_factor
                     batches queued before the first step), warmed up, profiled; then settle steps and
                     measurement windows of at least window_s seconds and min_window_steps steps; with
                     `against` (advisor.trials.record.adaptive: the best's figure), windows until `verdict`
                     ("better", "worse", "equivalent", "not better"; null at the cap) settled it
    profiled        false for a timing-only trial (no profiler, no trace)
    memory_limit    the --memory-limit in bytes, or null
    memory_cap      what the limit capped, or null: {device: "cpu"|"cuda:N", bytes, what, how, held_bytes?,
                    freed_blocks_returned?}; on
                    a CUDA device the caching allocator's share of device memory
                    (torch.cuda.set_per_process_memory_fraction), on the CPU the process's writable
                    memory (RLIMIT_DATA: heap and anonymous mappings; not the address space, of which
                    CUDA's libraries reserve far more than they use) beyond the `held_bytes` the process
                    held before the script ran (torch's libraries), so the limit is set at bytes + held_bytes;
                    freed_blocks_returned: glibc gives each freed block of 1 MiB or more back (the cap then
                    counts what the step holds, not the allocator's free lists)
    status          "running" | "ok" | "error" | "oom" | "timeout" | "interrupted" | "target-not-found"
    message         one line saying what happened
    error_type      exception class name (error/oom), "NativeCrash" for a process or rank that crashed in
                    native code (its Python stack at the crash in crash.txt, or crash.rank{R}.txt), else absent
    retried_after   present when the trial ran again after a native crash: the first run's crash message
                    (its log kept as output.attempt1.log)
    traceback       the user's traceback text (our frames left out), else absent
    device_facts    {type: "cpu"|"cuda", torch, python, platform,
                     cpu: {model, logical_cores, physical_cores, torch_threads, ram_bytes, bf16_instructions,
                          niceness (the trial's nice value: the advisor's own, under --ray too)},
                     gpu: {name, compute_capability, total_memory_bytes, ..., nvml: {...}} (CUDA only)}
    steps           [{index, wall_s, call_s, data_s, loader, recorded, phase, window?, batch_size, batch_size_source,
                      loss, load?, rss_bytes,
                      vms_bytes, data_bytes, cuda_allocated_bytes?, cuda_max_allocated_bytes?, cuda_max_reserved_bytes?,
                      profiler_allocated_bytes?, graphs?}]
                    wall_s is the span ProfilerStep#index: from the end of the previous step to the end
                    of this call (the user's data loading plus the call); call_s is the call alone (with
                    no step function: wall_s less data_s); data_s is the time spent in DataLoader
                    __next__ since the previous step; loader indexes `dataloaders` (the loader whose batch
                    came last); loss is the returned loss, else the last scalar backward() ran from;
                    phase: "wait" (skipped: the first --wait steps and the batches the workers queued
                    before the first step), "warmup", "profiled" (recorded: in the trace), "settle"
                    (the queue refilled while the trace was written), "window" (measured, in window k);
                    load, on the step that closed a window: {taken, waited, other_cpu, gpu_other}: the
                    share of the CPU the trial's processes asked for that others took, the share of its
                    own threads' ready time they waited, the shares of the machine's CPU and of the GPU's
                    SM time other processes used beside that window
                    (advisor.trials.harness.machine_load; gpu_other null where NVML cannot say);
                    profiler_allocated_bytes (profiled steps) is the trace's CPU `Total Allocated` at the
                    end of the step: live bytes of the CPU allocator counted from the profiler's start;
                    graphs (the compile knob on): dynamo's graphs compiled in the process by the step's end
    compile         null, or with the compile knob applied: {graphs, graph_breaks, break_reasons, compile_s,
                     window_graphs?} (`compile_summary`; window_graphs > 0: a recompile inside the windows)
    checkpoint_plan null, or with the checkpointing knob applied: {holder, file, attribute, how ("loop" or
                     "sequential"), block, count, names}: the module holding the checkpointed blocks
    channels_last_inputs null, or with channels_last applied: the positions of the 4-D floating-point inputs of
                     the model's first call, which the trial made channels_last (the patch writes it on each)
    summary         {steps_recorded, median_step_s, median_call_s, samples_per_s, batch_size, loss,
                     peak_memory_bytes, peak_memory_source, peak_rss_bytes, peak_vms_bytes, peak_data_bytes,
                     profiler_peak_allocated_bytes, cuda_max_allocated_bytes?, cuda_total_bytes?,
                     accumulation_steps, micro_batch_size, effective_batch_size}
                    steady: the measurement windows (`advisor.trials.record.measurement.Measurement`):
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
                      of rss_bytes (the measured windows' steps, else all but the first); a leak has slope ≈
                      median difference > 0
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

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError
from advisor.trials.record.measurement import measure
from advisor.trials.record.ranks import merge_ranks, rank_files
from advisor.knobs import DATALOADER_KNOBS
from advisor.trials.knobs import Knobs
from advisor.trials.record.storage import number, write_json_atomic
from advisor.trials.record.memory_summary import add_profiler_memory, memory_growth

SCHEMA = "advisor.trial/1"
TRIAL_FILE = "trial.json"
TRIAL_MARKER = ".advisor-trial"  # in every folder a trial made
TRIAL_TOKEN = "ADVISOR_TRIAL"  # in the environment of every process a trial starts: found even after setsid
# Beside the token, in a Ray job's ranks: which node's. Several nodes of one cluster can share a machine, and a
# node that has finished must not end the ranks of another that is still writing its result.
TRIAL_NODE = "ADVISOR_TRIAL_NODE"
LOG_FILE = "output.log"
RESULT_FILE = "harness.json"  # what the harness leaves for the runner to merge
STATUSES = ("running", "ok", "error", "oom", "timeout", "interrupted", "target-not-found")


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


def user_values(dataloaders: list[dict[str, Any]], threads: int | None, ddp: dict[str, Any] | None = None,
                model: dict[str, Any] | None = None, framework: dict[str, Any] | None = None,
                own: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The user's own values of the knobs: the training loader's (else the first loader's), torch's threads,
    DistributedDataParallel's arguments where the script wraps its model in it, and the model knobs a trial
    changed (channels_last, compile, fused_optimizer, tf32, cudnn_benchmark); where a framework's settings
    feed the loader (TrainingArguments), the script's values there, not those of the loader it built; and
    the settings the script made itself, seen in the running trial (`own`: its autocast, a compiled model,
    a fused optimizer, its own accumulation; `advisor.trials.interposition.own_settings`)."""
    loader = next((d for d in dataloaders if d.get("training")), dataloaders[0] if dataloaders else None)
    values = {k: loader["user"].get(k) for k in DATALOADER_KNOBS} if loader is not None else {}
    if threads is not None:
        values["threads"] = threads
    values.update({k: v for k, v in (ddp or {}).items() if k.startswith("ddp_")})
    values.update(model or {})
    values.update({k: v for k, v in ((framework or {}).get("user") or {}).items() if k != "accumulation_steps"})
    values.update({k: s["value"] for k, s in (own or {}).items()})
    return values or None


def compile_summary(compiled: dict[str, Any] | None, steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What torch.compile cost and did: `compile_s`, the time the steps before the measured ones took beyond
    the steady state (the compile runs in them; it is never in samples/s), with dynamo's graphs and breaks,
    and `window_graphs`: graphs compiled during the measured windows (a recompile that samples/s holds)."""
    if not compiled:
        return None
    counted = [(s.get("phase"), s["graphs"]) for s in steps if s.get("graphs") is not None]
    first_window = next((i for i, (phase, _) in enumerate(counted) if phase == "window"), None)
    if first_window:  # graphs at the last window step beyond those at the step before the first
        compiled = {**compiled, "window_graphs": counted[-1][1] - counted[first_window - 1][1]}
    steady = [s["wall_s"] for s in steps if s.get("phase") == "window"] or \
        [s["wall_s"] for s in steps if s.get("phase") == "profiled"]
    before = [s["wall_s"] for s in steps if s.get("phase") not in ("window", "profiled")]
    if not steady or not before:
        return {**compiled, "compile_s": None}
    typical = statistics.median(steady)
    return {**compiled, "compile_s": sum(max(0.0, w - typical) for w in before)}


def read_result(path: Path) -> dict[str, Any]:
    """A harness result file, or {} when it is missing or torn (a killed trial)."""
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return result if isinstance(result, dict) else {}


def complete_record(record: dict[str, Any], out: Path, started: float, world_size: int = 1) -> TrialResult:
    """Merge the harness's files (steps, result, traces; one set per rank of a data-parallel trial) into
    the trial record, write trial.json, return the result.

    A data-parallel trial's figures are rank 0's, its status the first failing rank's, its samples/s the
    job's (every rank's summed), and `ranks` holds each rank's own."""
    harness, results, rank_steps = merge_ranks(out, world_size, read_result, read_steps)
    if record["status"] == "running" and harness:
        record["status"] = harness.get("status", "error")
        record["message"] = harness.get("message", "")
    for key in ("error_type", "traceback", "script_ended"):
        if harness.get(key):
            record[key] = harness[key]
    record["python"] = harness.get("python")  # the interpreter the script ran under (its dependencies' environment)
    record["device_facts"] = harness.get("device")
    record["memory_cap"] = harness.get("memory_cap")
    record["knob_outcomes"] = harness.get("outcomes", {})
    record["dataloaders"] = harness.get("dataloaders", [])
    record["training_loader"] = harness.get("training_loader")
    record["sites"] = harness.get("sites") or {}
    record["model_dtypes"] = harness.get("model_dtypes")
    record["single_rank_job"] = bool(record.get("single_rank_job") or harness.get("single_rank_job"))
    record["accumulation"] = harness.get("accumulation")
    record["own_settings"] = harness.get("own_settings") or {}
    record["user_values"] = user_values(record["dataloaders"], harness.get("user_threads"), harness.get("user_ddp"),
                                        harness.get("user_model"), harness.get("framework"), record["own_settings"])
    record["framework"] = harness.get("framework")
    record["compile"] = compile_summary(harness.get("compile"), rank_steps[0])
    record["optimizers"] = harness.get("optimizers")
    record["uint8_plan"] = harness.get("uint8_plan")  # how the Dataset was made to hand out 8-bit images
    record["attention_plan"] = harness.get("attention_plan")  # the attention lines sdpa replaced, for the patch
    record["attention_modules"] = harness.get("attention_modules")  # each attention found: rewritable or why not
    record["checkpoint_plan"] = harness.get("checkpoint_plan")  # where the checkpointed blocks sit, for the patch
    record["channels_last_inputs"] = harness.get("channels_last_inputs")  # the model's 4-D inputs, for the patch
    record["windows_cut"] = harness.get("windows_cut")  # why fewer windows were measured (the time limit)
    record["trace_plan"] = harness.get("trace_plan") or record.get("trace_plan")  # the operators counted, and the steps the trace could hold
    record["steps"] = rank_steps[0]
    traces = sorted(out.glob("*.pt.trace.json*"))
    record["trace_files"] = [p.name for p in traces]
    ours = [p for p in traces if world_size <= 1 or p.name.startswith(rank_files(world_size, 0)["worker"] + ".")]
    # A light trace has no memory events: not read again for them (a 26 MB trace of a 2.6-million-operator step
    # took the advisor's process to 1 GB decoding it whole).
    light = (record["trace_plan"] or {}).get("light")
    profiler_peak = add_profiler_memory(record["steps"], [] if light else ours)
    record["summary"] = summarize(record["steps"], harness, profiler_peak)
    if world_size > 1:
        record["world_size"] = world_size
        record["ranks"] = [{"rank": rank, "status": result.get("status", "error"), "message": result.get("message"),
                            "summary": summarize(steps, result), "steps": steps}
                           for rank, (result, steps) in enumerate(zip(results, rank_steps))]
        rates = [r["summary"].get("samples_per_s") for r in record["ranks"]]
        record["summary"]["rank_samples_per_s"] = record["summary"]["samples_per_s"]
        record["summary"]["samples_per_s"] = sum(rates) if all(rates) else None
    ended = time.time()
    record["schedule"].update(harness.get("schedule") or {})
    record["times"].update(harness.get("times", {}))
    record["times"].update(ended_at=ended, duration_s=ended - started)
    write_json_atomic(out / TRIAL_FILE, record)
    for rank in range(world_size):
        for name in ("result", "steps", "schedule"):  # all in trial.json now (the schedule as it ran)
            (out / rank_files(world_size, rank)[name]).unlink(missing_ok=True)
        crash = out / rank_files(world_size, rank)["crash"]
        if crash.exists() and not crash.stat().st_size:  # kept only where a rank crashed
            crash.unlink()
    return TrialResult.from_record(record, out)

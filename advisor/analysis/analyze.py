"""Trace file(s) → Diagnosis with recommendations → the `advisor.analysis/1` JSON document.

The JSON document (`--json`) has the schema `advisor.analysis/1`:

    {"schema": "advisor.analysis/1", "path": str,
     "traces": [TRACE, ...],            # one per trace file, in path order
     "skipped": [{"path", "reason"}],   # .json files in the folder that are not torch.profiler traces
     "jobs": [JOB, ...],                # data-parallel jobs: traces with distributedInfo, by folder
     "summary": {"traces": int, "mean_step_ms": float, "slowest": str, "recommendations": [id, ...],
                 "bounds": {source: bound | null}}}

    TRACE = {"source": str, "platform": "gpu"|"cpu"|<accelerator, e.g. "mtia">,
             "device": {"name", "vendor", "compute_capability", "total_memory", "described"} | null,
             "steps": {"count", "names", "mean_ms", "median_ms", "note"},
             "bound": one of "input", "copy", "host", "compute", "communication", "memory" | null,
             "bound_label": str | null, "bound_evidence": [str], "bound_shares": {bound: share of step},
             "breakdown_ms": {role: ms per step}, "breakdown_share": {role: share of step},
             "dataloader_share", "dataloader_wait_share", "loader_steady_share",
             "gpu_utilization", "utilization_by_device",
             "tensor_core_share", "eligible_share", "eligible_op_share", "layout_share", "kernel_ms",
             "attention": {"share", "hand_written_share", "fused_share", "ms_per_step", "per_step",
                           "implementations": [str],
                           "modules": [{"class", "rewritable", "why"}] (a trial that tried sdpa)} | null,
             "copies": {"pageable_ms", "pinned_ms", "unknown_ms", "count", "bytes", "synchronous",
                        "sync_wait_ms", "pageable_wait_ms", "host_wait_ms", "exposed_ms",
                        "overlap_with_kernels", "share"},
             "host": {"launches_per_step", "kernels_per_step", "graph_launches_per_step",
                      "optimizer": {"name", "us_per_step", "implementation"} | null} | null,
             "memory": [{"device", "peak_allocated", "peak_reserved", "capacity", "headroom", "growth"}],
             "findings": [{"code", "message", "value"}], "missing": [str], "distributed": {...} | null,
             "communication": {"backend", "rank", "world_size", "total_ms", "exposed_ms", "overlapped_ms",
                               "exposed_share", "collectives_per_step", "bytes_per_step",
                               "collectives": [{"name", "count", "bytes", "largest"}]} | null,
             "skipped_events": [{"reason", "count"}],
             "trial": {"name", "status", "knobs", "user_values", "summary", "device_facts"} | null,
             "recommendations": [{"id", "title", "knobs", "predicted_gain", "evidence", "code_change",
                                  "caveat", "details", "bound", "helps_now", "helps_once", "recoverable",
                                  "worth"}]}

    JOB = {"source": folder, "backend", "world_size",
           "ranks": [{"rank", "trace", "step_ms", "own_ms", "exposed_communication_ms", "bound", "breakdown_ms"}],
           "missing_ranks": [int],      # ranks of the world whose traces are not in the folder
           "straggler": {"rank", "excess_ms", "share", "bound", "excess_by_role_ms", "others_wait_ms"} | null,
           "bound", "verdict": str, "recommendations": [...]}

A rank's own time is its step less its exposed communication (the time it only waited in collectives);
the straggler is the rank whose own time exceeds the others' median by 15% of the step or more
(`advisor.analysis.job`), and the job's bound is where its extra time goes.

Roles are kernel, memcpy, memset, communication, runtime, dataloader, cpu_op, other. Shares are fractions
(0..1); times are milliseconds; memory is bytes. A figure the trace cannot give is null. New fields may be
added within version 1; renaming or removing one bumps the version.

The bound (`advisor.analysis.bound.find_bound`) is what holds the step back, null when the trace cannot say
(a degenerate trace: too few events, another process's events, start-up calls; `missing` says which).
`bound_shares` splits the step among the bounds, each moment once (compute > communication > copy >
input > host). Each recommendation names the bound it addresses; `helps_now` is true when that is the
trace's bound (or the bound is null), else `helps_once` names the bound to fix first, and its
`predicted_gain` is what it should save once its own bound binds (as a share of today's step), not now.
Recommendations come by `worth`, what each is worth a trial (`advisor.analysis.worth`): the expected
improvement of samples/s given its predicted gain and its kind's spread, the spread never wider than
`recoverable` (the share of the step its evidence says it can take back, null where no share bounds it).
Copies: `sync_wait_ms` is the host's wait in synchronizes and blocking copy calls (what non_blocking
removes), `pageable_wait_ms` its wait inside async copy calls from pageable memory (what pin_memory
removes), `host_wait_ms` both; `exposed_ms` is copy and wait time with no kernel running.
`layout_share` is the share of kernel time in NCHW↔NHWC layout conversions (channels_last removes them).
`attention` is attention's time per step and share of the step (`advisor.analysis.attention`): written by hand
(matmul, softmax, matmul: what the `sdpa` knob fuses) or fused SDPA, with the implementations seen ("flash",
"memory-efficient", "cuDNN", "math", "flash (CPU)", "hand-written"); on a GPU the kernels' time, on a CPU the
operators'.
`loader_steady_share` is the DataLoader share once its workers' queue ran dry, when the profiled window
understated it (finding "loader-queue").
`skipped_events` counts events the loader left out as odd but legal (ProfilerStep spans of zero length, or
overlapping the step before), each reason also a finding "skipped-events". What the loader refuses is in
`advisor/analysis/validation.py` (`check_times`, `check_sizes`); a trial.json's fields of the wrong type are
named in `missing`. File names that are not UTF-8 appear with their bytes escaped (`\\xff`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Callable

import msgspec

from advisor.analysis.bound import BOUNDS
from advisor.analysis.breakdown import ROLES
from advisor.analysis.diagnosis import Diagnosis, diagnose
from advisor.analysis.job import Job, exposed_us, jobs_of_path, own_us, rank_of
from advisor.analysis.steps import parse_steps
from advisor.analysis.rules import recommend
from advisor.errors import AdvisorError, NotATrace, TraceError
from advisor.escape import strings_without_surrogates
from advisor.files import is_regular
from advisor.shapes import TRIAL, RecordError, conform_record, read_record
from advisor.analysis.reading import trace_files
from advisor.analysis.trace import Trace, collector_paused, forget_traces, load_trace

SCHEMA = "advisor.analysis/1"


def read_trial_record(trace_path: Path) -> tuple[dict | None, list[str]]:
    """The trial.json that `advisor profile` wrote beside a trace, if there is one, and what in it could not
    be used.

    The record is untrusted: fields the analysis reads that have the wrong type (text for a number, a list
    for an object, NaN) are ignored, not fatal, and named in the problems (`advisor.shapes.TRIAL`). One that
    is not a regular file (a FIFO, a device) is not opened, and the problems say so; a regular file that
    is not a trial record at all (not JSON, no 'advisor.trial/' schema) is a RecordError.
    """
    path = Path(trace_path).parent / "trial.json"
    if not os.path.lexists(path):
        return None, []
    if not is_regular(path):
        return None, ["it is not a regular file (a FIFO, device, folder or broken link), so it was not read"]
    record = read_record(path, "advisor.trial/")
    trial, problems = conform_record(record, TRIAL)
    return trial, problems


def read_trial(trace_path: Path) -> dict | None:
    """The trial.json beside a trace, if there is one, with wrongly typed fields left out (see
    `read_trial_record`)."""
    return read_trial_record(trace_path)[0]


# Static findings on the script a trial.json names (they can name the line behind a leak), or None. The
# linter is the caller's (`advisor.code.lint.script_findings`): the analysis imports no other stage.
Linter = Callable[[Path], list[dict] | None]


def analyze_file(path: Path | str, steps: str | None = None, linter: Linter | None = None, *,
                 timelines: bool = False, trace: Trace | None = None) -> Diagnosis:
    """Load one trace, diagnose it and attach its ranked recommendations.

    `linter`: lints the script the trial.json beside the trace names (the CLI, the notebook API and the
    session pass one; the report none, as it opens nothing outside the session folder it reads). `timelines`:
    see `advisor.analysis.diagnosis.diagnose`. `trace`: the file already loaded (`load_trace(path)`), for a
    caller that reads it again (the report's hotspots)."""
    return advise(*diagnose_file(path, steps, timelines, trace), linter)


def diagnose_file(path: Path | str, steps: str | None = None, timelines: bool = False,
                  trace: Trace | None = None) -> tuple[Diagnosis, list[str]]:
    """One trace's Diagnosis, without advice yet, and what in its trial.json could not be used."""
    trial, problems = read_trial_record(Path(path))
    with collector_paused():
        diagnosis = diagnose(load_trace(path) if trace is None else trace, steps, trial, timelines=timelines)
    return diagnosis, problems


def advise(diagnosis: Diagnosis, problems: list[str], linter: Linter | None = None) -> Diagnosis:
    """A Diagnosis with its script's lint (`linter`), what its trial.json lacked, and its recommendations."""
    trial = diagnosis.trial
    if linter is not None and trial and trial.get("script"):
        diagnosis.extra["lint"] = linter(Path(trial["script"]))
    missing = diagnosis.missing
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        missing += (f"a trial.json the analysis can use in full (what was left out: {shown})",)
    return dataclasses.replace(diagnosis, recommendations=recommend(diagnosis), missing=missing)


# The traces of a folder (a data-parallel job's ranks, a session's trials) are parsed in this many processes at
# once: one per core the process may run on, at most one per file. ADVISOR_READ_PROCESSES sets another number
# (1: one after another, in this process).
READ_PROCESSES_ENV = "ADVISOR_READ_PROCESSES"


def read_processes(files: int) -> int:
    """How many processes parse `files` trace files (see READ_PROCESSES_ENV)."""
    given = os.environ.get(READ_PROCESSES_ENV)
    if given:
        try:
            wanted = int(given)
        except ValueError:
            raise AdvisorError(f"{READ_PROCESSES_ENV}={given!r} is not a whole number of processes") from None
    else:
        wanted = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(wanted, files))


@dataclasses.dataclass(frozen=True)
class ReadProblem:
    """An error a reading process met, sent back as its parts: an error built from a path and a problem does
    not survive pickling."""

    kind: type
    path: object
    problem: str


def diagnose_or_problem(path: Path, steps: str | None, timelines: bool):
    """`diagnose_file` in a reading process: its result, or the ReadProblem it met. The process keeps no trace
    (`forget_traces`): it sends the Diagnosis back and reads no file twice, and the next file's events take the
    memory this one's held, where new memory is faulted in page by page."""
    try:
        return diagnose_file(path, steps, timelines)
    except (TraceError, RecordError) as exc:
        return ReadProblem(type(exc), exc.path, exc.problem)
    finally:
        forget_traces()


def diagnose_files(files: list[Path], steps: str | None, timelines: bool, parallel: bool = False) -> list:
    """Each file's `diagnose_file` result, or the TraceError (or RecordError) it met, as an exception object,
    in order; with `parallel`, in parallel processes where there is more than one file and core (see
    `read_processes`)."""
    processes = read_processes(len(files)) if parallel else 1
    if processes == 1:
        out = []
        for p in files:
            try:
                out.append(diagnose_file(p, steps, timelines))
            except (TraceError, RecordError) as exc:
                out.append(exc)
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # Forked, not spawned: a reading process starts with the analysis imported (a spawned one would import it
    # again, about a third of a second). Each parses its files and sends back the Diagnoses only.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context(method)) as pool:
        results = list(pool.map(diagnose_or_problem, files, [steps] * len(files), [timelines] * len(files)))
    return [r.kind(r.path, r.problem) if isinstance(r, ReadProblem) else r for r in results]


def analyze_path(path: Path | str, steps: str | None = None, skipped: list | None = None,
                 linter: Linter | None = None, *, timelines: bool = False, parallel: bool = False) -> list[Diagnosis]:
    """Diagnoses for a trace file or every trace file under a folder (`linter`: see `analyze_file`;
    `timelines`: see `advisor.analysis.diagnosis.diagnose`). `parallel`: a folder's files are parsed in
    parallel processes (`read_processes`), forked from this one: for a caller whose process runs nothing else
    meanwhile (`advisor analyze`, `advisor compare`), not the session, whose trials measure while it reads, nor
    a notebook's kernel, whose threads a fork would copy.

    In a folder, a .json file that is not a torch.profiler trace (not JSON, or JSON of another shape) is
    skipped and `skipped`, when given, receives (path, reason); a broken trace is still an error.
    """
    path = Path(path)
    if steps:
        parse_steps(steps)  # a malformed --steps fails before any trace is read
    if linter is not None:
        linter = functools.lru_cache(maxsize=None)(linter)  # the ranks (or trials) of one script: linted once
    files = trace_files(path)
    out = []
    for p, found in zip(files, diagnose_files(files, steps, timelines, parallel)):
        if isinstance(found, NotATrace) and p != path:  # not a trace the path named itself, but one in a folder
            if skipped is not None:
                skipped.append((str(p), found.problem))
            continue
        if isinstance(found, BaseException):
            raise found
        out.append(advise(*found, linter))
    if not out:
        raise TraceError(path, "folder holds no torch.profiler trace (its .json files are something else)")
    return out


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1000.0


def diagnosis_to_dict(d: Diagnosis) -> dict:
    """The JSON form of one diagnosis (schema in this module's docstring)."""
    dev = d.device
    c = d.copies
    return {
        "source": d.source,
        "platform": d.platform,
        "device": None if dev is None else {
            "name": dev.name, "vendor": dev.vendor, "compute_capability": dev.capability_text or None,
            "total_memory": dev.total_memory, "described": dev.described,
        },
        "steps": {
            "count": len(d.steps), "names": [s.name for s in d.steps], "mean_ms": _ms(d.step_time_us),
            "median_ms": _ms(d.extra.get("median_step_us")), "note": d.step_note or None,
        },
        "bound": d.bound,
        "bound_label": BOUNDS.get(d.bound),
        "bound_evidence": list(d.bound_evidence),
        "bound_shares": d.bound_shares,
        "breakdown_ms": {r: _ms(d.breakdown_us[r]) for r in ROLES},
        "breakdown_share": d.breakdown_share,
        "dataloader_share": d.dataloader_share,
        "dataloader_wait_share": d.dataloader_wait_share,
        "loader_steady_share": d.loader_steady_share,
        "gpu_utilization": d.gpu_utilization,
        "utilization_by_device": {str(k): v for k, v in d.utilization_by_device.items()},
        "tensor_core_share": d.tensor_core_share,
        "eligible_share": d.eligible_share if d.platform != "cpu" else d.extra.get("cpu_eligible_share"),
        "eligible_op_share": d.eligible_op_share,
        "layout_share": d.layout_share,
        "attention": d.extra.get("attention"),
        "kernel_ms": _ms(d.kernel_us),
        "copies": {
            "pageable_ms": _ms(c.pageable_us), "pinned_ms": _ms(c.pinned_us), "unknown_ms": _ms(c.unknown_us),
            "count": c.count, "bytes": c.bytes, "synchronous": c.synchronous, "sync_wait_ms": _ms(c.sync_wait_us),
            "pageable_wait_ms": _ms(c.pageable_wait_us), "host_wait_ms": _ms(c.host_wait_us),
            "exposed_ms": _ms(c.exposed_us), "overlap_with_kernels": c.overlap_with_kernels,
            "share": c.total_us / d.step_time_us if d.step_time_us else 0.0,
        },
        "host": None if d.platform == "cpu" else {
            "launches_per_step": d.extra.get("launches_per_step"), "kernels_per_step": d.extra.get("kernels_per_step"),
            "graph_launches_per_step": d.extra.get("graph_launches_per_step"), "optimizer": d.extra.get("optimizer"),
        },
        "memory": [dict(dataclasses.asdict(m), headroom=m.headroom) for m in d.memory],
        "findings": [dataclasses.asdict(f) for f in d.findings],
        "skipped_events": [{"reason": reason, "count": count} for reason, count in d.skipped_events],
        "missing": list(d.missing),
        "distributed": d.distributed,
        "communication": communication_to_dict(d.communication, d.step_time_us),
        "trial": None if d.trial is None else {
            k: d.trial.get(k) for k in ("name", "status", "knobs", "user_values", "summary", "device_facts")},
        "recommendations": [dataclasses.asdict(r) for r in d.recommendations],
    }


def communication_to_dict(c, step_us: float) -> dict | None:
    """The JSON form of a rank's communication figures (schema in this module's docstring)."""
    if c is None:
        return None
    return {
        "backend": c.backend, "rank": c.rank, "world_size": c.world_size,
        "total_ms": _ms(c.total_us), "exposed_ms": _ms(c.exposed_us), "overlapped_ms": _ms(c.overlapped_us),
        "exposed_share": c.exposed_us / step_us if step_us else None,
        "collectives_per_step": c.count, "bytes_per_step": c.bytes,
        "collectives": [dataclasses.asdict(k) for k in c.collectives],
    }


def job_to_dict(job: Job) -> dict:
    """The JSON form of a data-parallel job (schema in this module's docstring)."""
    s = job.straggler
    return {
        "source": job.source, "backend": job.backend, "world_size": job.world_size,
        "ranks": [{"rank": rank_of(d), "trace": d.source, "step_ms": _ms(d.step_time_us), "own_ms": _ms(own_us(d)),
                   "exposed_communication_ms": _ms(exposed_us(d)), "bound": d.bound,
                   "breakdown_ms": {r: _ms(d.breakdown_us[r]) for r in ROLES}} for d in job.ranks],
        "missing_ranks": list(job.missing_ranks),
        "straggler": None if s is None else {
            "rank": s.rank, "excess_ms": _ms(s.excess_us), "share": s.share, "bound": s.bound,
            "excess_by_role_ms": {r: _ms(v) for r, v in s.excess_by_role_us.items()},
            "others_wait_ms": _ms(s.others_wait_us)},
        "bound": job.bound, "verdict": job.verdict,
        "recommendations": [dataclasses.asdict(r) for r in job.recommendations],
    }


def analysis_document(path: Path | str, diagnoses: list[Diagnosis], skipped: list | tuple = ()) -> dict:
    """The whole `advisor.analysis/1` document for a path (`skipped`: (path, reason) of non-trace files);
    `jobs` only for a folder (a single file is one rank's trace: its job is the folder's)."""
    recs = []
    for d in diagnoses:
        recs.extend(r.id for r in d.recommendations if r.id not in recs)
    slowest = max(diagnoses, key=lambda d: d.step_time_us)
    return {
        "schema": SCHEMA,
        "path": str(path),
        "traces": [diagnosis_to_dict(d) for d in diagnoses],
        "jobs": [job_to_dict(j) for j in jobs_of_path(path, diagnoses)],
        "skipped": [{"path": p, "reason": reason} for p, reason in skipped],
        "summary": {
            "traces": len(diagnoses),
            "mean_step_ms": sum(d.step_time_us for d in diagnoses) / len(diagnoses) / 1000.0,
            "slowest": slowest.source,
            "recommendations": recs,
            "bounds": {d.source: d.bound for d in diagnoses},
        },
    }


def encode_json(document: dict) -> bytes:
    """The document as JSON; file names that are not UTF-8 (lone surrogates) shown as \\xff escapes."""
    try:
        return msgspec.json.encode(document)
    except UnicodeEncodeError:
        return msgspec.json.encode(strings_without_surrogates(document))

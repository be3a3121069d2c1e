"""One side of a comparison: a run, found from a session folder, a trial folder, a trace or a folder of ranks.

A session folder stands for its best trial (session.json's `best`, else its baseline); a trial folder for
its trial.json and traces; a trace file for itself (with the trial.json beside it, if any); a folder of
traces for its ranks. Each run carries its diagnoses, the data-parallel job of its ranks, how fast it ran
(`Timing`) and its settings, flat. Records are untrusted input (`advisor.shapes`); the analysis stays
torch-free.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from advisor.analysis.analyze import analyze_path, read_trial_record
from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.job import Job, jobs_of, rank_of
from advisor.errors import AdvisorError, TraceError
from advisor.files import inside
from advisor.shapes import SESSION, conform_record, read_record

Z95 = 1.96  # about 95% of a normal distribution lies within 1.96 standard errors


@dataclass(frozen=True)
class Timing:
    """How fast a run went: its rate (samples/s, else steps/s), the rate's relative standard error, and what
    it was measured on ("windows": the trial's steady-state windows; "steps": the trial's profiled steps;
    "trace steps": the ProfilerStep spans of the trace)."""

    rate: float | None
    unit: str  # "samples/s" | "steps/s"
    relative_se: float | None
    samples: int  # windows or steps the rate comes from
    source: str
    batch_size: int | None = None

    @property
    def step_s(self) -> float | None:
        """Seconds a step takes at this rate (a batch's samples, or one step)."""
        if not self.rate:
            return None
        return (self.batch_size if self.unit == "samples/s" and self.batch_size else 1) / self.rate

    @property
    def steps_per_s(self) -> float | None:
        """The rate in steps/s, whatever its unit."""
        step = self.step_s
        return 1.0 / step if step else None

    @property
    def interval(self) -> tuple[float, float] | None:
        """About 95% of the time the true rate lies in here."""
        if self.rate is None or self.relative_se is None:
            return None
        half = Z95 * self.relative_se * self.rate
        return max(0.0, self.rate - half), self.rate + half


@dataclass(frozen=True)
class Run:
    """One side of a comparison: what was read, its diagnoses and job, its timing and settings."""

    path: str
    kind: str  # "session" | "trial" | "trace" | "traces"
    label: str
    diagnoses: tuple[Diagnosis, ...]
    timing: Timing
    trial: dict | None = None
    job: Job | None = None
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def diagnosis(self) -> Diagnosis | None:
        """The trace that speaks for the run: its job's straggler (else slowest rank), or its only trace; None
        for a trial that kept no trace (compared on its timing and settings only)."""
        if self.job is not None:
            return self.job.representative
        return self.diagnoses[0] if self.diagnoses else None

    @property
    def slowest_rank(self) -> dict | None:
        """For a data-parallel run: its slowest rank, its step and bound; None for one process."""
        if self.job is None or len(self.job.ranks) < 2:
            return None
        slow = max(self.job.ranks, key=lambda d: d.step_time_us)
        return {"rank": rank_of(slow), "step_ms": slow.step_time_us / 1000.0, "bound": slow.bound,
                "straggler": self.job.straggler is not None and self.job.straggler.rank == rank_of(slow),
                "ranks": len(self.job.ranks), "world_size": self.job.world_size}


def load_run(path: Path | str, steps: str | None = None, parallel: bool = False) -> Run:
    """The run a path names (see the module docstring); AdvisorError naming the path when it is none.
    `parallel`: a folder's traces are parsed in parallel processes (see `analyze_path`)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise AdvisorError(f"{path}: no such file or folder")
    if path.is_dir() and os.path.lexists(path / "session.json"):
        return session_run(path, steps, parallel)
    if path.is_dir() and os.path.lexists(path / "trial.json"):
        return trial_run(path, steps, parallel)
    diagnoses = analyze_path(path, steps, parallel=parallel)
    trial = diagnoses[0].trial if path.is_file() else None
    kind = "trace" if path.is_file() else "traces"
    return _run(path, kind, path.name, diagnoses, trial)


def session_run(folder: Path, steps: str | None = None, parallel: bool = False) -> Run:
    """A session folder as its best trial (else its baseline)."""
    record, _ = conform_record(read_record(folder / "session.json", "advisor.session/", "an advisor session record"),
                               SESSION)
    rows = [r for r in record.get("trials") or [] if isinstance(r, dict)]
    wanted = record.get("best") or record.get("baseline")
    row = next((r for r in rows if r.get("name") == wanted), None)
    if row is None:
        row = next((r for r in rows if r.get("decision") == "baseline"), rows[0] if rows else None)
    trial_dir = inside(folder, row.get("folder")) if row is not None else None
    if trial_dir is None or not trial_dir.is_dir():
        raise AdvisorError(f"{folder}: session.json names no trial folder inside the session to compare "
                           f"(best: {wanted!r})")
    run = trial_run(trial_dir, steps, parallel)
    return Run(path=str(folder), kind="session", label=f"{folder.name} (its best: {row.get('name')})",
               diagnoses=run.diagnoses, timing=run.timing, trial=run.trial, job=run.job, settings=run.settings)


def trial_run(folder: Path, steps: str | None = None, parallel: bool = False) -> Run:
    """A trial folder: its trial.json and the traces in it (none where the trial kept none)."""
    trial, _ = read_trial_record(folder / "trial.json")
    if trial is None:
        raise AdvisorError(f"{folder / 'trial.json'}: not a regular file")
    try:
        diagnoses = analyze_path(folder, steps, parallel=parallel)
    except TraceError as exc:
        if not exc.problem.startswith("folder contains no"):
            raise
        diagnoses = []
    return _run(folder, "trial", folder.name, diagnoses, trial)


def _run(path: Path, kind: str, label: str, diagnoses: list[Diagnosis], trial: dict | None) -> Run:
    found = jobs_of(diagnoses) if len(diagnoses) > 1 else []
    job = found[0] if found else None
    representative = job.representative if job is not None else diagnoses[0] if diagnoses else None
    slowest = max(job.ranks, key=lambda d: d.step_time_us) if job is not None else representative
    return Run(path=str(path), kind=kind, label=label, diagnoses=tuple(diagnoses),
               timing=timing_of(trial, slowest), trial=trial, job=job,
               settings=settings_of(trial, representative, job))


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def timing_of(trial: dict | None, d: Diagnosis | None) -> Timing:
    """A run's rate: its trial's steady-state windows, else its trial's profiled steps, else the trace's steps
    (the slowest rank's, for a data-parallel run: the job goes at its pace)."""
    summary = (trial or {}).get("summary") or {}
    batch = summary.get("batch_size") if _number(summary.get("batch_size")) else None
    steady = summary.get("steady")
    if isinstance(steady, dict) and _number(steady.get("samples_per_s")):
        se = steady.get("relative_se")
        windows = steady.get("windows") if isinstance(steady.get("windows"), list) else []
        unit = steady.get("unit") if steady.get("unit") in ("samples/s", "steps/s") else "samples/s"
        return Timing(steady["samples_per_s"], unit, se if _number(se) else None, len(windows), "windows",
                      batch if unit == "samples/s" else None)
    recorded = [s for s in (trial or {}).get("steps") or []
                if isinstance(s, dict) and s.get("recorded") and _number(s.get("wall_s"))]
    if len(recorded) >= 2:
        known = all(_number(s.get("batch_size")) for s in recorded)
        groups = [((s["batch_size"] if known else 1), s["wall_s"]) for s in recorded]
        rate = sum(n for n, _ in groups) / sum(t for _, t in groups)
        unit = "samples/s" if known else "steps/s"
        return Timing(rate, unit, ratio_relative_se(groups), len(groups), "steps",
                      (batch or recorded[0]["batch_size"]) if known else None)
    durations = [s.duration / 1e6 for s in d.steps if s.duration > 0] if d is not None else []
    groups = [(1.0, t) for t in durations]
    if not groups or d.whole_trace:
        return Timing(None, "steps/s", None, 0, "trace steps")
    rate = len(groups) / sum(durations)
    if batch:
        return Timing(rate * batch, "samples/s", ratio_relative_se(groups), len(groups), "trace steps", batch)
    return Timing(rate, "steps/s", ratio_relative_se(groups), len(groups), "trace steps")


def ratio_relative_se(groups: list[tuple[float, float]]) -> float | None:
    """Relative standard error of Σ samples / Σ seconds over (samples, seconds) groups (the ratio estimator's
    linearised variance, as the trials measure their windows); None with fewer than two groups."""
    n = len(groups)
    samples, seconds = sum(s for s, _ in groups), sum(t for _, t in groups)
    if n < 2 or samples <= 0 or seconds <= 0:
        return None
    rate = samples / seconds
    residual = sum((s - rate * t) ** 2 for s, t in groups)
    return math.sqrt(residual / (n * (n - 1) * (seconds / n) ** 2)) / rate


def _text(value) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def settings_of(trial: dict | None, d: Diagnosis | None, job: Job | None) -> dict[str, str]:
    """A run's settings, flat (name → text): the knobs applied, the script's own values, its own settings
    (autocast, compile ...), torch and CUDA, the host's cores and bf16 instructions, the device, the world size."""
    trial = trial or {}
    out: dict[str, str] = {}
    for key, value in (trial.get("knobs") or {}).items():
        if _text(value) is not None:
            out[f"knob {key}"] = _text(value)
    for key, value in (trial.get("user_values") or {}).items():
        if _text(value) is not None:
            out[f"script {key}"] = _text(value)
    own = trial.get("own_settings")
    if isinstance(own, dict):
        for key, value in own.items():
            if isinstance(value, dict):  # {value, what, site}: what the script does, in words
                value = value.get("what") if isinstance(value.get("what"), str) else value.get("value")
            if _text(value) is not None:
                out[f"script's own {key}"] = _text(value)
    facts = trial.get("device_facts") or {}
    torch = facts.get("torch")
    if isinstance(torch, str):
        out["torch"] = torch
        if "+cu" in torch:
            out["CUDA"] = torch.split("+cu", 1)[1]
    gpu = facts.get("gpu") if isinstance(facts.get("gpu"), dict) else {}
    if isinstance(gpu.get("cuda"), str):
        out["CUDA"] = gpu["cuda"]
    cpu = facts.get("cpu") if isinstance(facts.get("cpu"), dict) else {}
    if isinstance(cpu.get("logical_cores"), int):
        out["CPU cores"] = str(cpu["logical_cores"])
    if isinstance(cpu.get("bf16_instructions"), list):  # one model name covers CPUs with and without them
        out["CPU bf16 instructions"] = ", ".join(map(str, cpu["bf16_instructions"])) or "none"
    device = d.device.name if d is not None and d.device is not None else None
    if not device:
        device = gpu.get("name") or (f"CPU: {cpu['model']}" if isinstance(cpu.get("model"), str) else None)
    platform = d.platform if d is not None else "cpu" if facts.get("type") == "cpu" else "gpu" if gpu else None
    if device or platform:
        out["device"] = device or ("CPU" if platform == "cpu" else str(platform).upper())
    if platform:
        out["platform"] = platform
    summary = trial.get("summary") or {}
    if _number(summary.get("batch_size")):
        out["batch size"] = str(summary["batch_size"])
    if job is not None:
        out["world size"] = str(job.world_size)
    elif isinstance(trial.get("nproc_per_node"), int) and trial["nproc_per_node"] > 1:
        out["world size"] = str(trial["nproc_per_node"])
    return out


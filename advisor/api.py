"""The notebook API: `advisor.analyze`, `advisor.profile`, `advisor.tune`, and the `Session` they lead to.

Same implementation as the CLI, run in the notebook's own process instead of a subprocess:

- `analyze(path)` is `advisor.analysis.analyze.analyze_file`, returning a `Diagnosis` that also converts to a
  pandas DataFrame and displays itself as the HTML report does; on a folder of per-rank traces, a `Job`:
  the ranks side by side (`to_frame()`), each rank's own frame (`frames()`), the straggler and verdict.
- `compare(a, b)` is `advisor.analysis.compare.compare`: two runs (session or trial folders, traces, folders
  of ranks) compared against their noise, returning a `Comparison` that converts to a DataFrame and
  displays itself as `advisor compare --html` does.
- `profile(train_step, loader)` runs one trial in-process: `train_step(batch)` is called once per batch
  of the loader and driven by the harness's `StepDriver` (profiler schedule, timing, memory, step
  records, `ProfilerStep#N` spans), under the step knobs (`StepInterposition`: autocast, GradScaler,
  non_blocking). DataLoader knobs reach the loader by rebuilding it from the given one with changed
  arguments (`plan_loader_arguments` decides which; dataset, sampler, collate_fn and the rest are kept).
  The trial folder holds the same trial.json and trace as a subprocess trial's.
- `tune(train_step, loader)` is `advisor.search.session.run_session` with a runner that calls the in-process
  trial: the same proposals, keep/revert decisions, session.json, report and TensorBoard runs.

In-process means a trial cannot be isolated as a subprocess can: an out-of-memory error is caught,
recorded as status "oom" and its memory released (frames cleared, `gc.collect()`, the CUDA cache
emptied), and the session goes on. There is no time limit or address-space cap per trial, and
`device="cpu"` cannot hide a GPU from the step (the step moves its tensors where it wants).
Torch and pandas are imported when used: `import advisor` stays cheap.
"""

from __future__ import annotations

import dataclasses
import os
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable

from advisor.analysis import compare as _compare
from advisor.analysis import diagnosis as _diagnosis
from advisor.analysis import job as _job
from advisor.analysis.breakdown import ROLES
from advisor.analysis.analyze import analyze_file, analyze_path, diagnosis_to_dict
from advisor.analysis.job import jobs_of
from advisor.errors import AdvisorError
from advisor.files import inside, regular_traces_in
from advisor.code.lint import script_findings
from advisor.shapes import read_record
from advisor.trials.launch.inprocess import run_trial_in_process, step_source
from advisor.trials.launch.training_state import TrainingState
from advisor.knobs import IN_PROCESS_KNOBS
from advisor.trials.knobs import Knobs
from advisor.analysis.reading import trace_files
from advisor.trials.record import TRIAL_FILE, TrialResult, load_trial

SESSION_FILE = "session.json"


# --------------------------------------------------------------------------------------------------
# Diagnosis


class Diagnosis(_diagnosis.Diagnosis):
    """A trace's Diagnosis (same fields) with a pandas form and the report's look in notebooks."""

    @classmethod
    def of(cls, d: _diagnosis.Diagnosis) -> "Diagnosis":
        """The same figures, as this class."""
        return cls(**{f.name: getattr(d, f.name) for f in dataclasses.fields(d)})

    def to_frame(self):
        """The figures as a pandas DataFrame: section, figure, value, unit, share of the step."""
        import pandas as pd

        f = diagnosis_to_dict(self)
        step_ms = f["steps"]["mean_ms"]
        rows = [("steps", "count", f["steps"]["count"], "steps", None),
                ("steps", "mean", step_ms, "ms", 1.0),
                ("steps", "median", f["steps"]["median_ms"], "ms", None)]
        rows += [("breakdown", role, f["breakdown_ms"][role], "ms", f["breakdown_share"][role]) for role in
                 ROLES]
        for name in ("dataloader_share", "dataloader_wait_share", "gpu_utilization", "tensor_core_share",
                     "eligible_share", "eligible_op_share"):
            if isinstance(f[name], (int, float)):
                rows.append(("figures", name, f[name], "share", None))
        if self.platform == "gpu":
            rows.append(("figures", "kernel", f["kernel_ms"], "ms", f["kernel_ms"] / step_ms if step_ms else None))
            c = f["copies"]
            for name in ("pageable_ms", "pinned_ms", "unknown_ms", "sync_wait_ms"):
                rows.append(("copies", name.removesuffix("_ms"), c[name], "ms",
                             c[name] / step_ms if step_ms else None))
            rows += [("copies", "count", c["count"], "per step", None),
                     ("copies", "synchronous", c["synchronous"], "per step", None)]
            if c["bytes"] is not None:
                rows.append(("copies", "bytes", c["bytes"], "bytes per step", None))
        for m in f["memory"]:
            for name in ("peak_allocated", "peak_reserved", "capacity", "growth"):
                if m[name] is not None:
                    rows.append((f"memory {m['device']}", name, m[name], "bytes", None))
            if m["headroom"] is not None:
                rows.append((f"memory {m['device']}", "headroom", m["headroom"], "share", None))
        return pd.DataFrame(rows, columns=["section", "figure", "value", "unit", "share_of_step"])

    def _repr_html_(self) -> str:
        from advisor.report.notebook import render_diagnosis_html

        return render_diagnosis_html(self)


class Job:
    """A data-parallel job's ranks (`advisor.analysis.job.Job`), with pandas forms and the report's look."""

    def __init__(self, job: _job.Job):
        self.job = job
        self.ranks = [Diagnosis.of(d) for d in job.ranks]  # by rank, each with its own to_frame()
        self.straggler = job.straggler
        self.bound = job.bound
        self.verdict = job.verdict
        self.recommendations = job.recommendations

    def __repr__(self) -> str:
        return f"<advisor.Job {len(self.ranks)} of {self.job.world_size} ranks: {self.verdict}>"

    def rank(self, number: int) -> Diagnosis:
        """One rank's Diagnosis."""
        for d in self.ranks:
            if _job.rank_of(d) == number:
                return d
        raise AdvisorError(f"{self.job.source}: no trace of rank {number} (ranks {list(self.job.rank_numbers)})")

    def to_frame(self):
        """The ranks side by side, one row each: step, own time, exposed and overlapped communication,
        collectives, the breakdown by role (ms per step), the bound, and which rank is the straggler."""
        import pandas as pd

        straggler = self.straggler.rank if self.straggler else None
        rows = []
        for d in self.ranks:
            c = d.communication
            rows.append({
                "rank": _job.rank_of(d), "step_ms": d.step_time_us / 1000, "own_ms": _job.own_us(d) / 1000,
                "exposed_communication_ms": _job.exposed_us(d) / 1000,
                "overlapped_communication_ms": c.overlapped_us / 1000 if c else 0.0,
                "collectives_per_step": c.count if c else 0.0, "collective_bytes_per_step": c.bytes if c else None,
                **{f"{role}_ms": d.breakdown_us[role] / 1000 for role in ROLES},
                "bound": d.bound, "straggler": _job.rank_of(d) == straggler, "trace": d.source})
        return pd.DataFrame(rows).set_index("rank")

    def frames(self) -> dict[int, Any]:
        """Each rank's own figures frame (`Diagnosis.to_frame`), by rank."""
        return {_job.rank_of(d): d.to_frame() for d in self.ranks}

    def _repr_html_(self) -> str:
        from advisor.report.notebook import render_job_html

        return render_job_html(self.job)


def analyze(path: str | os.PathLike, steps: str | None = None) -> Diagnosis | Job:
    """Diagnose a recorded trace file, or a folder holding one trace (such as a trial folder); a folder of
    per-rank traces of one data-parallel job gives a `Job` (its ranks side by side)."""
    path = Path(path)
    if path.is_dir():
        files = trace_files(path)
        if len(files) > 1:
            diagnoses = analyze_path(path, steps, linter=script_findings, timelines=True)
            jobs = jobs_of(diagnoses)
            if len(jobs) == 1 and len(jobs[0].ranks) == len(diagnoses):
                return Job(jobs[0])
        if len(files) != 1:
            raise AdvisorError(f"{path}: holds {len(files)} trace files that are not the ranks of one data-parallel "
                               f"job; pass one of them (advisor.analysis.analyze.analyze_path diagnoses them all)")
        path = files[0]
    return Diagnosis.of(analyze_file(path, steps, linter=script_findings))


# --------------------------------------------------------------------------------------------------
# Trial


class Comparison(_compare.Comparison):
    """Two runs compared (same fields as `advisor.analysis.compare.Comparison`), with a JSON form, a pandas
    form and the page's look in notebooks."""

    def to_dict(self) -> dict:
        """The `advisor.compare/1` document, as `advisor compare --json` prints it."""
        return _compare.comparison_to_dict(self)

    def to_frame(self):
        """The figures of both runs side by side: figure, unit, A, B, change."""
        import pandas as pd

        return pd.DataFrame([(f.name, f.unit, f.a, f.b, f.change) for f in self.figures],
                            columns=["figure", "unit", "a", "b", "change"])

    def __repr__(self) -> str:
        return f"<advisor.Comparison {self.a.label} → {self.b.label}: {self.verdict.text}>"

    def _repr_html_(self) -> str:
        from advisor.report.notebook import render_comparison_html

        return render_comparison_html(self)


def compare(a: str | os.PathLike, b: str | os.PathLike, steps: str | None = None) -> Comparison:
    """Compare run B with run A: each a session folder (its best trial), a trial folder, a trace or a folder of
    ranks' traces. The verdict says whether B is faster, slower or the same within the noise."""
    found = _compare.compare(a, b, steps)
    return Comparison(**{f.name: getattr(found, f.name) for f in dataclasses.fields(found)})


class Trial(TrialResult):
    """A finished trial: TrialResult's figures, its Diagnosis, its steps and a notebook display."""

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Trial":
        """Read a trial folder (in-process or subprocess trial alike)."""
        result = load_trial(path)
        return cls(**{f.name: getattr(result, f.name) for f in dataclasses.fields(result)})

    @property
    def record(self) -> dict[str, Any]:
        """The trial.json document (a regular file only: a FIFO is refused, not waited on)."""
        return read_record(self.path / TRIAL_FILE, "advisor.trial/")

    @property
    def steps(self):
        """One row per step (pandas): wall and call time, recorded or not, batch size, loss, memory."""
        import pandas as pd

        return pd.DataFrame(self.record.get("steps") or [])

    @cached_property
    def diagnosis(self) -> Diagnosis | None:
        """The Diagnosis of the trial's trace (None when the trial wrote none, e.g. it failed early)."""
        traces = regular_traces_in(self.path)
        return analyze(traces[0]) if traces else None

    def _repr_html_(self) -> str:
        from advisor.report.notebook import render_trial_html

        return render_trial_html(self.path)


def _new_folder(base: Path) -> Path:
    """`base`, or `base-2`, `base-3`, ... if it exists: two calls in one second get two folders."""
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def _notebook_folder() -> Path:
    return _new_folder(Path("runs") / f"notebook-{datetime.now().strftime('%Y%m%d-%H%M%S')}")


def profile(train_step: Callable, loader: Iterable, *, steps: int = 5, knobs: Knobs | dict | None = None,
            device: str = "auto", out: str | os.PathLike | None = None, wait: int = 2, warmup: int = 1,
            windows: int = 5, window_s: float = 1.0) -> Trial:
    """Profile `train_step(batch)` over the loader's batches in this process, with `knobs` applied, then
    measure its steady-state samples/s in `windows` windows of at least `window_s` seconds (0: none)."""
    if isinstance(knobs, dict):
        knobs = Knobs.from_dict(knobs)
    knobs = knobs or Knobs()
    folder = Path(out) if out is not None else _notebook_folder() / "trials" / knobs.label()
    result, failure = run_trial_in_process(train_step, loader, knobs, folder, steps=steps, wait=wait,
                                           warmup=warmup, device=device, windows=windows, window_s=window_s)
    if failure is not None:  # the step's own error: the notebook shows its traceback (trial.json has it too)
        raise failure
    if result.status == "error":  # e.g. the loader ran out of batches
        raise AdvisorError(f"trial {result.name}: {result.message} (trial folder {result.path})")
    return Trial.load(result.path)  # "ok", or "oom": a measured fact about these settings


# --------------------------------------------------------------------------------------------------
# Session


class Session:
    """An optimization session folder (session.json and its trials), for notebooks."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).resolve()
        # A regular file only (a FIFO is refused, not waited on); NaN as older versions wrote it is read.
        self.state: dict[str, Any] = read_record(self.path / SESSION_FILE, "advisor.session/",
                                                 "an advisor session record")

    def __repr__(self) -> str:
        speedup = self.state.get("speedup")
        gained = f", ×{speedup:.2f} {self.state.get('unit') or 'samples/s'}" if speedup else ""
        return f"Session({str(self.path)!r}: {len(self.state['trials'])} trials, best {self.state['best']}{gained})"

    @property
    def trials(self):
        """One row per trial (pandas), as session.json has them, indexed by trial number."""
        import pandas as pd

        columns = ["index", "name", "change", "decision", "status", "reason", "batch_size", "median_step_s",
                   "samples_per_s", "speedup", "peak_memory_bytes", "loss", "gain", "predicted_gain", "noise",
                   "recommendation", "knobs", "folder"]
        frame = pd.DataFrame(self.state["trials"])
        for column in columns:
            if column not in frame:
                frame[column] = None
        return frame[columns + [c for c in frame.columns if c not in columns]].set_index("index")

    @property
    def ladder(self):
        """The baseline and each kept change, in order (pandas)."""
        frame = self.trials
        return frame[frame["decision"].isin(["baseline", "kept"])][
            ["name", "change", "batch_size", "peak_memory_bytes", "median_step_s", "samples_per_s", "speedup"]]

    @property
    def speedup(self) -> float | None:
        """Samples/s of the best trial over the baseline's."""
        return self.state.get("speedup")

    @property
    def final_knobs(self) -> Knobs:
        """The settings of the best trial."""
        return Knobs.from_dict(self.state.get("final_knobs") or {})

    @property
    def recommendations(self) -> list[dict]:
        """What the last diagnosis still recommends."""
        return list(self.state.get("recommendations") or [])

    def trial(self, name: str) -> Trial:
        """One trial of the session by name, e.g. "00-baseline"."""
        row = next((t for t in self.state["trials"] if t["name"] == name), None)
        if row is None:
            names = ", ".join(t["name"] for t in self.state["trials"])
            raise AdvisorError(f"no trial {name!r} in {self.path} (trials: {names})")
        folder = inside(self.path, row.get("folder"))
        if folder is None:  # session.json names its own trial folders only
            raise AdvisorError(f"trial {name!r}: its folder {row.get('folder')!r} is not inside {self.path}")
        return Trial.load(folder)

    @property
    def baseline(self) -> Trial:
        """The first trial: the step and loader as given."""
        return self.trial(self.state["baseline"])

    @property
    def best(self) -> Trial:
        """The trial with the best measured samples/s among the baseline and the kept changes."""
        return self.trial(self.state["best"])

    def report(self, path: str | os.PathLike | None = None) -> Path:
        """Write the HTML report (default: report.html in the session folder); return its path."""
        from advisor.report import write_report

        return write_report(self.path, Path(path) if path is not None else self.path / "report.html")

    def tensorboard(self, logdir: str | os.PathLike | None = None) -> Path:
        """Write the session's TensorBoard run; return the folder to give `tensorboard --logdir` (with a
        `logdir`, the run and each trial's trace are copied there)."""
        import shutil

        from advisor.report import write_tensorboard

        runs = write_tensorboard(self.path)
        if logdir is None:
            return self.path / "trials"
        logdir = Path(logdir)
        for run in runs:  # the session run's event file; each trial's trace (the profiler plugin's runs)
            target = logdir / run.name
            target.mkdir(parents=True, exist_ok=True)
            for file in [*run.glob("events.out.tfevents.*"), *run.glob("*.pt.trace.json*")]:
                shutil.copy2(file, target / file.name)
        return logdir

    def _repr_html_(self) -> str:
        from advisor.report.notebook import render_session_html

        return render_session_html(self.path)


def tune(train_step: Callable, loader: Iterable, *, steps: int = 5, max_trials: int = 16, device: str = "auto",
         out: str | os.PathLike | None = None, keep_effective_batch: bool = False, wait: int = 2, warmup: int = 1,
         time_budget_s: float | None = None, windows: int = 5, window_s: float = 1.0,
         log: Callable[[str], None] | None = print, only: Iterable[str] | None = None, skip: Iterable[str] = (),
         tries: Iterable[str] = ()) -> Session:
    """Run the optimization session on `train_step(batch)` over the loader, in this process: the same
    search as `advisor profile` (follow the bound, measure each trial's steady state). `only`, `skip` and
    `tries` are `--only`, `--skip` and `--try`: knob names, and settings such as "amp=bf16"."""
    from advisor.search.session import run_session
    from advisor.search.space import check_steering, in_process_tries, knob_names
    from advisor.search.state import SessionOptions
    from advisor.search.strategy import SearchSpace

    only = None if only is None else knob_names([only] if isinstance(only, str) else only, "only")
    skip = knob_names([skip] if isinstance(skip, str) else skip, "skip")
    tries = (tries,) if isinstance(tries, str) else tuple(tries)
    check_steering(only, skip, tries)
    in_process_tries(tries, IN_PROCESS_KNOBS)
    options = SessionOptions(steps=steps, wait=wait, warmup=warmup, device=device, max_trials=max_trials,
                             keep_effective_batch=keep_effective_batch, time_budget_s=time_budget_s,
                             windows=windows, window_s=window_s, only=only, skip=skip, tries=tries)
    folder = Path(out) if out is not None else _notebook_folder()
    where, func = step_source(train_step)
    # Each trial starts from the model and optimizer as they were (else they learn from trial to trial and
    # the loss check blames the change); the session leaves them as it found them.
    start = TrainingState.capture(train_step)
    if log:
        log(f"note: {start.describe()}")

    def runner(name: str, knobs: Knobs) -> TrialResult:
        start.restore()
        result, failure = run_trial_in_process(train_step, loader, knobs, folder.resolve() / "trials" / name,
                                               name=name, steps=steps, wait=wait, warmup=warmup, device=device,
                                               windows=windows, window_s=window_s)
        del failure  # recorded in trial.json; the session goes on (a failed baseline ends it with its message)
        return result

    try:
        run_session(f"{where}:{func}", folder, options, command=f"advisor.tune({func}, ...)", runner=runner,
                    script=False, log=log or (lambda message: None), space=SearchSpace(model_knobs=IN_PROCESS_KNOBS))
    finally:
        start.restore()
    return Session(folder)


__all__ = ["Diagnosis", "Session", "Trial", "analyze", "profile", "tune"]

"""The session record, `session.json`: what the search knows, rewritten atomically after every trial.

The search holds it as its types (`advisor.search.record`: `SessionRecord`, a `TrialRow` each trial), checked
again on every save and resume. `replay` (the surface folder) is present for sessions replayed from a recorded surface.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from advisor.analysis.worth import samples_gain
from advisor.errors import AdvisorError
from advisor.knobs.checkpointing import figures as checkpoint_figures
from advisor.search.record import SCHEMA, SessionRecord, TrialRow, typed
from advisor.report.tensorboard import SESSION_RUN
from advisor.trials.record.storage import write_json_atomic
from advisor.trials.record import TRIAL_MARKER

SESSION_FILE = "session.json"
LOCK_FILE = ".advisor.lock"
STRICT_RECORD = "ADVISOR_STRICT_RECORD"  # set: a record that does not fit its types is an error
SET_ASIDE = ".set-aside"  # where --resume moves what it finds in trials/ and did not make


@dataclass(frozen=True)
class SessionOptions:
    """How a session runs its trials and when it stops. The defaults are sized for a GPU, where a trial
    takes seconds: 16 trials, each 5 profiled steps and 5 one-second steady-state windows."""

    steps: int = 5
    wait: int = 2
    warmup: int = 1
    device: str = "auto"
    script_args: tuple[str, ...] = ()
    timeout_s: float = 600.0
    memory_limit: int | None = None
    max_trials: int = 16
    time_budget_s: float | None = None
    keep_effective_batch: bool = False
    min_gain: float = 0.03
    memory_safety: float = 0.85
    windows: int = 5
    window_s: float = 1.0
    step: str | None = None  # the step, when a module the script imports defines it (pkg.module:name)
    nproc_per_node: int = 1  # > 1: data-parallel trials, ranks started by torchrun
    torchrun_args: tuple[str, ...] = ()  # torchrun's own options (rendezvous for several nodes)
    only: tuple[str, ...] | None = None  # --only: the knobs the search may turn (None: all; advisor.search.space)
    skip: tuple[str, ...] = ()  # --skip: knobs the search never turns
    tries: tuple[str, ...] = ()  # --try: settings run right after the baseline, as written (`amp=bf16,tf32`)
    ray_address: str | None = None  # trials run as one job on this Ray cluster, `nnodes` nodes of nproc_per_node ranks
    nnodes: int = 1

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        d = dataclasses.asdict(self)
        for name in ("script_args", "torchrun_args", "skip", "tries"):
            d[name] = list(getattr(self, name))
        d["only"] = None if self.only is None else list(self.only)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SessionOptions":
        """Back from JSON, ignoring unknown keys."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        for name in ("script_args", "torchrun_args", "skip", "tries"):
            values[name] = tuple(values.get(name) or ())
        values["only"] = None if values.get("only") is None else tuple(values["only"])
        return cls(**values)

    def budget_text(self) -> str:
        """The budget in words, printed when a session starts."""
        time_part = f" or {self.time_budget_s:g} s in all" if self.time_budget_s is not None else ""
        measure = (f"{self.steps} profiled steps and {self.windows} steady-state windows of {self.window_s:g} s"
                   if self.windows else f"{self.steps} profiled steps")
        return (f"budget: at most {self.max_trials} trials{time_part}, each {measure}; the session ends "
                "sooner when no change left is worth a trial")


def new_state(target: str, script: str | None, out: Path, options: SessionOptions, command: str,
              lint: list[dict] | None) -> SessionRecord:
    """A fresh session record."""
    now = time.time()
    state = SessionRecord(
        schema=SCHEMA, target=target, script=script, command=command, cwd=os.getcwd(), lint=lint,
        options=options.to_dict(), status="running", started_at=now, updated_at=now,
        device=None, user_values={}, own_settings={}, memory_cap=None, baseline=None, best=None,
        final_knobs=None, speedup=None, bound=None, unit="samples/s", training_loader=None,
        trials=[], recommendations=[], notes=[], patch=None, pooled={}, running_trial=None)
    state.folder = str(out)
    return state


def document(state: SessionRecord) -> dict[str, Any]:
    """The record as session.json holds it (plain JSON types, unset fields left out)."""
    return msgspec.to_builtins(state, enc_hook=_plain)


def _plain(value: Any) -> Any:
    # A figure computed with numpy is its number; anything else JSON has no type for, its text (as json's default=str)
    return value.item() if hasattr(value, "item") and callable(value.item) else str(value)


def save(state: SessionRecord) -> None:
    """Rewrite session.json atomically."""
    state.updated_at = time.time()
    doc = document(state)
    path = Path(state.folder) / SESSION_FILE
    write_json_atomic(path, doc)  # first: a record that does not fit its types is still kept
    try:
        typed(doc)  # in memory a field may be given a value of another type: named here
    except msgspec.ValidationError as exc:
        problem = f"{path}: the session wrote a record that does not fit advisor.search.record: {exc}"
        if os.environ.get(STRICT_RECORD):  # the test suite: a value of the wrong type fails the test that wrote it
            raise ValueError(problem) from None
        print(f"advisor: warning: {problem}", file=sys.stderr)  # a user's session goes on: nothing is lost


def lock_session(out: Path) -> int:
    """Take the folder's lock for the session's life (an OS lock: it goes with the process, however it
    ends); a one-line error when another session holds it. Returns the descriptor to keep open."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise AdvisorError(f"{out / LOCK_FILE}: cannot open the session's lock: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise AdvisorError(f"{out}: a session is running there (process {holder}); wait for it to end, "
                           "or use another --out") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def discard_unstarted(out: Path, created: bool) -> None:
    """What a session that failed before its record was written leaves: nothing (its lock, and the folder
    with its empty trials/ when the session made it)."""
    (out / LOCK_FILE).unlink(missing_ok=True)
    for folder in (out / "trials", out) if created else ():
        try:
            folder.rmdir()  # only an empty one
        except OSError:
            pass


def resume_state(out: Path) -> SessionRecord:
    """A session record to resume. Trial folders it does not list are the trial in flight when it stopped
    (removed, when a trial made them) or something else (moved aside into trials/.set-aside, never
    deleted); a trials/ that is a symbolic link is refused, untouched."""
    path = out / SESSION_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise AdvisorError(f"{path}: no session to resume here") from None
    except (OSError, ValueError) as exc:
        raise AdvisorError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(state, dict) or state.get("schema") != SCHEMA or not isinstance(state.get("trials"), list):
        raise AdvisorError(f"{path}: not an {SCHEMA} document")
    try:
        state = typed(state)
    except msgspec.ValidationError as exc:
        raise AdvisorError(f"{path}: not an {SCHEMA} document: {exc}") from None
    state.folder = str(out)
    if "pooled" not in state:
        state.pooled = {}
    trials = out / "trials"
    if trials.is_symlink():
        raise AdvisorError(f"{trials}: is a symbolic link, not the session's own folder; nothing was touched")
    listed = {t.name for t in state.trials}
    for entry in sorted(trials.iterdir()) if trials.is_dir() else ():
        if entry.name in listed or entry.name in (SET_ASIDE, SESSION_RUN):  # SESSION_RUN: rewritten at the end
            continue
        marker = entry / TRIAL_MARKER
        if entry.is_dir() and not entry.is_symlink() and marker.is_file() and not marker.is_symlink():
            shutil.rmtree(entry)  # a trial's own folder: the one in flight when the session stopped
        else:
            aside = trials / SET_ASIDE
            aside.mkdir(exist_ok=True)
            entry.rename(_free(aside / entry.name))  # a link is moved, not followed
    return state


def _free(path: Path) -> Path:
    """`path`, or `path.2`, `path.3`, ... if it exists."""
    candidate, n = path, 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def reference_row(state: SessionRecord) -> TrialRow | None:
    """The trial speed-ups are measured against: the baseline, or the first configuration that fitted."""
    return next((t for t in state.trials if t.decision in ("baseline", "kept") and t.samples_per_s), None)


def best_row(state: SessionRecord) -> TrialRow:
    """The row of the best trial so far."""
    return next(t for t in state.trials if t.name == state.best)


def capacity_bytes(trial: dict[str, Any], memory_limit: int | None) -> float | None:
    """The memory a trial's batch must fit in: GPU memory or RAM, or the --memory-limit cap if smaller."""
    facts = trial.get("device_facts") or {}
    if facts.get("type") == "cuda":
        total = (facts.get("gpu") or {}).get("total_memory_bytes")
    else:
        total = (facts.get("cpu") or {}).get("ram_bytes")
    if memory_limit:  # the cap applies to the memory the step uses, on either device
        return min(memory_limit, total) if total else memory_limit
    return total


def capped_peak(record: dict[str, Any]) -> int | None:
    """On the CPU under --memory-limit: the peak of what the cap counts (the data segment beyond what torch
    held when the cap was set), the figure to hold against the limit; else None.

    Where the allocator gave freed blocks back (`memory_cap.freed_blocks_returned`), the data segment read
    between steps holds what lives across steps (weights, gradients, optimizer state, the profiler's
    events) and the step's own tensors come and go inside it: their peak is the profiled steps' `Total
    Allocated`, added. Measured on examples/gpt.py (context 256, profiled), this sum is within 45 MiB above
    the smallest cap each batch ran under, with and without checkpointing."""
    cap = record.get("memory_cap") or {}
    summary = record.get("summary") or {}
    peak = summary.get("peak_data_bytes")
    if cap.get("device") != "cpu" or not peak or cap.get("held_bytes") is None:
        return None
    inside = (summary.get("profiler_peak_allocated_bytes") or 0) if cap.get("freed_blocks_returned") else 0
    return max(0, peak - cap["held_bytes"]) + inside


def trial_row(index: int, result: Any, record: dict[str, Any], proposal: Any, state: SessionRecord,
              measurement: Any, bound: Any = None) -> TrialRow:
    """The session.json row of one trial (decision filled in by the caller)."""
    reference = reference_row(state)
    sps = measurement.samples_per_s if measurement is not None and measurement.samples_per_s else result.samples_per_s
    base_sps = reference.samples_per_s if reference else sps
    return TrialRow(
        index=index,
        name=result.name,
        folder=os.path.relpath(result.path, state.folder),
        change="baseline" if proposal is None else proposal.change,
        recommendation=None if proposal is None else proposal.recommendation,
        knobs=result.knobs.to_dict(),
        status=result.status,
        message=result.message,
        decision=None,
        reason="",
        batch_size=result.batch_size,
        median_step_s=result.median_step_s,
        samples_per_s=sps,
        interval=list(measurement.interval) if measurement is not None and measurement.interval else None,
        measured=measurement.source if measurement is not None else None,
        peak_memory_bytes=result.peak_memory_bytes,
        peak_memory_source=result.peak_memory_source,
        capacity_bytes=capacity_bytes(record, state.options.get("memory_limit")),
        peak_capped_bytes=capped_peak(record),
        checkpoint_blocks=checkpoint_figures(record),  # what checkpointing would wrap, and its bytes
        loss=result.loss,
        speedup=(sps / base_sps) if sps and base_sps else None,
        gain=None,
        # What the change moved (knob → value) on the best it was made on; None for the baseline and re-measures.
        moves=dict(proposal.moves) if proposal is not None and proposal.base is not None else None,
        # None where nothing predicted it ("no prediction"), not +0%: the figure only placed it in the order.
        predicted_gain=None if proposal is None or not proposal.predicted else proposal.predicted_gain,
        predicted_samples_gain=None if proposal is None or not proposal.predicted
        else samples_gain(proposal.predicted_gain),
        noise=None,
        tried_under=state.bound.name if proposal is not None and state.get("bound") else None,
        helps_now=None if proposal is None else proposal.helps_now,
        bound=None if bound is None else bound.name,
        bound_evidence=[] if bound is None else list(bound.evidence),
        outcomes=dict(result.knob_outcomes) or None,  # what each requested knob did: applied / not applicable
        compile=record.get("compile"),  # torch.compile's cost and graphs, when the trial compiled
        # Where it ran out of the script's steps: a ceiling on the batch.
        script_ended=record.get("script_ended", msgspec.UNSET),
    )

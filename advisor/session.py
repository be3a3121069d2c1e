"""The optimization sequence: baseline → diagnose → apply the best fix → measure → keep or revert → …

Each trial is a real, profiled run of the user's unchanged script (advisor.trial). A change is kept only
when median samples/s improves by more than the measured noise (at least `min_gain`, and beyond the
spread of step times) and the loss stays finite and close to the baseline's. `session.json` is rewritten
atomically after every trial, so a session killed at any moment resumes (`--resume DIR`) losing at most
the trial in flight. Torch-free: trials run in subprocesses.

session.json (schema "advisor.session/1"):

    {"schema", "target", "script", "command", "options": {...}, "status": "running"|"done"|"interrupted"|"failed",
     "started_at", "updated_at", "device": {device facts of the baseline}, "user_values": {DataLoader originals},
     "memory_cap": {what --memory-limit capped, as in trial.json} | null,
     "baseline": name, "best": name, "final_knobs": {Knobs}, "speedup": float | null,
     "trials": [{"index", "name", "folder", "change", "recommendation", "knobs", "status", "decision"
                 ("baseline"|"kept"|"reverted"|"failed"), "reason", "batch_size", "median_step_s", "samples_per_s",
                 "peak_memory_bytes", "peak_memory_source", "capacity_bytes", "loss", "speedup", "gain",
                 "predicted_gain", "noise"}],
     "recommendations": [open recommendations after the last trial], "notes": [str], "patch": str | null,
     "lint": [advisor lint findings on the script] | null, "exhausted": [recommendations not to try again],
     "pooled": {trial name: [folders of earlier runs of the same settings, measured together with it]}}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from advisor.errors import AdvisorError
from advisor.harness import write_json_atomic
from advisor.knobs import Knobs
from advisor.trial import TRIAL_FILE, TrialFailed, TrialResult, default_out_dir, load_trial, parse_size, \
    parse_target, run_trial

SCHEMA = "advisor.session/1"
SESSION_FILE = "session.json"
LOSS_TOLERANCE = 0.25  # a kept change may move the loss by at most this share of the baseline's


@dataclass(frozen=True)
class SessionOptions:
    """How a session runs its trials and when it stops."""

    steps: int = 5
    wait: int = 2
    warmup: int = 1
    device: str = "auto"
    script_args: tuple[str, ...] = ()
    timeout_s: float = 600.0
    memory_limit: int | None = None
    max_trials: int = 8
    time_budget_s: float | None = None
    keep_effective_batch: bool = False
    min_gain: float = 0.03
    memory_safety: float = 0.85

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        d = dataclasses.asdict(self)
        d["script_args"] = list(self.script_args)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SessionOptions":
        """Back from JSON, ignoring unknown keys."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["script_args"] = tuple(values.get("script_args") or ())
        return cls(**values)


@dataclass(frozen=True)
class Proposal:
    """A candidate next trial: the change, the knobs it gives, and why."""

    recommendation: str
    change: str
    slug: str
    knobs: Knobs
    predicted_gain: float


# --- measurements of one trial -------------------------------------------------------------------------

def recorded_step_times(trial_dir: Path) -> list[float]:
    """Wall times of the profiled steps of a trial."""
    record = json.loads((trial_dir / TRIAL_FILE).read_text())
    return [s["wall_s"] for s in record.get("steps", []) if s.get("recorded") and s.get("wall_s")]


def recorded_losses(trial_dir: Path | str) -> list[float]:
    """Losses returned by the profiled steps of a trial."""
    record = json.loads((Path(trial_dir) / TRIAL_FILE).read_text())
    return [s["loss"] for s in record.get("steps", []) if s.get("recorded") and s.get("loss") is not None]


def relative_spread(values: list[float]) -> float:
    """Robust relative spread of step times: 1.4826 × median absolute deviation / median (σ/median for
    normal noise, and one outlying step — a page fault, a worker restart — barely moves it)."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return 1.4826 * mad / med if med else 0.0


def median_noise(a: list[float], b: list[float]) -> float:
    """Relative change between two medians that step-to-step spread alone could produce.

    Twice the standard error of the difference of the medians (about 95% confidence), each standard
    error from its robust spread: SE(median) ≈ 1.253 σ / √n.
    """
    def se(values: list[float]) -> float:
        return 1.253 * relative_spread(values) / math.sqrt(len(values)) if len(values) >= 2 else 0.0

    return 2 * math.hypot(se(a), se(b))


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


BLOCK_STEPS = 2


def lag1_autocorrelation(values: list[float]) -> float:
    """Correlation of each value with the next: about 0 for independent steps, negative when they alternate."""
    if len(values) < 3:
        return 0.0
    mean = statistics.fmean(values)
    dev = [v - mean for v in values]
    var = sum(d * d for d in dev)
    return sum(a * b for a, b in zip(dev, dev[1:])) / var if var else 0.0


def measured(paths: list[Path]) -> tuple[float | None, list[float]]:
    """Pooled over the recorded steps of one or more runs of the same settings: samples/s (all samples
    over all time) and seconds per sample of each block of BLOCK_STEPS consecutive steps.

    Where steps alternate, blocks rather than single steps carry the noise estimate (the batch-means
    method): with DataLoader workers a step that waited is followed by one whose batch was ready, so
    single steps swing widely while their sums hardly move.
    """
    samples = seconds = 0.0
    blocks = []
    for path in paths:
        record = json.loads((Path(path) / TRIAL_FILE).read_text())
        steps = [(st["wall_s"], st["batch_size"]) for st in record.get("steps", [])
                 if st.get("recorded") and st.get("wall_s") and st.get("batch_size")]
        samples += sum(b for _, b in steps)
        seconds += sum(w for w, _ in steps)
        # Blocks only where steps alternate (a negative lag-1 autocorrelation: a loader's queue filling
        # and draining); independent steps keep every sample. Never fewer than two values.
        alternating = lag1_autocorrelation([w for w, _ in steps]) < -0.3
        size = BLOCK_STEPS if alternating and len(steps) >= 2 * BLOCK_STEPS else 1
        cut = [steps[i:i + size] for i in range(0, len(steps), size)]
        if len(cut) > 1 and len(cut[-1]) < size:
            last = cut.pop()
            cut[-1] = cut[-1] + last  # a lone last step joins the block before it
        blocks += [sum(w for w, _ in c) / sum(b for _, b in c) for c in cut if c]
    return (samples / seconds if seconds else None), blocks


def decide(best: TrialResult, candidate: TrialResult, baseline_losses: list[float], min_gain: float, *,
           best_extra: list[Path] = (), candidate_extra: list[Path] = ()) -> tuple[bool, str, float, float]:
    """Keep or revert a candidate against the best trial so far: (keep, reason, gain, noise).

    `*_extra`: folders of earlier runs of the same settings, pooled with the trial (a re-measurement).
    """
    if not candidate.ok:
        return False, f"trial {candidate.status}: {candidate.message}", 0.0, 0.0
    best_sps, best_times = measured([best.path, *best_extra])
    cand_sps, cand_times = measured([candidate.path, *candidate_extra])
    best_sps, cand_sps = best_sps or best.samples_per_s, cand_sps or candidate.samples_per_s
    if not cand_sps or not best_sps:
        return False, "no samples/s measured (batch size unknown)", 0.0, 0.0
    gain = cand_sps / best_sps - 1
    noise = median_noise(best_times, cand_times)
    threshold = max(min_gain, noise)
    losses = [x for path in [candidate.path, *candidate_extra] for x in recorded_losses(path)]
    if losses and not all(math.isfinite(x) for x in losses):
        return False, "loss is not finite", gain, noise
    if losses and baseline_losses:
        base, cand = statistics.median(baseline_losses), statistics.median(losses)
        allowed = max(LOSS_TOLERANCE * abs(base), max(baseline_losses) - min(baseline_losses))
        if abs(cand - base) > allowed:
            return False, f"loss moved from {base:.4g} to {cand:.4g} (more than {allowed:.3g})", gain, noise
    if gain < -threshold:
        return False, f"{100 * gain:+.1f}% samples/s: slower (noise {100 * threshold:.1f}%)", gain, noise
    if gain <= threshold:
        return False, f"{100 * gain:+.1f}% samples/s is within the noise ({100 * threshold:.1f}%)", gain, noise
    return True, f"{100 * gain:+.1f}% samples/s (noise {100 * noise:.1f}%)", gain, noise


# --- what to try next -------------------------------------------------------------------------------

def effective(knobs: Knobs, user_values: dict[str, Any], name: str) -> Any:
    """The value a knob has in a trial: the override, else what the user wrote."""
    value = getattr(knobs, name)
    return user_values.get(name) if value is None else value


def fit_memory(points: list[tuple[int, float]]) -> Callable[[int], float]:
    """Peak memory against batch size, from the trials run so far.

    With two or more batch sizes, a least-squares line; with one, memory proportional to the batch,
    which over-estimates (the fixed part scales too) and so errs on the safe side.
    """
    sizes = sorted({b for b, _ in points})
    if len(sizes) >= 2:
        n = len(points)
        mx = sum(b for b, _ in points) / n
        my = sum(m for _, m in points) / n
        sxx = sum((b - mx) ** 2 for b, _ in points)
        slope = sum((b - mx) * (m - my) for b, m in points) / sxx
        slope = max(slope, 0.0)
        return lambda b: my + slope * (b - mx)
    b0, m0 = points[0]
    return lambda b: m0 * b / b0


def next_batch_size(current: int, points: list[tuple[int, float]], capacity: float | None, safety: float,
                    failed: int | None) -> int | None:
    """The next batch size to try: double, capped by the memory model; bisect below a size that failed."""
    if failed is not None:
        size = (current + failed) // 2
        return size if size > current * 1.1 else None
    size = current * 2
    if capacity and points:
        predict = fit_memory(points)
        limit = safety * capacity
        while size > current and predict(size) > limit:
            size = current + (size - current) // 2
        if size <= current * 1.1:
            return None
    return size


def propose(diagnosis, best: TrialResult, state: dict[str, Any], options: SessionOptions) -> list[Proposal]:
    """Candidate trials from the best trial's diagnosis, best predicted gain first, none already tried."""
    user = state["user_values"]
    knobs = best.knobs
    accelerator = (state.get("device") or {}).get("type") == "cuda"
    cpus = ((state.get("device") or {}).get("cpu") or {}).get("logical_cores") or os.cpu_count() or 1
    exhausted = set(state.setdefault("exhausted", []))
    out = []
    recs = {r.id: r for r in diagnosis.recommendations} if diagnosis is not None else {}
    if "more-workers" in recs and "more-workers" not in exhausted:
        current = effective(knobs, user, "num_workers") or 0
        target = 2 if current < 2 else current * 2
        if target <= cpus:
            out.append(Proposal("more-workers", f"workers {current}→{target}", f"workers-{target}",
                                dataclasses.replace(knobs, num_workers=target, persistent_workers=True),
                                recs["more-workers"].predicted_gain))
    if "amp" in recs and knobs.amp is None and "amp" not in exhausted:
        dtype = recs["amp"].knobs.get("amp", "bf16")
        out.append(Proposal("amp", f"AMP {dtype}", f"amp-{dtype}", dataclasses.replace(knobs, amp=dtype),
                            recs["amp"].predicted_gain))
    if accelerator and "pin-memory" in recs and not knobs.pin_memory and "pin-memory" not in exhausted:
        out.append(Proposal("pin-memory", "pin_memory", "pin-memory",
                            dataclasses.replace(knobs, pin_memory=True), recs["pin-memory"].predicted_gain))
    if accelerator and "non-blocking" in recs and not knobs.non_blocking and "non-blocking" not in exhausted:
        out.append(Proposal("non-blocking", "non_blocking", "non-blocking",
                            dataclasses.replace(knobs, non_blocking=True), recs["non-blocking"].predicted_gain))
    batch = batch_proposal(recs.get("larger-batch"), best, state, options, accelerator)
    if batch is not None:
        out.append(batch)
    tried = {json.dumps(t["knobs"], sort_keys=True) for t in state["trials"]}
    out = [p for p in out if json.dumps(p.knobs.to_dict(), sort_keys=True) not in tried]
    return sorted(out, key=lambda p: -p.predicted_gain)


def batch_proposal(rec, best: TrialResult, state: dict[str, Any], options: SessionOptions,
                   accelerator: bool) -> Proposal | None:
    """A larger batch: on an accelerator when the trace supports it; on the CPU while samples/s grows."""
    if options.keep_effective_batch or "larger-batch" in state.get("exhausted", []):
        return None
    if state["trials"][0]["status"] == "oom" or best.knobs.accumulation_steps:
        return None  # memory-bound already: the batch was made to fit, not to grow
    if accelerator and rec is None:
        return None
    current = best.batch_size
    if not current:
        return None
    points = [(t["batch_size"], t["peak_memory_bytes"]) for t in state["trials"]
              if t["status"] == "ok" and t.get("batch_size") and t.get("peak_memory_bytes")]
    # The batch size a trial asked for: one that ran out of memory in its first step measured none.
    failed = [t["knobs"]["batch_size"] for t in state["trials"]
              if t["status"] == "oom" and (t.get("knobs") or {}).get("batch_size")]
    failed_above = min((b for b in failed if b > current), default=None)
    size = next_batch_size(current, points, state["trials"][0].get("capacity_bytes"), options.memory_safety,
                           failed_above)
    if size is None:
        return None
    # On the CPU a larger batch is a measured experiment, ranked after what the trace points to.
    gain = rec.predicted_gain if rec is not None else 0.02
    return Proposal("larger-batch", f"batch {current}→{size}", f"batch-{size}",
                    dataclasses.replace(best.knobs, batch_size=size), gain)


# --- the session --------------------------------------------------------------------------------------

def trial_row(index: int, result: TrialResult, proposal: Proposal | None, state: dict[str, Any]) -> dict:
    """The session.json row of one trial (decision filled in by the caller)."""
    record = json.loads((result.path / TRIAL_FILE).read_text())
    reference = reference_row(state)
    base_sps = reference["samples_per_s"] if reference else result.samples_per_s
    return {
        "index": index,
        "name": result.name,
        "folder": os.path.relpath(result.path, state["_dir"]),
        "change": "baseline" if proposal is None else proposal.change,
        "recommendation": None if proposal is None else proposal.recommendation,
        "knobs": result.knobs.to_dict(),
        "status": result.status,
        "message": result.message,
        "decision": None,
        "reason": "",
        "batch_size": result.batch_size,
        "median_step_s": result.median_step_s,
        "samples_per_s": result.samples_per_s,
        "peak_memory_bytes": result.peak_memory_bytes,
        "peak_memory_source": result.peak_memory_source,
        "capacity_bytes": capacity_bytes(record, state["options"].get("memory_limit")),
        "loss": result.loss,
        "speedup": (result.samples_per_s / base_sps) if result.samples_per_s and base_sps else None,
        "gain": None,
        "predicted_gain": None if proposal is None else proposal.predicted_gain,
        "noise": None,
    }


def save(state: dict[str, Any]) -> None:
    """Rewrite session.json atomically."""
    state["updated_at"] = time.time()
    doc = {k: v for k, v in state.items() if not k.startswith("_")}
    write_json_atomic(Path(state["_dir"]) / SESSION_FILE, doc)


def _diagnose(result: TrialResult):
    """The diagnosis (with recommendations) of a trial's trace; None when it has no trace."""
    from advisor.commands import analyze_file

    traces = sorted(result.path.glob("*.pt.trace.json*"))
    return analyze_file(traces[0]) if traces else None


def lint_script(script: Path) -> list[dict] | None:
    """`advisor lint` findings on the script, for the report; None when it cannot be checked."""
    from advisor.lint import LintError, lint_file

    try:
        return [f.to_dict() for f in lint_file(script)]
    except LintError:
        return None


def new_state(target: str, out: Path, options: SessionOptions, command: str, *, script: bool = True,
              ) -> dict[str, Any]:
    """A fresh session record; `script=False` when the target names no script file (the notebook API)."""
    path = str(parse_target(target)[0]) if script else None
    return {
        "schema": SCHEMA, "target": target, "script": path, "command": command,
        "lint": lint_script(Path(path)) if path else None,
        "options": options.to_dict(), "status": "running", "started_at": time.time(), "updated_at": time.time(),
        "device": None, "user_values": {}, "baseline": None, "best": None, "final_knobs": None, "speedup": None,
        "trials": [], "recommendations": [], "notes": [], "patch": None, "exhausted": [], "pooled": {},
        "memory_cap": None,
        "_dir": str(out),
    }


def load_state(out: Path) -> dict[str, Any]:
    """A session record to resume; trial folders it does not list (the trial in flight) are removed."""
    path = out / SESSION_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise AdvisorError(f"{path}: no session to resume here") from None
    except ValueError as exc:
        raise AdvisorError(f"{path}: not valid JSON ({exc})") from None
    if state.get("schema") != SCHEMA:
        raise AdvisorError(f"{path}: not an {SCHEMA} document")
    state["_dir"] = str(out)
    state.setdefault("pooled", {})
    listed = {t["name"] for t in state["trials"]}
    for folder in sorted((out / "trials").glob("*")):
        if folder.is_dir() and folder.name not in listed:
            shutil.rmtree(folder)  # the trial that was running when the session stopped
    return state


def run_session(target: str, out: Path, options: SessionOptions, *, command: str = "", resume: bool = False,
                log: Callable[[str], None] = print, runner: TrialRunner | None = None,
                script: bool = True) -> dict[str, Any]:
    """Run (or resume) the sequence until nothing is left to gain or the budget is spent; return the record.

    Trials run in subprocesses unless `runner` runs them some other way (the notebook API runs them in
    its own process); everything else — decisions, persistence, outputs — is the same. `script=False`:
    the target only names a step function (e.g. "<notebook>:train_step"), so there is no script to
    check or patch.
    """
    out = Path(out).resolve()
    if resume:
        state = load_state(out)
        target, options = state["target"], SessionOptions.from_dict(state["options"])
        state["status"] = "running"
    else:
        if (out / SESSION_FILE).exists():
            raise AdvisorError(f"{out}: already holds a session; use --resume {out} or another --out")
        state = new_state(target, out, options, command, script=script)
    (out / "trials").mkdir(parents=True, exist_ok=True)
    save(state)
    started = time.monotonic()
    try:
        _sequence(runner or subprocess_runner(target, out, options), out, options, state, started, log)
    except KeyboardInterrupt:
        state["status"] = "interrupted"
        save(state)
        log(f"interrupted: resume with  advisor profile --resume {out}")
        raise
    return state


TrialRunner = Callable[[str, Knobs], TrialResult]  # (trial name, knobs) -> the finished trial


def prefetched_batches(knobs: Knobs) -> int:
    """Batches that new DataLoader workers queue up before the first step: while the step eats them the
    loader looks free, so that many more steps are left out of the measurement."""
    return (knobs.num_workers or 0) * (knobs.prefetch_factor or 2)


def subprocess_runner(target: str, out: Path, options: SessionOptions) -> TrialRunner:
    """Trials of `script.py:func` in fresh subprocesses (the CLI's way), in `out/trials/<name>`."""
    def run(name: str, knobs: Knobs) -> TrialResult:
        return run_trial(target, knobs, out / "trials" / name, name=name, steps=options.steps,
                         wait=options.wait + prefetched_batches(knobs),
                         warmup=options.warmup, device=options.device, script_args=options.script_args,
                         timeout_s=options.timeout_s, memory_limit=options.memory_limit)

    return run


def reference_row(state: dict[str, Any]) -> dict | None:
    """The trial speed-ups are measured against: the baseline, or the first configuration that fitted."""
    return next((t for t in state["trials"] if t["decision"] in ("baseline", "kept") and t["samples_per_s"]), None)


def _baseline(run: TrialRunner, state: dict[str, Any], log: Callable[[str], None]) -> TrialResult:
    log("trial 00: baseline")
    baseline = run("00-baseline", Knobs())
    record = json.loads((baseline.path / TRIAL_FILE).read_text())
    state["device"] = record.get("device_facts")
    state["memory_cap"] = record.get("memory_cap")
    state["user_values"] = record.get("user_values") or {}
    row = trial_row(0, baseline, None, state)
    row["decision"] = "baseline" if baseline.ok else "failed"
    row["reason"] = "the user's own settings" if baseline.ok else f"{baseline.status}: {baseline.message}"
    row["speedup"] = 1.0 if baseline.ok else None
    state["trials"].append(row)
    state["baseline"] = state["best"] = baseline.name
    state["final_knobs"] = Knobs().to_dict()
    if baseline.status == "oom":
        state["notes"].append(out_of_memory_note(record))
    save(state)
    return baseline


def out_of_memory_note(record: dict[str, Any]) -> str:
    """Where memory went in a trial that ran out of it, as far as the trial could tell."""
    summary = record.get("summary") or {}
    parts = []
    breakdown = summary.get("memory_breakdown") or {}
    for key in ("parameters", "gradients", "optimizer_state", "activations"):
        value = breakdown.get(key) if isinstance(breakdown, dict) else None
        if isinstance(value, (int, float)) and value:
            parts.append(f"{key.replace('_', ' ')} {value / 2**20:.0f} MiB")
    peak = summary.get("peak_memory_bytes")
    where = f" (peak {peak / 2**20:.0f} MiB: {', '.join(parts)})" if peak and parts else (
        f" (peak {peak / 2**20:.0f} MiB)" if peak else "")
    return (f"The user's settings ran out of memory{where}; the session looked for the closest configuration "
            "that fits: AMP, then micro-batches with gradient accumulation (same effective batch), then a "
            "smaller batch.")


def recovery_plan(state: dict[str, Any]) -> list[Proposal]:
    """Configurations to try after the baseline ran out of memory, closest to the user's first."""
    facts = state.get("device") or {}
    batch = (state.get("user_values") or {}).get("batch_size")
    if facts.get("type") == "cuda":
        dtype = "bf16" if (facts.get("gpu") or {}).get("bf16_supported") else "fp16"
    else:  # CPU autocast is bf16 only, and only worth it where the CPU computes bf16
        dtype = "bf16" if ((facts.get("cpu") or {}).get("bf16_instructions")) else None
    plan = []
    if dtype:
        plan.append(Proposal("oom-amp", f"AMP {dtype}", f"amp-{dtype}", Knobs(amp=dtype), 0.0))
    for k in (2, 4, 8):
        if batch and batch % k == 0:
            plan.append(Proposal("oom-accumulation", f"micro-batches {batch // k}×{k}", f"accumulate-{k}",
                                 Knobs(accumulation_steps=k), 0.0))
    for f in (2, 4, 8):
        if batch and batch // f >= 1:
            plan.append(Proposal("oom-smaller-batch", f"batch {batch}→{batch // f} (smaller effective batch)",
                                 f"batch-{batch // f}", Knobs(batch_size=batch // f), 0.0))
    return plan


def _recover_from_oom(run: TrialRunner, state: dict[str, Any], log: Callable[[str], None]) -> None:
    """Try the recovery plan in order until a configuration fits (resumable: tried ones are skipped)."""
    tried = {json.dumps(t["knobs"], sort_keys=True) for t in state["trials"]}
    for proposal in recovery_plan(state):
        if json.dumps(proposal.knobs.to_dict(), sort_keys=True) in tried:
            continue
        index = len(state["trials"])
        log(f"trial {index:02d}: {proposal.change} (the baseline ran out of memory)")
        result = run(f"{index:02d}-{proposal.slug}", proposal.knobs)
        row = trial_row(index, result, proposal, state)
        if result.ok:
            row.update(decision="kept", reason="fits in memory", speedup=1.0)
            state["best"] = result.name
            state["final_knobs"] = result.knobs.to_dict()
            if proposal.recommendation == "oom-smaller-batch":
                state["notes"].append(
                    f"Only a smaller batch fits: {proposal.change}. This changes training: scale the learning "
                    "rate down with the batch, or find memory elsewhere (activation checkpointing, a smaller "
                    "model).")
        else:
            row.update(decision="failed", reason=f"{result.status}: {result.message}")
        state["trials"].append(row)
        log(f"  {row['decision']}: {row['reason']}")
        save(state)
        if result.ok:
            return


def _sequence(run: TrialRunner, out: Path, options: SessionOptions, state: dict[str, Any], started: float,
              log: Callable[[str], None]) -> None:
    if not state["trials"]:
        _baseline(run, state, log)
    if reference_row(state) is None and state["trials"][0]["status"] == "oom":
        _recover_from_oom(run, state, log)
    reference = reference_row(state)
    if reference is None:
        state["status"] = "failed"
        save(state)
        first = load_trial(out / state["trials"][0]["folder"])
        if first.traceback and first.status != "oom":
            log(first.traceback.rstrip())
        what = "no configuration fits in memory" if first.status == "oom" else f"baseline trial {first.status}"
        raise TrialFailed(f"{what}: {first.message} (trial folder {first.path})")
    reference_losses = recorded_losses(out / reference["folder"])
    best = load_trial(out / next(t for t in state["trials"] if t["name"] == state["best"])["folder"])
    while True:
        diagnosis = _diagnose(best)
        state["recommendations"] = [dataclasses.asdict(r) for r in diagnosis.recommendations] if diagnosis else []
        proposals = propose(diagnosis, best, state, options)
        if not proposals:
            break
        if len(state["trials"]) >= options.max_trials:
            if options.max_trials > 1:  # one trial is a diagnosis-only run, not a budget that ran out
                state["notes"].append(f"stopped after {options.max_trials} trials (--max-trials) with "
                                      f"{len(proposals)} change(s) left to try")
            break
        if options.time_budget_s is not None and time.monotonic() - started > options.time_budget_s:
            state["notes"].append(f"stopped: time budget of {options.time_budget_s:.0f} s spent (--time-budget)")
            break
        proposal = proposals[0]
        index = len(state["trials"])
        log(f"trial {index:02d}: {proposal.change} (predicted {100 * proposal.predicted_gain:.0f}% of step time)")
        result = run(f"{index:02d}-{proposal.slug}", proposal.knobs)
        best_extra = [out / f for f in state["pooled"].get(best.name, [])]
        keep, reason, gain, noise = decide(best, result, reference_losses, options.min_gain, best_extra=best_extra)
        row = trial_row(index, result, proposal, state)
        inconclusive = (not keep and result.ok and options.min_gain < gain <= noise
                        and len(state["trials"]) + 2 <= options.max_trials)
        row.update(decision="kept" if keep else ("failed" if not result.ok else "reverted"), gain=gain, noise=noise,
                   reason=f"inconclusive, measured again: {reason}" if inconclusive else reason)
        state["trials"].append(row)
        log(f"  {row['decision']}: {row['reason']}")
        if inconclusive:
            # A gain the step-to-step spread could hide: run the same settings once more and decide on
            # both runs' steps together (twice the samples, about 1/√2 of the noise).
            save(state)
            first = result
            index = len(state["trials"])
            log(f"trial {index:02d}: {proposal.change}, again")
            result = run(f"{index:02d}-{proposal.slug}-again", proposal.knobs)
            keep, reason, gain, noise = decide(best, result, reference_losses, options.min_gain,
                                               best_extra=best_extra, candidate_extra=[first.path])
            row = trial_row(index, result, proposal, state)
            row.update(change=f"{proposal.change} (again)", gain=gain, noise=noise, reason=reason + " (both runs)",
                       decision="kept" if keep else ("failed" if not result.ok else "reverted"))
            state["trials"].append(row)
            log(f"  {row['decision']}: {row['reason']}")
            if keep:
                state["pooled"][result.name] = [os.path.relpath(first.path, out)]
        if keep:
            best = result
            state["best"] = result.name
            state["final_knobs"] = result.knobs.to_dict()
        elif not (proposal.recommendation == "larger-batch" and result.status == "oom"):
            # A change that did not help is not tried again; growing workers or the batch stops here.
            state["exhausted"].append(proposal.recommendation)
        save(state)
    best_row = next(t for t in state["trials"] if t["name"] == state["best"])
    base_sps = reference["samples_per_s"]
    state["speedup"] = best_row["samples_per_s"] / base_sps if base_sps and best_row["samples_per_s"] else None
    state["notes"].extend(batch_notes(state, options))
    state["status"] = "done"
    save(state)
    finish_outputs(out, state)


def batch_notes(state: dict[str, Any], options: SessionOptions) -> list[str]:
    """What a changed batch size means for training, in words."""
    user = state["user_values"].get("batch_size")
    final = (state["final_knobs"] or {}).get("batch_size")
    if not user or not final or final == user:
        if options.keep_effective_batch:
            return ["--keep-effective-batch: the batch size was left as written"]
        return []
    factor = final / user
    return [f"The batch grew from {user} to {final} (×{factor:g}): scale the learning rate by about ×{factor:g} "
            "(linear scaling rule, with a few hundred warm-up steps) and check convergence; or run with "
            "--keep-effective-batch to leave the batch as it is."]


def repository_root(script: Path) -> Path:
    """The git work tree holding the script (so `git apply` works from its top), else the script's folder."""
    for folder in script.resolve().parents:
        if (folder / ".git").exists():
            return folder
    return script.resolve().parent


def finish_outputs(out: Path, state: dict[str, Any]) -> None:
    """suggested.patch (when a script was tuned and something changed), report.html, TensorBoard runs."""
    final = Knobs.from_dict(state["final_knobs"] or {})
    from advisor.patch import write_patch

    if final.requested() and not state.get("script"):
        state["notes"].append("no suggested.patch: the step did not come from a script file; "
                              "make the final settings below in your code")
    elif final.requested():
        _, func = parse_target(state["target"])
        script = Path(state["script"])
        try:
            written = write_patch(script, func, final, state["user_values"], out, root=repository_root(script),
                                  accumulation_steps=final.accumulation_steps)
        except AdvisorError as exc:  # the settings stand; only the code change could not be written
            state["notes"].append(f"no suggested.patch: {exc}")
            written = None
        state["patch"] = None if written is None else os.path.relpath(written, out)
    save(state)  # the report reads session.json: it must already name the patch
    from advisor.report import write_report, write_tensorboard

    write_report(out, out / "report.html")
    write_tensorboard(out)


# --- the command ---------------------------------------------------------------------------------------

def add_session_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `advisor profile` that steer the sequence (the trial's own options come from trial.py)."""
    parser.add_argument("--max-trials", type=int, default=8, help="trials in all, baseline included (default 8)")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds after which no new trial starts")
    parser.add_argument("--keep-effective-batch", action="store_true",
                        help="never change the batch size (the effective batch stays as written)")
    parser.add_argument("--resume", metavar="DIR", help="continue the session in DIR that was interrupted")


def ladder_table(state: dict[str, Any]):
    """The ladder as a rich table: one row per trial."""
    from rich.table import Table

    t = Table(title="Ladder (one row per trial)", title_justify="left")
    t.add_column("#", justify="right")
    t.add_column("change")
    for col in ("batch", "peak MiB", "step ms", "samples/s", "speed-up"):
        t.add_column(col, justify="right")
    t.add_column("decision")
    for row in state["trials"]:
        mem = f"{row['peak_memory_bytes'] / 2**20:.0f}" if row.get("peak_memory_bytes") else "-"
        step = f"{row['median_step_s'] * 1e3:.1f}" if row.get("median_step_s") else "-"
        sps = f"{row['samples_per_s']:.1f}" if row.get("samples_per_s") else "-"
        speed = f"×{row['speedup']:.2f}" if row.get("speedup") else "-"
        t.add_row(f"{row['index']:02d}", row["change"], str(row.get("batch_size") or "-"), mem, step, sps, speed,
                  row["decision"] or "-")
    return t


def print_session(state: dict[str, Any], out: Path) -> None:
    """Ladder, final settings, outputs."""
    from rich.console import Console
    from rich.text import Text

    console = Console()
    console.print(ladder_table(state))
    final = {k: v for k, v in (state["final_knobs"] or {}).items() if v is not None}
    reference = reference_row(state)
    against = "the baseline" if reference is None or reference["name"] == state["baseline"] else (
        f"{reference['name']}, the first configuration that fitted")
    speed = f"×{state['speedup']:.2f} samples/s over {against}" if state.get("speedup") else "no speed-up"
    console.print(Text(f"Best: {state['best']} ({speed}); settings: "
                       + (", ".join(f"{k}={v}" for k, v in final.items()) or "as written")))
    for note in state["notes"]:
        console.print(Text(f"note: {note}", style="dim"))
    for name in ("suggested.patch", "report.html"):
        if (out / name).exists():
            console.print(Text(f"{name}: {out / name}"))


def profile_command(args: argparse.Namespace) -> int:
    """`advisor profile`: the session (default), or only the baseline and its diagnosis (--no-apply)."""
    memory_limit = parse_size(args.memory_limit) if args.memory_limit else None
    options = SessionOptions(steps=args.steps, wait=args.wait, warmup=args.warmup, device=args.device,
                             script_args=tuple(args.script_args), timeout_s=args.timeout,
                             memory_limit=memory_limit, max_trials=1 if args.no_apply else args.max_trials,
                             time_budget_s=args.time_budget, keep_effective_batch=args.keep_effective_batch)
    if args.resume:
        out = Path(args.resume)
        target = ""
    else:
        if not args.target:
            raise AdvisorError("profile: give script.py:train_step (or --resume DIR)")
        script, _ = parse_target(args.target)
        out = Path(args.out) if args.out else default_out_dir(script)
        target = args.target
    words = sys.argv[sys.argv.index("profile") + 1:] if "profile" in sys.argv else []
    command = "advisor profile " + " ".join(shlex.quote(a) for a in words) if not args.resume else ""
    # Ctrl-C: run_session marks the session interrupted and says how to resume; the CLI prints the rest.
    state = run_session(target, out, options, command=command, resume=bool(args.resume),
                        log=lambda m: print(m, flush=True))
    out = Path(state["_dir"])
    baseline = load_trial(out / state["trials"][0]["folder"])
    if args.no_apply:
        from advisor.terminal import print_analysis

        diagnosis = _diagnose(baseline)
        if diagnosis is not None:
            print_analysis([diagnosis])
    print_session(state, out)
    return 0

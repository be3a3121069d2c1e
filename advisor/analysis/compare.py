"""Two runs compared: the verdict against the noise, where the step's time moved, what moved most, the
settings that differ: the `advisor.compare/1` document.

The verdict is B's rate over A's (samples/s where both know their batch, else steps/s) with its interval:
the log of the ratio ± 1.96 standard errors, each run's relative standard error taken from its own windows
(`advisor.analysis.runs.Timing`). B is "faster" when the whole interval lies above 1, "slower" when it lies
below, else "the same within the noise"; "unknown" where neither run measured more than one step or window
(no noise estimate) or a run has no rate. The interval knows the noise within each run only: a shared
machine's load between the two runs adds its own (docs/compare.md).

    {"schema": "advisor.compare/1",
     "a": RUN, "b": RUN,
     "verdict": {"word": "faster"|"slower"|"same"|"unknown", "text", "unit", "ratio", "change", "interval": [lo, hi] | null,
                 "noise", "a_rate", "b_rate", "a_step_ms", "b_step_ms"},
     "breakdown": [{"role", "label", "a_ms", "b_ms", "change_ms"}],   # per profiled step, each moment once
     "moved_most": {"role", "label", "a_ms", "b_ms", "change_ms", "text"} | null,
     "figures": [{"name", "unit", "a", "b", "change"}],                # shares 0..1, ms, bytes, text
     "kernels": {"families": [MOVE], "names": [MOVE]}, "operators": {"families": [MOVE], "names": [MOVE]},
     "tensor_cores": {"a_share", "b_share", "moved_onto": [MOVE], "moved_off": [MOVE], "text"},
     "settings": [{"name", "a", "b"}],                                 # only those that differ
     "ranks": {"a": RANK | null, "b": RANK | null} | null,             # data-parallel runs: the slowest rank
     "notes": [str],
     "machines": str | null}                                           # where they ran on different machines

    RUN = {"path", "kind": "session"|"trial"|"trace"|"traces", "label", "unit", "rate", "relative_se",
           "interval", "source": "windows"|"steps"|"trace steps", "samples", "batch_size", "step_ms",
           "trace_step_ms", "traces": [str]}
    MOVE = {"name", "family", "a_ms", "b_ms", "change_ms", "status": "added"|"removed"|"changed"}
    RANK = {"rank", "step_ms", "bound", "straggler", "ranks", "world_size"}

New fields may be added within version 1; renaming or removing one bumps the version.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from advisor.analysis.breakdown import ROLES
from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.movers import (FP32_FAMILY, TENSOR_CORE_FAMILY, Move, family_moves, kernel_family, kernel_times, moves, operator_family,
                                     operator_times, tensor_core_moves)
from advisor.analysis.runs import Z95, Run, load_run
from advisor.analysis.trace import load_trace

SCHEMA = "advisor.compare/1"
TOP_NAMES = 12  # kernels and operators listed by name, largest change first

ROLE_LABELS = {"kernel": "kernels (compute)", "memcpy": "copies", "memset": "memsets",
               "communication": "communication", "runtime": "runtime calls (launches)",
               "dataloader": "loader wait (DataLoader)", "cpu_op": "CPU operators", "other": "other host time"}
SAME = "same"
# The settings (`runs.settings_of`) that say which machine and build a run had: where they differ, so may the speed.
MACHINE = ("device", "CPU cores", "CPU bf16 instructions", "torch", "CUDA")
UNKNOWN = "unknown"  # no noise estimate (each run one step or window) or no rate: faster or slower cannot be said
SOURCE_WORDS = {"windows": "steady-state windows", "steps": "profiled steps of its trial",
                "trace steps": "ProfilerStep spans of its trace"}
WORDS = {"faster": "faster", "slower": "slower", SAME: "the same within the noise",
         UNKNOWN: "no noise estimate to judge the difference"}


@dataclass(frozen=True)
class Verdict:
    """B against A: the rate ratio, its interval and what it says."""

    word: str  # "faster" | "slower" | "same" | "unknown"
    unit: str
    ratio: float | None  # B's rate / A's
    interval: tuple[float, float] | None
    noise: float | None  # the interval's relative half-width (about 95%)
    a_rate: float | None
    b_rate: float | None
    a_step_s: float | None
    b_step_s: float | None
    text: str

    @property
    def change(self) -> float | None:
        """B's rate relative to A's, less one: -0.2 is 20% slower."""
        return None if self.ratio is None else self.ratio - 1.0


@dataclass(frozen=True)
class Figure:
    """One figure of both runs side by side."""

    name: str
    unit: str  # "ms" | "share" | "bytes" | "text" | the rate's unit
    a: float | str | None
    b: float | str | None

    @property
    def change(self) -> float | None:
        """B less A, for numbers both runs have."""
        if isinstance(self.a, (int, float)) and isinstance(self.b, (int, float)):
            return self.b - self.a
        return None


@dataclass(frozen=True)
class Comparison:
    """Everything `advisor compare` says about two runs. Built by `compare_runs`; the views format it."""

    a: Run
    b: Run
    verdict: Verdict
    breakdown: tuple[Figure, ...]  # one per role, ms per step
    moved_most: tuple[str, str] | None  # (role, sentence)
    figures: tuple[Figure, ...]
    kernel_families: tuple[Move, ...]
    kernels: tuple[Move, ...]
    operator_families: tuple[Move, ...]
    operators: tuple[Move, ...]
    tensor_cores: dict
    settings: tuple[tuple[str, str | None, str | None], ...]
    notes: tuple[str, ...] = ()
    machines: str | None = None  # where the two ran on different machines: which of their facts differ

    def slower_than(self, percent: float) -> bool:
        """B is slower than A beyond the noise, by more than `percent` % of A's rate (the CI gate)."""
        v = self.verdict
        return v.word == "slower" and v.change is not None and -100.0 * v.change > percent


def verdict_of(a: Run, b: Run) -> Verdict:
    """B's rate against A's with its interval (see the module docstring)."""
    ta, tb = a.timing, b.timing
    same_unit = ta.unit == tb.unit == "samples/s"
    unit = "samples/s" if same_unit else "steps/s"
    ra, rb = (ta.rate, tb.rate) if same_unit else (ta.steps_per_s, tb.steps_per_s)
    if not ra or not rb:
        return Verdict(UNKNOWN, unit, None, None, None, ra, rb, ta.step_s, tb.step_s,
                       "no rate to compare: a run has neither a trial's timing nor ProfilerStep spans")
    ratio = rb / ra
    se_a = ta.relative_se if ta.relative_se is not None else tb.relative_se
    se_b = tb.relative_se if tb.relative_se is not None else ta.relative_se
    if se_a is None or se_b is None:  # one step or window each: nothing says how far chance alone moves them
        return Verdict(UNKNOWN, unit, ratio, None, None, ra, rb, ta.step_s, tb.step_s,
                       f"B runs at {ratio:.3f}× A's {unit}, but neither run measured more than one step or "
                       "window: no noise to judge the difference against")
    half = Z95 * math.hypot(se_a, se_b)
    low, high = ratio * math.exp(-half), ratio * math.exp(half)
    word = "faster" if low > 1.0 else "slower" if high < 1.0 else SAME
    span = f"{unit} ratio {ratio:.3f}, 95% interval {low:.3f} to {high:.3f}"
    if word == SAME:
        text = f"the same within the noise: B runs at {ratio:.3f}× A's {unit} (interval {low:.3f} to {high:.3f})"
    else:
        text = f"B is {100 * abs(ratio - 1):.1f}% {word} than A ({span}): beyond the noise (±{100 * half:.1f}%)"
    return Verdict(word, unit, ratio, (low, high), half, ra, rb, ta.step_s, tb.step_s, text)


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1000.0


def _peak_memory(run: Run) -> float | None:
    """The run's peak memory: the accelerator's peak allocated (profiler events), else the trial's peak."""
    d = run.diagnosis
    device = [m.peak_allocated for m in (d.memory if d is not None else ())
              if m.device != "cpu" and m.peak_allocated is not None]
    if device:
        return max(device)
    peak = ((run.trial or {}).get("summary") or {}).get("peak_memory_bytes")
    return peak if isinstance(peak, (int, float)) else None


def copy_kind(d: Diagnosis) -> str:
    """The host memory its host-to-device copies come from: pinned, pageable, mixed, unknown or none."""
    c = d.copies
    kinds = [k for k, us in (("pinned", c.pinned_us), ("pageable", c.pageable_us), ("unknown", c.unknown_us)) if us]
    return "none" if not kinds else kinds[0] if len(kinds) == 1 else "mixed (" + ", ".join(kinds) + ")"


def _steady_wait(run: Run) -> float | None:
    steady = ((run.trial or {}).get("summary") or {}).get("steady")
    wait = steady.get("wait_share") if isinstance(steady, dict) else None
    return wait if isinstance(wait, (int, float)) else None


# The figures of a trace, side by side: (name, unit, figure of a Diagnosis).
TRACE_FIGURES = (
    ("step time in the trace", "ms", lambda d: _ms(d.step_time_us)),
    ("loader wait per step", "ms", lambda d: _ms(d.breakdown_us["dataloader"])),
    ("loader share of the step", "share", lambda d: d.dataloader_share),
    ("Tensor Core share of kernel time", "share", lambda d: d.tensor_core_share),
    ("matmul work AMP could still move", "share", lambda d: d.eligible_share),
    ("kernel time per step", "ms", lambda d: _ms(d.kernel_us) if d.platform != "cpu" else None),
    ("GPU utilization", "share", lambda d: d.gpu_utilization),
    ("host-to-device bytes per step", "bytes", lambda d: d.copies.bytes),
    ("copies from", "text", copy_kind),
    ("copy time per step", "ms", lambda d: _ms(d.copies.total_us)),
    ("host blocked on copies per step", "ms", lambda d: _ms(d.copies.host_wait_us)),
    ("exposed communication per step", "ms",
     lambda d: _ms(d.communication.exposed_us) if d.communication is not None else None),
    ("bound", "text", lambda d: d.bound),
)


def figures_of(a: Run, b: Run, unit: str) -> list[Figure]:
    """The figures of both runs, side by side: their timing, their traces' figures, their peak memory."""
    def rate(run: Run) -> float | None:
        return run.timing.rate if unit == run.timing.unit else run.timing.steps_per_s

    def step_ms(run: Run) -> float | None:
        return None if run.timing.step_s is None else 1000 * run.timing.step_s

    out = [Figure(unit, unit, rate(a), rate(b)), Figure("step time", "ms", step_ms(a), step_ms(b)),
           Figure("loader wait in steady state", "share", _steady_wait(a), _steady_wait(b))]
    da, db = a.diagnosis, b.diagnosis
    for name, fig_unit, get in TRACE_FIGURES:
        out.append(Figure(name, fig_unit, get(da) if da is not None else None, get(db) if db is not None else None))
    out.append(Figure("peak memory", "bytes", _peak_memory(a), _peak_memory(b)))
    return [f for f in out if f.a is not None or f.b is not None]


def machines_text(a: Run, b: Run) -> str | None:
    """Where A and B ran on different machines (each side's record says, and they differ): which of its facts, in
    words; None where they ran alike or a side does not say."""
    differ = [n for n in MACHINE if a.settings.get(n) and b.settings.get(n) and a.settings[n] != b.settings[n]]
    if not differ:
        return None
    return (f"A and B ran on different machines ({', '.join(differ)}: see the settings that differ): what moved "
            "between them is the machines' as much as the settings'")


def compare_runs(a: Run, b: Run) -> Comparison:
    """Compare two loaded runs (the figures of their representative traces, their timings, settings)."""
    verdict = verdict_of(a, b)
    names = sorted(set(a.settings) | set(b.settings))
    settings = tuple((n, a.settings.get(n), b.settings.get(n)) for n in names if a.settings.get(n) != b.settings.get(n))
    notes = []
    for side, run in (("A", a), ("B", b)):
        if run.timing.source != "windows":
            notes.append(f"{side}'s rate comes from {run.timing.samples} {SOURCE_WORDS[run.timing.source]}, not "
                         "steady-state windows: its noise is their spread")
        if run.diagnosis is None:
            notes.append(f"{side} kept no trace: only its timing, memory and settings are compared")
    if verdict.unit == "steps/s":
        notes.append("compared in steps/s: a run does not know its batch size")
    common = dict(a=a, b=b, verdict=verdict, figures=tuple(figures_of(a, b, verdict.unit)), settings=settings,
                  notes=tuple(notes), machines=machines_text(a, b))
    da, db = a.diagnosis, b.diagnosis
    if da is None or db is None:
        return Comparison(breakdown=(), moved_most=None, kernel_families=(), kernels=(), operator_families=(),
                          operators=(), tensor_cores={"a_share": None, "b_share": None, "moved_onto": [],
                                                      "moved_off": [], "text": "no trace on both sides"}, **common)
    breakdown = tuple(Figure(role, "ms", _ms(da.breakdown_us[role]), _ms(db.breakdown_us[role])) for role in ROLES)
    biggest = max(breakdown, key=lambda f: abs(f.change or 0.0))
    moved_most = None
    if biggest.change:
        moved_most = (biggest.name, f"{ROLE_LABELS[biggest.name]}: {biggest.a:.2f} → {biggest.b:.2f} ms per step "
                                    f"({biggest.change:+.2f} ms)")
    trace_a, trace_b = load_trace(da.source), load_trace(db.source)
    device = db.device or da.device
    vendor = device.vendor if device is not None else "unknown"

    def family_of(name: str) -> str:
        return kernel_family(vendor, name)

    ka, kb = kernel_times(trace_a, list(da.steps)), kernel_times(trace_b, list(db.steps))
    oa, ob = operator_times(trace_a, list(da.steps)), operator_times(trace_b, list(db.steps))
    all_kernels = moves(ka, kb, family_of)
    families = family_moves(ka, kb, family_of)
    onto, off = tensor_core_moves(all_kernels)
    tensor_cores = {"a_share": da.tensor_core_share, "b_share": db.tensor_core_share,
                    "moved_onto": onto[:TOP_NAMES], "moved_off": off[:TOP_NAMES],
                    "text": tensor_core_text(da.tensor_core_share, db.tensor_core_share, onto, off, families)}
    return Comparison(breakdown=breakdown, moved_most=moved_most,
                      kernel_families=tuple(families), kernels=tuple(all_kernels[:TOP_NAMES]),
                      operator_families=tuple(family_moves(oa, ob, operator_family)),
                      operators=tuple(moves(oa, ob, operator_family, TOP_NAMES)), tensor_cores=tensor_cores, **common)


def tensor_core_text(a_share: float | None, b_share: float | None, onto: list[Move], off: list[Move],
                     families: list[Move]) -> str:
    """One sentence on the work that moved onto (or off) Tensor Cores: the share, the time of Tensor Core and of
    FP32-unit matmul kernels in A and B, and the kernels that came onto Tensor Cores (named in the tables)."""
    if a_share is None and b_share is None:
        return "no Tensor Core figures: neither trace ran kernels of a GPU whose Tensor Core kernels are known"
    text = f"Tensor Core share of kernel time {_pct(a_share)} → {_pct(b_share)}"
    if not onto and not off:
        return text
    family = {m.name: m for m in families}
    for name, words in ((TENSOR_CORE_FAMILY, "on Tensor Cores"), (FP32_FAMILY, "matmul/conv on the FP32 units")):
        m = family.get(name)
        if m is not None:
            text += f"; {words} {m.a_us / 1000:.3f} → {m.b_us / 1000:.3f} ms per step"
    if onto:
        gained = sum(m.change_us for m in onto) / 1000.0
        text += (f"; {len(onto)} kernel(s) came onto Tensor Cores or grew there (+{gained:.3f} ms per step), "
                 f"{sum(m.status == 'added' for m in onto)} of them new in B")
    return text


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def compare(a: Path | str, b: Path | str, steps: str | None = None, parallel: bool = False) -> Comparison:
    """Compare two runs, each a session folder, a trial folder, a trace file or a folder of ranks (`parallel`:
    a folder's traces parsed in parallel processes, see `advisor.analysis.analyze.analyze_path`)."""
    return compare_runs(load_run(a, steps, parallel), load_run(b, steps, parallel))


def _move(m: Move) -> dict:
    return {"name": m.name, "family": m.family, "a_ms": m.a_us / 1000.0, "b_ms": m.b_us / 1000.0,
            "change_ms": m.change_us / 1000.0, "status": m.status}


def _run_dict(run: Run) -> dict:
    t = run.timing
    return {"path": run.path, "kind": run.kind, "label": run.label, "unit": t.unit, "rate": t.rate,
            "relative_se": t.relative_se, "interval": list(t.interval) if t.interval else None, "source": t.source,
            "samples": t.samples, "batch_size": t.batch_size,
            "step_ms": None if t.step_s is None else 1000 * t.step_s,
            "trace_step_ms": run.diagnosis.step_time_us / 1000.0 if run.diagnosis is not None else None,
            "traces": [d.source for d in run.diagnoses]}


def comparison_to_dict(c: Comparison) -> dict:
    """The `advisor.compare/1` document (schema in this module's docstring)."""
    v = c.verdict
    moved = None
    if c.moved_most is not None:
        role, text = c.moved_most
        f = next(f for f in c.breakdown if f.name == role)
        moved = {"role": role, "label": ROLE_LABELS[role], "a_ms": f.a, "b_ms": f.b, "change_ms": f.change, "text": text}
    ranks = {"a": c.a.slowest_rank, "b": c.b.slowest_rank}
    return {
        "schema": SCHEMA, "a": _run_dict(c.a), "b": _run_dict(c.b),
        "verdict": {"word": v.word, "text": v.text, "unit": v.unit, "ratio": v.ratio, "change": v.change,
                    "interval": list(v.interval) if v.interval else None, "noise": v.noise, "a_rate": v.a_rate,
                    "b_rate": v.b_rate, "a_step_ms": None if v.a_step_s is None else 1000 * v.a_step_s,
                    "b_step_ms": None if v.b_step_s is None else 1000 * v.b_step_s},
        "breakdown": [{"role": f.name, "label": ROLE_LABELS[f.name], "a_ms": f.a, "b_ms": f.b, "change_ms": f.change}
                      for f in c.breakdown],
        "moved_most": moved,
        "figures": [{"name": f.name, "unit": f.unit, "a": f.a, "b": f.b, "change": f.change} for f in c.figures],
        "kernels": {"families": [_move(m) for m in c.kernel_families], "names": [_move(m) for m in c.kernels]},
        "operators": {"families": [_move(m) for m in c.operator_families], "names": [_move(m) for m in c.operators]},
        "tensor_cores": {"a_share": c.tensor_cores["a_share"], "b_share": c.tensor_cores["b_share"],
                         "moved_onto": [_move(m) for m in c.tensor_cores["moved_onto"]],
                         "moved_off": [_move(m) for m in c.tensor_cores["moved_off"]],
                         "text": c.tensor_cores["text"]},
        "settings": [{"name": n, "a": x, "b": y} for n, x, y in c.settings],
        "ranks": ranks if any(ranks.values()) else None,
        "notes": list(c.notes),
        "machines": c.machines,
    }

"""One trace as the report shows it: its Diagnosis, JSON form, hotspots and formatted figures (`TraceView`),
and the charts drawn from them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from advisor.analysis.analyze import analyze_file, diagnosis_to_dict
from advisor.analysis.breakdown import ROLES
from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.trace import load_trace
from advisor.files import file_stamps
from advisor.report import charts
from advisor.report.formatting import attention_text, gb, ms, pct
from advisor.report.hotspots import Hotspot, hotspots
from advisor.report.terminal import ROLE_LABELS, accelerator_name, bound_line, device_line, rank_line, role_labels, \
    trace_label


@dataclass(frozen=True)
class TraceView:
    """What the templates show of one trace: its Diagnosis, JSON form, hotspots and formatted figures."""

    label: str
    short: str  # for charts and the verdict: 'image_classifier/00-baseline' or the file name
    file: str
    device: str
    bound: str  # 'Bound: input pipeline (DataLoader) — 97% of the step waiting on the DataLoader'
    rank: str | None  # 'Rank 3 of 8 (nccl)'
    diagnosis: Diagnosis
    figures: dict  # diagnosis_to_dict(diagnosis)
    figure_rows: tuple[tuple[str, str], ...]
    breakdown_rows: tuple[tuple[str, str, str], ...]
    kernels: tuple[Hotspot, ...]
    operators: tuple[Hotspot, ...]
    memory_timeline: str | None  # chart data URI, when the trace has [memory] events


def figure_rows(d: Diagnosis, f: dict) -> tuple[tuple[str, str], ...]:
    """Key figures as (label, value) rows, in the order the terminal shows them."""
    rows = [("Steps", f"{f['steps']['count']}, mean {ms(f['steps']['mean_ms'])}, "
                      f"median {ms(f['steps']['median_ms'])}"),
            ("DataLoader share of step", pct(f["dataloader_share"]))]
    if f.get("loader_steady_share") is not None:
        rows.append(("DataLoader share once its queue ran dry", pct(f["loader_steady_share"])))
    if d.platform == "gpu":
        unit = "Matrix core" if d.device is not None and d.device.vendor == "amd" else "Tensor Core"
        c = f["copies"]
        size = f", {c['bytes'] / 1e6:.1f} MB" if c["bytes"] else ""
        rows += [("GPU utilization", pct(f["gpu_utilization"])),
                 (f"{unit} share of kernel time", pct(f["tensor_core_share"])),
                 ("Eligible matmul/conv time not on them", pct(f["eligible_share"])),
                 ("Layout conversions (NCHW↔NHWC) of kernel time", pct(f["layout_share"])),
                 ("Host-to-device copies per step",
                  f"{c['count']:.0f}: pageable {ms(c['pageable_ms'])}, pinned {ms(c['pinned_ms'])}, "
                  f"unspecified {ms(c['unknown_ms'])}{size} ({pct(c['share'])} of the step)"),
                 ("Host blocked on copies per step",
                  f"{ms(c['host_wait_ms'])} over {c['synchronous']:.0f} copies (pageable staging "
                  f"{ms(c['pageable_wait_ms'])}, synchronizes {ms(c['sync_wait_ms'])})")]
    elif d.platform != "cpu":
        rows.append((f"{accelerator_name(d)} utilization", pct(f["gpu_utilization"])))
    else:
        rows.append(("Matmul/conv operators share of step", pct(f["eligible_share"])))
    if attention_text(f.get("attention")):
        rows.append(("Attention share of step", attention_text(f["attention"])))
    for m in f["memory"]:
        if m["peak_allocated"] is not None:
            cap = f" of {gb(m['capacity'])}, {pct(m['headroom'])} free" if m["capacity"] else ""
            # Tensors only, from the profiler's [memory] events (a session's tables show the whole process).
            rows.append((f"Peak tensor memory {m['device']}", f"{gb(m['peak_allocated'])} allocated{cap}"))
        elif m["growth"]:
            rows.append((f"Memory growth {m['device']}", f"+{gb(m['growth'])} (no totals in the trace)"))
    return tuple(rows)


def trace_view(path: Path) -> TraceView:
    """Diagnose one trace file (with its trial record, if any) and format it for the templates."""
    path = Path(path).resolve()
    path.stat()  # a trace that is not there is an OSError here, as reading it would be
    return _trace_view(path, file_stamps([path, path.parent / "trial.json"]))


# A session writes its HTML report and then its TensorBoard runs from the same traces: diagnose each once.
# Keyed by the files' stamps, so a rewritten trace or trial record is diagnosed again.
@lru_cache(maxsize=64)
def _trace_view(path: Path, _stamps: tuple) -> TraceView:
    # Not linted: the script trial.json names lies outside the session folder. Timelines: a rank's step is
    # drawn beside the other ranks'.
    trace = load_trace(path)
    d = analyze_file(path, timelines=True, trace=trace)
    f = diagnosis_to_dict(d)
    found = hotspots(trace, len(d.steps), d.step_time_us)
    shares = d.breakdown_share
    labels = role_labels(d)
    breakdown = tuple((labels[r], ms(d.breakdown_us[r] / 1000), pct(shares[r]))
                      for r in ROLES if d.breakdown_us[r] > 0)
    short = Path(d.source).name
    if d.trial:
        short = f"{Path(str(d.trial.get('script') or '?')).stem}/{d.trial.get('name') or '?'}"
    if (d.distributed or {}).get("world_size") not in (None, 1) and (d.distributed or {}).get("rank") is not None:
        short += f" rank {d.distributed['rank']}"
    return TraceView(label=trace_label(d), short=short, file=Path(d.source).name, device=device_line(d),
                     bound=bound_line(d), rank=rank_line(d), diagnosis=d,
                     figures=f, figure_rows=figure_rows(d, f), breakdown_rows=breakdown,
                     kernels=found["kernels"], operators=found["operators"], memory_timeline=memory_timeline(d))


def memory_timeline(d: Diagnosis) -> str | None:
    """The memory timeline chart of a trace: accelerators when it has them, else the CPU."""
    with_data = [m for m in d.memory if len(m.timeline_ms) > 1]
    shown = [m for m in with_data if m.device != "cpu"] or with_data
    if not shown:
        return None
    capacities = {m.capacity for m in shown if m.capacity}
    return charts.memory_timeline_chart([(m.device, m.timeline_ms, m.timeline_bytes) for m in shown],
                                        max(capacities) if len(capacities) == 1 else None,
                                        cumulative=all(m.peak_allocated is None for m in shown))


def breakdown_chart(views: list[tuple[str, TraceView | None]]) -> str:
    """The stacked step-time breakdown of several traces (or trials), one bar each."""
    labels = [label if v is not None else f"{label} (no trace)" for label, v in views]
    data = [{} if v is None else {r: v.diagnosis.breakdown_us[r] / 1000 for r in ROLES} for _, v in views]
    return charts.breakdown_chart(labels, data, ROLES, ROLE_LABELS)

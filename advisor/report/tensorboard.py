"""TensorBoard runs for a session: each trial folder is a run (`tensorboard --logdir DIR/trials`).

The trial's `*.pt.trace.json.gz` already sits directly in its folder, where the PyTorch profiler plugin
looks for a run's traces; this module adds the event file next to it: scalars keyed by trial index
(global_step), so the runs line up as a sequence, and one text entry with the diagnosis and the decision.
Figures come from session.json and each trial's Diagnosis, as in the HTML report.
"""

from __future__ import annotations

from pathlib import Path

from advisor.analysis.breakdown import ROLES


def trial_text(row: dict, view, unit: str = "samples/s") -> str:
    """The markdown shown in TensorBoard's Text tab for one trial: decision, figures, advice."""
    lines = [f"**{row['name']}**: {row.get('change') or 'baseline'}",
             "",
             f"- decision: **{row.get('decision') or '?'}** ({row.get('status') or '?'}): {row.get('reason') or ''}"]
    if row.get("samples_per_s") is not None:
        lines.append(f"- {unit}: {row['samples_per_s']:.1f}, speed-up ×{row.get('speedup') or 0:.2f}")
    if view is not None:
        d = view.diagnosis
        lines.append(f"- device: {view.device}")
        lines.append(f"- {view.bound}")
        lines.append("- step-time breakdown: " + ", ".join(
            f"{label} {share}" for label, _per_step, share in view.breakdown_rows))
        for label, value in view.figure_rows:
            lines.append(f"- {label}: {value}")
        if d.recommendations:
            lines += ["", "Recommendations, best first:"]
            for i, r in enumerate(d.recommendations, 1):
                when = "" if r.helps_now else f", helps once {r.helps_once} is fixed"
                lines.append(f"{i}. {r.title} (~{100 * r.predicted_gain:.1f}% of step time{when}): "
                             + "; ".join(r.evidence))
    return "\n".join(lines)


def write_tensorboard(session_dir: Path) -> list[Path]:
    """Write one TensorBoard run per trial of a session; re-running replaces the earlier event files."""
    from torch.utils.tensorboard import SummaryWriter  # torch only here: the rest of the report is torch-free

    from advisor.report.session_folder import load_session, trial_folder, trial_traces
    from advisor.report.views import trace_view

    session_dir = Path(session_dir)
    session = load_session(session_dir)
    unit = session.get("unit") or "samples/s"  # steps/s where no step knew its batch size
    runs = []
    for row in session["trials"]:
        folder = trial_folder(session_dir, row)
        if folder is None or not folder.is_dir():
            continue
        for old in folder.glob("events.out.tfevents.*"):
            old.unlink()  # idempotent: one event file per run, however often the report is rewritten
        traces = trial_traces(session_dir, row)
        view = trace_view(traces[0]) if traces else None
        step = int(row["index"])
        writer = SummaryWriter(log_dir=str(folder))
        try:
            scalars = {
                f"throughput/{unit.replace('/', '_per_')}": row.get("samples_per_s"),
                "throughput/speedup": row.get("speedup"),
                "step_time/median_ms": None if row.get("median_step_s") is None else 1000 * row["median_step_s"],
                "memory/peak_gb": None if row.get("peak_memory_bytes") is None else row["peak_memory_bytes"] / 1e9,
                "batch_size": row.get("batch_size"),
            }
            if view is not None:
                d = view.diagnosis
                scalars["step_time/profiled_ms"] = d.step_time_us / 1000
                for role in ROLES:
                    scalars[f"breakdown/{role}"] = d.breakdown_share[role]
                if d.gpu_utilization is not None:
                    scalars["gpu/utilization"] = d.gpu_utilization
            for tag, value in scalars.items():
                if value is not None:
                    writer.add_scalar(tag, float(value), global_step=step)
            writer.add_text("diagnosis", trial_text(row, view, unit), global_step=step)
        finally:
            writer.close()
        runs.append(folder)
    return runs

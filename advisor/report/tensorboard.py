"""TensorBoard for a session (`tensorboard --logdir DIR/trials`): one run, `session`, and the traces.

The run `session` (DIR/trials/session/) holds the session as series over the trial index (global_step):
each trial's samples/s, the samples/s of the setting kept after each trial (the ladder), step time, memory,
batch size and the step-time breakdown, and a text entry per trial with its decision and diagnosis. One run
puts the trials on one line per chart; a series is written only where some trial has data for it, so a CPU
session has no GPU series. Each trial's `*.pt.trace.json.gz` already sits in its own folder, where the
PyTorch profiler plugin (torch-tb-profiler) finds it: there each trial is a run. Figures come from
session.json and each trial's Diagnosis, as in the HTML report.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from advisor.escape import for_markdown as md
from advisor.report.formatting import step_time_s

SESSION_RUN = "session"  # DIR/trials/session: a name no trial folder takes (theirs start with their index)
LADDER = ("baseline", "kept")  # the decisions that set what the next trial starts from


def trial_text(row: dict, view, unit: str = "samples/s") -> str:
    """The markdown shown in TensorBoard's Text tab for one trial: decision, figures, advice. Every text
    from the record or the trace is escaped, so `DataLoader.__next__` shows as written, not in bold."""
    lines = [f"**{md(row['name'])}**: {md(row.get('change') or 'baseline')}",
             "",
             f"- decision: **{md(row.get('decision') or '?')}** ({md(row.get('status') or '?')}): "
             + md(row.get("reason") or "")]
    if row.get("samples_per_s") is not None:
        lines.append("- " + md(f"{unit}: {row['samples_per_s']:.1f}, speed-up ×{row.get('speedup') or 0:.2f}"))
    if view is not None:
        d = view.diagnosis
        lines.append("- " + md(f"device: {view.device}"))
        lines.append("- " + md(view.bound))
        lines.append("- " + md("step-time breakdown: " + ", ".join(
            f"{label} {share}" for label, _per_step, share in view.breakdown_rows)))
        lines += ["- " + md(f"{label}: {value}") for label, value in view.figure_rows]
        if d.recommendations:
            lines += ["", "Recommendations, by what each is worth a trial:", ""]
            for i, r in enumerate(d.recommendations, 1):
                when = "" if r.helps_now else f", helps once {r.helps_once} is fixed"
                lines.append(f"{i}. " + md(f"{r.title} (~{100 * r.predicted_gain:.1f}% of step time, worth "
                                           f"{100 * r.worth:+.0f}%{when}): "
                                           + "; ".join(r.evidence)))
    return "\n".join(lines)


def session_series(rows: list[dict], diagnoses: dict, unit: str = "samples/s") -> dict[str, dict[int, float]]:
    """The series of the session run: tag -> {trial index: value}, only the series some trial has data for.

    `diagnoses` maps a trial index to its Diagnosis (trials without a trace are left out). `throughput/
    <unit>_kept` is the ladder: after each trial, the samples/s of the setting the session kept (the
    baseline's until a change is kept)."""
    from advisor.analysis.breakdown import ROLES

    rate = unit.replace("/", "_per_")
    series: dict[str, dict[int, float]] = {}

    def put(tag: str, index: int, value) -> None:
        if value is not None:
            series.setdefault(tag, {})[index] = float(value)

    kept = None
    for row in rows:
        i = int(row["index"])
        if row.get("decision") in LADDER and row.get("samples_per_s") is not None:
            kept = row["samples_per_s"]
        put(f"throughput/{rate}", i, row.get("samples_per_s"))
        put(f"throughput/{rate}_kept", i, kept)
        put("throughput/speedup", i, row.get("speedup"))
        put("step_time/ms", i, None if step_time_s(row) is None else 1000 * step_time_s(row))  # batch / samples/s
        put("memory/peak_gb", i, None if row.get("peak_memory_bytes") is None else row["peak_memory_bytes"] / 1e9)
        put("batch_size", i, row.get("batch_size"))
        d = diagnoses.get(i)
        if d is not None:
            put("step_time/profiled_ms", i, d.step_time_us / 1000)
            put("gpu/utilization", i, d.gpu_utilization)
            for role in ROLES:
                put(f"breakdown/{role}", i, d.breakdown_share[role])
    # A role no trial spent time in (kernels, copies and the runtime on a CPU) has no data: a flat zero line
    return {tag: points for tag, points in series.items()
            if not tag.startswith("breakdown/") or any(points.values())}


def session_run(session_dir: Path) -> dict:
    """What the session run holds, torch-free: its folder (`run`), `scalars` as [tag, trial index, value] and
    `texts` as [trial index, markdown], and the trial folders with traces (`trace_runs`, the profiler plugin's
    runs). Each trial folder's own event files, from before it was part of a session, are removed here."""
    from advisor.report.session_folder import load_session, trial_folder, trial_traces
    from advisor.report.views import trace_view

    session_dir = Path(session_dir)
    session = load_session(session_dir)
    unit = session.get("unit") or "samples/s"  # steps/s where no step knew its batch size
    rows, views, trace_runs = [], {}, []
    for row in session["trials"]:
        folder = trial_folder(session_dir, row)
        if folder is None or not folder.is_dir():
            continue
        for old in folder.glob("events.out.tfevents.*"):
            old.unlink()  # a trial was its own run before the session run: one run, however often rewritten
        traces = trial_traces(session_dir, row)
        if traces:
            views[int(row["index"])] = trace_view(traces[0])
            trace_runs.append(str(folder))
        rows.append(row)
    diagnoses = {i: v.diagnosis for i, v in views.items()}
    scalars = [[tag, index, value] for tag, points in session_series(rows, diagnoses, unit).items()
               for index, value in sorted(points.items())]
    texts = [[int(row["index"]), trial_text(row, views.get(int(row["index"])), unit)] for row in rows]
    return {"run": str(session_dir / "trials" / SESSION_RUN), "scalars": scalars, "texts": texts,
            "trace_runs": trace_runs}


def write_run(run: dict) -> None:
    """Write a `session_run` with torch's SummaryWriter, replacing the run written before."""
    from torch.utils.tensorboard import SummaryWriter  # torch only here: the rest of the report is torch-free

    folder = Path(run["run"])
    if folder.is_symlink():  # the session folder is input: never write through a link out of it
        folder.unlink()
    elif folder.is_dir():
        shutil.rmtree(folder)  # written only here
    writer = SummaryWriter(log_dir=str(folder))
    try:
        for tag, index, value in run["scalars"]:
            writer.add_scalar(tag, value, global_step=index)
        for index, text in run["texts"]:
            writer.add_text("trials", text, global_step=index)
    finally:
        writer.close()


def write_run_json(run: str) -> None:
    """`write_run` of a run given as JSON text (a call into a process that has torch: `call_forked`)."""
    write_run(json.loads(run))


def write_tensorboard(session_dir: Path) -> list[Path]:
    """Write the session run (DIR/trials/session) and return it with the trial folders that hold traces
    (the profiler plugin's runs); re-running replaces the earlier event files."""
    run = session_run(session_dir)
    write_run(run)
    return [Path(run["run"]), *map(Path, run["trace_runs"])]

"""The HTML report: session.json and Diagnoses → one self-contained page, rendered from jinja2 templates.

Data flows one way: the report reads what the session wrote (session.json, trial folders, the patch:
`session_folder`) and the Diagnosis of each trace (`advisor.analysis.analyze.analyze_file`, shown as a
`views.TraceView`); it formats figures (`formatting`), it never recomputes them. Everything taken from input is rendered with autoescape on and no `|safe` filter; charts are base64
`data:` images, so nothing a trace or a folder name contains can become markup or script.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import jinja2

from advisor import files
from advisor.analysis.bound import BOUNDS
from advisor.analysis.job import jobs_of_path
from advisor.analysis.reading import trace_files
from advisor.errors import AdvisorError, NotATrace, TraceError
from advisor.escape import without_surrogates
from advisor.report import charts
from advisor.knobs.compile import figures_text as compile_text
from advisor.report.formatting import flatten, gain, gb, memory_cap_text, ms, num, option_rows, pct, \
    seconds_ms, spread, step_time_s, time_text
from advisor.report.outcomes import REMEASURES, lint_findings, split_recommendations, verdict
from advisor.report.session_folder import checked_trial_traces, inside, load_session, trial_traceback
from advisor.report.job_view import JobView, job_view, job_views
from advisor.report.views import TraceView, breakdown_chart, trace_view


def templates_dir() -> Path:
    """Where the jinja2 templates are: beside the package in a wheel, at the top of the checkout otherwise.

    The wheel maps the top-level `templates/` folder to `advisor/templates/` (pyproject package-dir); a
    checkout or editable install reads the folder where it is.
    """
    here = Path(__file__).resolve()
    for candidate in (here.parent.parent / "templates", here.parents[2] / "templates"):
        if (candidate / "base.html.j2").is_file():
            return candidate
    raise AdvisorError(f"report templates not found beside {here.parent.parent} (is the package installed?)")


def ladder_rows(rows: list[dict]) -> list[dict]:
    """The baseline and each kept change, in order; a re-measure that confirmed a setting already on the
    ladder is not a new step of it."""
    ladder: list[dict] = []
    for r in rows:
        if r.get("decision") not in ("baseline", "kept"):
            continue
        if r.get("recommendation") in REMEASURES and any(r.get("knobs") == l.get("knobs") for l in ladder):
            continue
        ladder.append(r)
    return ladder


# One per process: an environment compiles each template it loads (about 50 ms a template) and keeps it.
@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The jinja2 environment: autoescape always on, undefined names are errors, figure filters."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir()),
        autoescape=True,  # every template, whatever its suffix
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(pct=pct, ms=ms, seconds_ms=seconds_ms, step_time_s=step_time_s, gb=gb, num=num, gain=gain,
                       spread=spread, compile_text=compile_text, basename=lambda p: Path(str(p)).name)
    env.globals["BOUNDS"] = BOUNDS
    env.globals["REMEASURES"] = REMEASURES
    return env


# ---- recorded traces ----

def render_trace_report(path: Path) -> str:
    """The report of a recorded trace file or a folder of traces: each one's diagnosis and advice."""
    path = Path(path)
    views, skipped = [], []
    for p in trace_files(path):
        try:
            views.append(trace_view(p))
        except NotATrace as exc:  # a folder's other .json files: skipped, and the page says so
            if path.is_file():
                raise
            skipped.append((p.name, exc.problem))
    if not views:
        raise AdvisorError(f"{path}: folder holds no torch.profiler trace (its .json files are something else)")
    memory_rows = [(v.short, m) for v in views for m in v.figures["memory"]
                   if m["device"] != "cpu" and m["peak_allocated"] is not None]
    memory_chart = None
    if memory_rows:
        capacities = {m["capacity"] for _, m in memory_rows if m["capacity"]}
        memory_chart = charts.memory_chart([f"{name} {m['device']}" for name, m in memory_rows],
                                           [m["peak_allocated"] for _, m in memory_rows],
                                           max(capacities) if len(capacities) == 1 else None,
                                           ["profiler [memory] events, peak Total Allocated"])
    return environment().get_template("traces.html.j2").render(
        title=f"advisor report: {path.name}", path=str(path), views=views, skipped=skipped,
        breakdown_chart=breakdown_chart([(v.short, v) for v in views]), memory_chart=memory_chart,
        jobs=[job_view(j) for j in jobs_of_path(path, [v.diagnosis for v in views])],
        command=f"advisor report {path}",
    )


# ---- sessions ----

def render_session_report(session_dir: Path) -> str:
    """The report of an optimization session folder (session.json, trials, suggested.patch)."""
    session_dir = Path(session_dir)
    session = load_session(session_dir)
    rows = session["trials"]
    unread = list(session["unread"])
    views: dict[str, TraceView | None] = {}
    jobs: dict[str, JobView | None] = {}  # a data-parallel trial's ranks side by side
    for row in rows:
        traces, problems = checked_trial_traces(session_dir, row)
        unread += problems
        views[row["name"]] = jobs[row["name"]] = None
        try:
            ranks = [trace_view(t) for t in traces]
        except TraceError as exc:  # one broken trace leaves its trial without a diagnosis, not the page
            unread.append(f"trial {row['name']}: {exc}")
            continue
        found = job_views([v.diagnosis for v in ranks]) if len(ranks) > 1 else []
        jobs[row["name"]] = found[0] if found else None
        # The trial's view: the rank the job turns on (its straggler), else the first trace.
        representative = found[0].job.representative.source if found else None
        views[row["name"]] = next((v for v in ranks if v.diagnosis.source == representative), ranks[0] if ranks else None)
    labels = [r["name"] for r in rows]
    baseline_name = session.get("baseline") or (labels[0] if labels else "")
    baseline = views.get(baseline_name)
    # The patch the session names; else the folder's suggested.patch (written before session.json names it).
    patch_name = session["patch"] or ("suggested.patch" if (session_dir / "suggested.patch").is_file() else None)
    patch_path = inside(session_dir, patch_name) if patch_name else None
    patch = None
    if patch_name and patch_path is None:
        unread.append(f"the patch {patch_name!r} is not inside the session folder: not read")
    elif patch_path is not None and os.path.lexists(patch_path):
        try:
            patch = files.read_regular(patch_path).decode("utf-8", errors="replace")
        except OSError as exc:
            unread.append(f"the patch {patch_name!r}: {files.describe_os_error(exc)}: not read")
    capacity = next((r.get("capacity_bytes") for r in rows if r.get("capacity_bytes")), None)
    unit = session.get("unit") or "samples/s"  # steps/s where no step knew its batch size
    still_open, refuted = split_recommendations(session.get("recommendations") or [], rows, unit)
    job = jobs.get(baseline_name)
    top = verdict(session, rows, baseline.bound if baseline is not None else None,
                  job.verdict if job is not None else None, still_open)
    chart = {}
    if rows and top["failed"] is None:
        chart = {
            "throughput": charts.throughput_chart(labels, [r.get("samples_per_s") for r in rows],
                                                  [r["decision"] or "?" for r in rows], unit,
                                                  [r.get("interval") for r in rows]),
            "breakdown": breakdown_chart([(r["name"], views[r["name"]]) for r in rows]),
            "memory": charts.memory_chart(labels, [r.get("peak_memory_bytes") for r in rows], capacity,
                                          [r.get("peak_memory_source") or "" for r in rows]),
        }
    tracebacks = {r["name"]: trial_traceback(session_dir, r) for r in rows if r.get("decision") == "failed"}
    return environment().get_template("session.html.j2").render(
        title=f"advisor report: {session['target'] or session_dir.name}",
        session=session, rows=rows, ladder=ladder_rows(rows),
        views=views, jobs=jobs, verdict=top, chart=chart, capacity=capacity,
        recommendations=still_open, refuted=refuted, patch=patch, patch_name=patch_name,
        notes=[str(n) for n in session["notes"] or []], tracebacks=tracebacks,
        device_rows=flatten(session.get("device") or {}), options=option_rows(session.get("options") or {}),
        command=session.get("command") or "", cwd=session.get("cwd"),
        lint=lint_findings(session.get("lint") or [], session, rows, unit),
        memory_cap=memory_cap_text(session.get("memory_cap")), unread=unread, unit=unit,
        timing=time_text(session.get("time")),
    )


def write_report(target: Path, out: Path) -> Path:
    """Write the report of a session folder (if it has session.json) or of trace(s) to `out`, atomically."""
    target, out = Path(target), Path(out)
    is_session = target.is_dir() and os.path.lexists(target / "session.json")
    text = render_session_report(target) if is_session else render_trace_report(target)
    return write_page(text, out)


def write_page(text: str, out: Path) -> Path:
    """Write an HTML page to `out` atomically: a reader (a browser, the session rewriting its report) never
    sees half a page."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(without_surrogates(text))  # file names that are not UTF-8, shown as \xff
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a report is meant to be shared
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out

"""The HTML report: session.json and Diagnoses → one self-contained page, rendered from jinja2 templates.

Data flows one way: this module reads what the session wrote (session.json, trial folders, the patch) and
the Diagnosis of each trace (`advisor.analysis.analyze.analyze_file`); it formats figures, it never recomputes
them. Everything taken from input is rendered with autoescape on and no `|safe` filter; charts are base64
`data:` images, so nothing a trace or a folder name contains can become markup or script.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from advisor import files
from advisor.analysis.analyze import analyze_file, diagnosis_to_dict
from advisor.analysis.bound import BOUNDS
from advisor.analysis.breakdown import ROLES
from advisor.analysis.diagnosis import Diagnosis
from advisor.errors import AdvisorError, NotATrace, TraceError
from advisor.escape import without_surrogates
from advisor.shapes import SESSION, TRIAL, conform_record, read_record
from advisor.report import charts
from advisor.report.hotspots import Hotspot, hotspots
from advisor.report.terminal import ROLE_LABELS, accelerator_name, bound_line, device_line, rank_line, role_labels, trace_label
from advisor.analysis.reading import trace_files
from advisor.analysis.trace import load_trace

SESSION_SCHEMA = "advisor.session/"
# Every field a template reads, so that an older or partial session.json renders with "n/a" instead of
# failing (the templates run with StrictUndefined to catch their own mistakes).
SESSION_FIELDS = ("target", "script", "command", "options", "status", "device", "user_values", "baseline", "best",
                  "final_knobs", "trials", "recommendations", "notes", "patch", "speedup", "memory_cap")
ROW_FIELDS = ("index", "name", "folder", "change", "recommendation", "knobs", "status", "decision", "reason",
              "batch_size", "median_step_s", "samples_per_s", "peak_memory_bytes", "peak_memory_source",
              "capacity_bytes", "loss", "speedup", "gain", "predicted_gain", "noise", "interval", "tried_under",
              "helps_now", "bound")


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


def environment() -> jinja2.Environment:
    """The jinja2 environment: autoescape always on, undefined names are errors, figure filters."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir()),
        autoescape=True,  # every template, whatever its suffix
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(pct=pct, ms=ms, seconds_ms=seconds_ms, gb=gb, num=num, gain=gain, spread=spread,
                       basename=lambda p: Path(str(p)).name)
    env.globals["BOUNDS"] = BOUNDS
    return env


# ---- figure formatting (text only; the numbers come from session.json and Diagnosis) ----

def pct(x: float | None) -> str:
    """0.123 → '12.3%'."""
    return "n/a" if x is None else f"{100 * x:.1f}%"


def ms(x: float | None) -> str:
    """Milliseconds with two decimals."""
    return "n/a" if x is None else f"{x:.2f} ms"


def spread(row: dict) -> str:
    """A trial's samples/s interval as ' ±12%' (half its 95% interval), or '' when it has none."""
    interval, sps = row.get("interval"), row.get("samples_per_s")
    if (not isinstance(interval, (list, tuple)) or len(interval) != 2 or not isinstance(sps, (int, float))
            or not all(isinstance(v, (int, float)) for v in interval) or not sps > 0):
        return ""
    return f" ±{50 * (interval[1] - interval[0]) / sps:.0f}%"


def seconds_ms(x: float | None) -> str:
    """Seconds shown as milliseconds."""
    return "n/a" if x is None else f"{1000 * x:.1f} ms"


def gb(x: float | None) -> str:
    """Bytes as GB."""
    return "n/a" if x is None else f"{x / 1e9:.2f} GB"


def num(x: float | None, digits: int = 1) -> str:
    """A plain number, or n/a."""
    return "n/a" if x is None else f"{x:,.{digits}f}"


def gain(x: float | None) -> str:
    """A share of step time saved, signed: '+12.0%'."""
    return "n/a" if x is None else f"{100 * x:+.1f}%"


# ---- one trace: its diagnosis, formatted ----

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
    for m in f["memory"]:
        if m["peak_allocated"] is not None:
            cap = f" of {gb(m['capacity'])}, {pct(m['headroom'])} free" if m["capacity"] else ""
            rows.append((f"Peak memory {m['device']}", f"{gb(m['peak_allocated'])} allocated{cap}"))
        elif m["growth"]:
            rows.append((f"Memory growth {m['device']}", f"+{gb(m['growth'])} (no totals in the trace)"))
    return tuple(rows)


def trace_view(path: Path) -> TraceView:
    """Diagnose one trace file (with its trial record, if any) and format it for the templates."""
    path = Path(path).resolve()
    stat = path.stat()
    trial = path.parent / "trial.json"
    trial_stamp = trial.stat().st_mtime_ns if trial.is_file() else None
    return _trace_view(path, stat.st_mtime_ns, stat.st_size, trial_stamp)


# A session writes its HTML report and then its TensorBoard runs from the same traces: diagnose each once.
# Keyed by the files' modification times, so a rewritten trace or trial record is diagnosed again.
@lru_cache(maxsize=64)
def _trace_view(path: Path, _mtime_ns: int, _size: int, _trial_mtime_ns: int | None) -> TraceView:
    d = analyze_file(path)  # not linted: the script trial.json names lies outside the session folder
    f = diagnosis_to_dict(d)
    found = hotspots(load_trace(path), len(d.steps), d.step_time_us)
    shares = d.breakdown_share
    labels = role_labels(d)
    breakdown = tuple((labels[r], ms(d.breakdown_us[r] / 1000), pct(shares[r]))
                      for r in ROLES if d.breakdown_us[r] > 0)
    short = Path(d.source).name
    if d.trial:
        short = f"{Path(str(d.trial.get('script') or '?')).stem}/{d.trial.get('name') or '?'}"
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
        command=f"advisor report {path}",
    )


# ---- sessions ----

def load_session(session_dir: Path) -> dict:
    """session.json of a session folder, checked for its schema and conformed to what the report reads.

    A hand-edited or foreign record renders what it can: fields of the wrong type (text for a number, a
    list for an object, NaN) are dropped (`advisor.shapes.SESSION`) and named in `session["unread"]`, which
    the page shows; `trials`, `notes`, `recommendations` and `lint` are always lists.
    """
    path = Path(session_dir) / "session.json"
    if not os.path.lexists(path):
        raise AdvisorError(f"{path}: no such file (not an advisor session folder)")
    record = read_record(path, SESSION_SCHEMA, "an advisor session record")
    session, problems = conform_record(record, SESSION)
    session = {k: session.get(k) for k in SESSION_FIELDS} | session
    for key in ("trials", "notes", "recommendations", "lint"):
        session[key] = session.get(key) or []
    rows = []
    for i, row in enumerate(session["trials"]):
        row = {k: row.get(k) for k in ROW_FIELDS} | row
        row["index"] = i if row["index"] is None else row["index"]
        row["name"] = row["name"] or f"trial {row['index']}"
        rows.append(row)
    session["trials"] = rows
    session["recommendations"] = [{**RECOMMENDATION_DEFAULTS, **{k: v for k, v in r.items() if v is not None}}
                                  for r in session["recommendations"]]
    session["lint"] = [{**LINT_DEFAULTS, **f} for f in session["lint"]]
    session["unread"] = [f"session.json: {p}" for p in problems]
    return session


# What the recommendation and lint templates read, for entries a record leaves out.
RECOMMENDATION_DEFAULTS = {"id": "", "title": "(untitled)", "predicted_gain": None, "bound": None, "helps_now": True,
                           "helps_once": "", "knobs": {}, "evidence": [], "code_change": "", "caveat": ""}
LINT_DEFAULTS = {"file": "", "line": None, "col": None, "rule": "", "title": "", "what": "", "why": "", "fix": ""}


def inside(session_dir: Path, relative: object) -> Path | None:
    """`session_dir / relative` if it stays inside the session folder (a session.json names only its own
    files): resolved, links followed; None for an absolute path, `../`, or a value that is not a path."""
    return files.inside(session_dir, relative)


def trial_folder(session_dir: Path, row: dict) -> Path | None:
    """The folder of one trial row, inside the session folder."""
    return inside(session_dir, row.get("folder") or f"trials/{row['name']}")


def trial_traces(session_dir: Path, row: dict) -> list[Path]:
    """The trace files of one trial row, as its trial.json lists them (or as found in its folder); only
    regular files inside the session folder (see `checked_trial_traces` for what was left out)."""
    return checked_trial_traces(session_dir, row)[0]


def checked_trial_traces(session_dir: Path, row: dict) -> tuple[list[Path], list[str]]:
    """(the trace files of one trial row, what was not read and why).

    Every path comes from session.json or trial.json, so each is followed only if it resolves inside the
    session folder (no `../`, no absolute path, no link out) and names a regular file (no FIFO, device or
    folder); anything else is left unopened and said.
    """
    root = Path(session_dir).resolve()
    name = row["name"]
    folder = trial_folder(session_dir, row)
    if folder is None:
        return [], [f"trial {name}: its folder {row.get('folder')!r} is not inside the session folder: not read"]
    if not folder.is_dir():
        return [], []
    problems: list[str] = []
    listed: list = []
    record = folder / "trial.json"
    if os.path.lexists(record):
        if not files.is_regular(record):
            problems.append(f"trial {name}: trial.json is not a regular file: not read")
        else:
            try:
                trial, trial_problems = conform_record(read_record(record, "advisor.trial/"), TRIAL)
                listed = trial.get("trace_files") or []
                problems += [f"trial {name}: trial.json: {p}" for p in trial_problems]
            except AdvisorError as exc:
                problems.append(f"trial {name}: {exc}")
    found = []
    for entry in listed:
        path = None if os.path.isabs(entry) else files.inside(root, str((folder / entry).relative_to(root)))
        if path is None:
            problems.append(f"trial {name}: trace file {entry!r} is not inside the session folder: not read")
        elif not files.is_regular(path):
            problems.append(f"trial {name}: trace file {entry!r} is not a regular file: not read")
        else:
            found.append(path)
    if listed or found:
        return found, problems
    for path in sorted(folder.glob("*.pt.trace.json*")):
        resolved = files.inside(root, str(path.relative_to(root)))
        if resolved is None:
            problems.append(f"trial {name}: {path.name} links outside the session folder: not read")
        elif not files.is_regular(resolved):
            problems.append(f"trial {name}: {path.name} is not a regular file: not read")
        else:
            found.append(resolved)
    return found, problems


def flatten(facts: dict, prefix: str = "") -> list[tuple[str, str]]:
    """Nested device facts as ('cpu.model', 'Intel ...') rows."""
    rows = []
    for key, value in facts.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            rows += flatten(value, name + ".")
        elif isinstance(value, (list, tuple)):
            rows.append((name, ", ".join(str(v) for v in value)))
        elif isinstance(value, float) or (isinstance(value, int) and key.endswith(("bytes", "memory", "mem"))):
            rows.append((name, gb(value) if key.endswith(("bytes", "memory", "mem")) else f"{value:g}"))
        else:
            rows.append((name, "n/a" if value is None else str(value)))
    return rows


def verdict(session: dict, rows: list[dict], baseline: TraceView | None) -> dict:
    """The top of the page: what held the step back, what was changed, the speed-up."""
    if baseline is not None and baseline.diagnosis.recommendations:
        top = baseline.diagnosis.recommendations[0]
        held_back = top.title
        held_back_evidence = top.evidence[0] if top.evidence else ""
    elif baseline is not None:
        d = baseline.diagnosis
        role = max(ROLES, key=lambda r: d.breakdown_us[r])
        held_back = f"{ROLE_LABELS[role]} take most of the step ({pct(d.breakdown_share[role])})"
        held_back_evidence = "the baseline trace supports no recommendation"
    else:
        held_back, held_back_evidence = "unknown: the baseline trial has no trace", ""
    kept = [r for r in rows if r.get("decision") == "kept"]
    return {"held_back": held_back, "held_back_evidence": held_back_evidence,
            "bound": baseline.bound if baseline is not None else None,
            "changes": [r["change"] or r["name"] for r in kept], "speedup": session.get("speedup"),
            "best": session.get("best"), "status": session["status"] or "unknown"}


def render_session_report(session_dir: Path) -> str:
    """The report of an optimization session folder (session.json, trials, suggested.patch)."""
    session_dir = Path(session_dir)
    session = load_session(session_dir)
    rows = session["trials"]
    unread = list(session["unread"])
    views: dict[str, TraceView | None] = {}
    for row in rows:
        traces, problems = checked_trial_traces(session_dir, row)
        unread += problems
        views[row["name"]] = None
        if traces:
            try:
                views[row["name"]] = trace_view(traces[0])
            except TraceError as exc:  # one broken trace leaves its trial without a diagnosis, not the page
                unread.append(f"trial {row['name']}: {exc}")
    labels = [r["name"] for r in rows]
    baseline = views.get(session.get("baseline") or (labels[0] if labels else ""))
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
    chart = {}
    if rows:
        chart = {
            "throughput": charts.throughput_chart(labels, [r.get("samples_per_s") for r in rows],
                                                  [r["decision"] or "?" for r in rows]),
            "breakdown": breakdown_chart([(r["name"], views[r["name"]]) for r in rows]),
            "memory": charts.memory_chart(labels, [r.get("peak_memory_bytes") for r in rows], capacity,
                                          [r.get("peak_memory_source") or "" for r in rows]),
        }
    return environment().get_template("session.html.j2").render(
        title=f"advisor report: {session['target'] or session_dir.name}",
        session=session, rows=rows, ladder=[r for r in rows if r.get("decision") in ("baseline", "kept")],
        views=views, verdict=verdict(session, rows, baseline), chart=chart, capacity=capacity,
        recommendations=session.get("recommendations") or [], patch=patch, patch_name=patch_name,
        notes=[str(n) for n in session["notes"] or []],
        device_rows=flatten(session.get("device") or {}), options=session.get("options") or {},
        command=session.get("command") or "", lint=session.get("lint") or [],
        memory_cap=memory_cap_text(session.get("memory_cap")), unread=unread,
    )


def memory_cap_text(cap: object) -> str:
    """What --memory-limit capped, in words ('' when nothing was capped or the record is not readable)."""
    if not isinstance(cap, dict) or not isinstance(cap.get("bytes"), (int, float)):
        return ""
    return (f"{cap['bytes'] / 2**30:.2f} GiB of {cap.get('what') or 'memory'} on {cap.get('device') or '?'} "
            f"({cap.get('how') or '?'})")


def write_report(target: Path, out: Path) -> Path:
    """Write the report of a session folder (if it has session.json) or of trace(s) to `out`, atomically."""
    target, out = Path(target), Path(out)
    is_session = target.is_dir() and os.path.lexists(target / "session.json")
    text = render_session_report(target) if is_session else render_trace_report(target)
    out.parent.mkdir(parents=True, exist_ok=True)
    # A reader (a browser, the session rewriting its report) never sees half a page.
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

"""Notebook display: a Diagnosis, a Trial or a Session as HTML with the report's look, in one output cell.

The markup comes from the report's own templates and partials (`_diagnosis.html.j2`,
`_recommendation.html.j2`) and figure formatting (`advisor.report.formatting`); the page stylesheet of
`base.html.j2` is reused with every selector scoped under one class, so a displayed result restyles
nothing else in the notebook. As in the report, everything taken from input is autoescaped.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from markupsafe import Markup

from advisor.analysis.analyze import diagnosis_to_dict
from advisor.files import regular_traces_in
from advisor.shapes import TRIAL, conform_record, read_record
from advisor.analysis.breakdown import ROLES
from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.job import Job
from advisor.report.formatting import ms, pct
from advisor.report.html import environment, templates_dir
from advisor.report.outcomes import split_recommendations, verdict
from advisor.report.job_view import job_view
from advisor.report.session_folder import trial_traceback, trial_traces
from advisor.report.views import figure_rows, trace_view
from advisor.report.terminal import bound_line, role_labels

SCOPE = "advisor-nb"

# Templates in the top-level templates/ folder, beside the report's (they share its partials).
_DIAGNOSIS = "notebook_diagnosis.html.j2"

_TRIAL = "notebook_trial.html.j2"

# The verdict and the ladder of session.html.j2, without the rest of the page.
_SESSION = "notebook_session.html.j2"

_JOB = "notebook_job.html.j2"  # a data-parallel job's ranks side by side (the report's _job partial)

_COMPARE = "notebook_compare.html.j2"  # two runs compared (the page of `advisor compare --html`)


# ---- the report's stylesheet, scoped to one output cell ----

def scope_css(css: str, scope: str = SCOPE) -> str:
    """Prefix every selector with `.scope`; `:root`, `html` and `body` become the scope itself."""
    out, i = [], 0
    while True:
        brace = css.find("{", i)
        if brace < 0:
            out.append(css[i:])
            return "".join(out)
        head = css[i:brace]
        if head.strip().startswith("@"):  # @media: keep the rule, scope the rules inside it
            depth, j = 1, brace + 1
            while depth and j < len(css):
                depth += {"{": 1, "}": -1}.get(css[j], 0)
                j += 1
            out.append(f"{head}{{{scope_css(css[brace + 1:j - 1], scope)}}}")
            i = j
            continue
        end = css.find("}", brace)
        selectors = [_scope_selector(s.strip(), scope) for s in head.split(",") if s.strip()]
        lead = head[: len(head) - len(head.lstrip())]
        out.append(f"{lead}{', '.join(selectors)} {css[brace:end + 1]}")
        i = end + 1


def _scope_selector(selector: str, scope: str) -> str:
    first, _, rest = selector.partition(" ")
    if first in (":root", "html", "body"):
        return f".{scope} {rest}".rstrip()
    return f".{scope} {selector}"


def scoped_css() -> str:
    """The report page's stylesheet (base.html.j2), scoped under `.advisor-nb`."""
    text = (templates_dir() / "base.html.j2").read_text()
    found = re.search(r"<style>(.*?)</style>", text, re.S)
    return scope_css(found.group(1) if found else "")


def _render(source: str, **context) -> str:
    # The stylesheet is our own template's text, not input: it is the one thing not escaped.
    return environment().get_template(source).render(scope=SCOPE, css=Markup(scoped_css()), **context)


# ---- views ----

def diagnosis_view(d: Diagnosis):
    """The report's view of one trace (figures, breakdown, hotspots), showing this Diagnosis's figures."""
    view = trace_view(Path(d.source))
    if view.diagnosis.steps != d.steps:  # the Diagnosis looked at chosen steps: show its own figures
        f = diagnosis_to_dict(d)
        shares = d.breakdown_share
        labels = role_labels(d)
        breakdown = tuple((labels[r], ms(d.breakdown_us[r] / 1000), pct(shares[r]))
                          for r in ROLES if d.breakdown_us[r] > 0)
        view = dataclasses.replace(view, diagnosis=d, figures=f, figure_rows=figure_rows(d, f),
                                   breakdown_rows=breakdown, bound=bound_line(d))
    return view


def render_diagnosis_html(d: Diagnosis) -> str:
    """One Diagnosis as the report shows it: figures, breakdown, hotspots and recommendations."""
    return _render(_DIAGNOSIS, view=diagnosis_view(d))


def render_job_html(job: Job) -> str:
    """A data-parallel job as the report shows it: ranks side by side, the straggler, the job's advice."""
    return _render(_JOB, job=job_view(job))


def render_trial_html(trial_dir: Path) -> str:
    """One trial folder: its headline figures and knob outcomes, then its diagnosis."""
    trial_dir = Path(trial_dir)
    record, _problems = conform_record(read_record(trial_dir / "trial.json", "advisor.trial/"), TRIAL)
    traces = regular_traces_in(trial_dir)
    return _render(_TRIAL, trial=record, folder=str(trial_dir), summary=record.get("summary") or {},
                   knobs={k: v for k, v in (record.get("knobs") or {}).items() if v is not None},
                   outcomes=record.get("knob_outcomes") or {},
                   view=trace_view(traces[0]) if traces else None)


def render_session_html(session_dir: Path) -> str:
    """A session's verdict and all its trials, compactly (the full page is `write_report`)."""
    from advisor.report.session_folder import load_session

    session_dir = Path(session_dir)
    session = load_session(session_dir)
    rows = session["trials"]
    unit = session.get("unit") or "samples/s"
    baseline_row = next((r for r in rows if r["name"] == session.get("baseline")), rows[0] if rows else None)
    files = trial_traces(session_dir, baseline_row) if baseline_row else []
    baseline = trace_view(files[0]) if files else None
    still_open, _refuted = split_recommendations(session.get("recommendations") or [], rows, unit)
    top = verdict(session, rows, baseline.bound if baseline is not None else None, None, still_open)
    tracebacks = {r["name"]: trial_traceback(session_dir, r) for r in rows if r.get("decision") == "failed"}
    return _render(_SESSION, session=session, rows=rows, verdict=top, unit=unit, tracebacks=tracebacks,
                   notes=[str(n) for n in session["notes"] or []], folder=str(session_dir),
                   has_report=(session_dir / "report.html").is_file())


def render_comparison_html(comparison) -> str:
    """Two runs compared (`advisor.compare`), as the page of `advisor compare --html` shows them."""
    from advisor.report.compare_view import comparison_view

    return _render(_COMPARE, view=comparison_view(comparison))

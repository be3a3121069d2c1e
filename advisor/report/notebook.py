"""Notebook display: a Diagnosis, a Trial or a Session as HTML with the report's look, in one output cell.

The markup comes from the report's own templates and partials (`_diagnosis.html.j2`,
`_recommendation.html.j2`) and figure formatting (`advisor.report.html`); the page stylesheet of
`base.html.j2` is reused with every selector scoped under one class, so a displayed result restyles
nothing else in the notebook. As in the report, everything taken from input is autoescaped.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from markupsafe import Markup

from advisor.commands import diagnosis_to_dict
from advisor.diagnosis import ROLES, Diagnosis
from advisor.report.html import (environment, figure_rows, ms, pct, templates_dir, trace_view, trial_traces,
                                 verdict)
from advisor.terminal import ROLE_LABELS

SCOPE = "advisor-nb"

_DIAGNOSIS = """\
<div class="{{ scope }}"><style>{{ css }}</style>
<h3>{{ view.label }}</h3>
{% include "_diagnosis.html.j2" %}
<h3>Recommendations</h3>
{% for rec in view.diagnosis.recommendations %}
{% include "_recommendation.html.j2" %}
{% else %}
<p>No recommendation: nothing in this trace points to a change worth making.</p>
{% endfor %}
</div>
"""

_TRIAL = """\
<div class="{{ scope }}"><style>{{ css }}</style>
<section class="card verdict">
  <h3 style="margin-top:0">Trial {{ trial.name }} <span class="decision decision-{{ 'kept' if trial.status == 'ok' else 'failed' }}">{{ trial.status }}</span></h3>
  <p class="muted">{{ trial.message }} · folder <code>{{ folder }}</code></p>
  <table class="figures">
    <tr><td>Knobs</td><td class="v">{% for k, v in knobs.items() %}<code>{{ k }}={{ v }}</code> ({{ outcomes.get(k, "?") }}){% if not loop.last %}, {% endif %}{% else %}the step's and loader's own settings{% endfor %}</td></tr>
    <tr><td>Batch size</td><td class="v">{{ summary.batch_size if summary.batch_size is not none else "n/a" }}</td></tr>
    <tr><td>Median step time</td><td class="v">{{ summary.median_step_s | seconds_ms }}</td></tr>
    <tr><td>Samples/s</td><td class="v">{{ summary.samples_per_s | num }}</td></tr>
    <tr><td>Peak memory</td><td class="v">{{ summary.peak_memory_bytes | gb }} <span class="muted">({{ summary.peak_memory_source or "n/a" }})</span></td></tr>
    <tr><td>Loss (last step)</td><td class="v">{{ summary.loss | num(4) }}</td></tr>
  </table>
</section>
{% if view is not none %}
{% include "_diagnosis.html.j2" %}
<h3>Recommendations</h3>
{% for rec in view.diagnosis.recommendations %}
{% include "_recommendation.html.j2" %}
{% else %}
<p>No recommendation: nothing in this trace points to a change worth making.</p>
{% endfor %}
{% else %}
<p class="muted">No trace for this trial.</p>
{% endif %}
</div>
"""

# The verdict and the ladder of session.html.j2, without the rest of the page.
_SESSION = """\
<div class="{{ scope }}"><style>{{ css }}</style>
<section class="card verdict">
  <h3 style="margin-top:0">Session {{ session.target }} · {{ rows | length }} trial(s) · {{ verdict.status }}</h3>
  {% if verdict.speedup is not none %}
  <div class="big{% if verdict.speedup <= 1.0 %} flat{% endif %}">×{{ "%.2f" | format(verdict.speedup) }} samples/s</div>
  {% endif %}
  <dl>
    <dt>What held the step back</dt>
    <dd><strong>{{ verdict.held_back }}</strong>{% if verdict.held_back_evidence %}: {{ verdict.held_back_evidence }}{% endif %}</dd>
    <dt>What was changed</dt>
    <dd>{% if verdict.changes %}{{ verdict.changes | join("; ") }}{% elif rows | length < 2 %}nothing was tried: the session ran the baseline only{% else %}nothing: no change measured better than the baseline{% endif %}</dd>
    <dt>Best trial</dt>
    <dd>{{ verdict.best or "baseline" }}</dd>
    {% for note in notes %}
    <dt>{% if loop.first %}Notes{% endif %}</dt>
    <dd>{{ note }}</dd>
    {% endfor %}
  </dl>
</section>
<table class="ladder">
  <tr><th class="n">#</th><th>trial</th><th>change</th><th>decision</th><th class="n">batch size</th><th class="n">peak memory</th><th class="n">step time</th><th class="n">samples/s</th><th class="n">speed-up</th></tr>
  {% for r in rows %}
  <tr><td class="n">{{ r.index }}</td><td class="trial">{{ r.name }}</td><td>{{ r.change }}</td>
      <td><span class="decision decision-{{ r.decision }}">{{ r.decision }}</span>{% if r.status != "ok" %} <span class="caveat">({{ r.status }})</span>{% endif %}</td>
      <td class="n">{{ r.batch_size if r.batch_size is not none else "n/a" }}</td>
      <td class="n">{{ r.peak_memory_bytes | gb }}</td><td class="n">{{ r.median_step_s | seconds_ms }}</td>
      <td class="n">{{ r.samples_per_s | num }}</td><td class="n">{% if r.speedup is not none %}×{{ "%.2f" | format(r.speedup) }}{% else %}n/a{% endif %}</td></tr>
  {% endfor %}
</table>
<p class="muted">Folder <code>{{ folder }}</code>{% if has_report %} · report <code>{{ folder }}/report.html</code>{% endif %}</p>
</div>
"""


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
    return environment().from_string(source).render(scope=SCOPE, css=Markup(scoped_css()), **context)


# ---- views ----

def diagnosis_view(d: Diagnosis):
    """The report's view of one trace (figures, breakdown, hotspots), showing this Diagnosis's figures."""
    view = trace_view(Path(d.source))
    if view.diagnosis.steps != d.steps:  # the Diagnosis looked at chosen steps: show its own figures
        f = diagnosis_to_dict(d)
        shares = d.breakdown_share
        breakdown = tuple((ROLE_LABELS[r], ms(d.breakdown_us[r] / 1000), pct(shares[r]))
                          for r in ROLES if d.breakdown_us[r] > 0)
        view = dataclasses.replace(view, diagnosis=d, figures=f, figure_rows=figure_rows(d, f),
                                   breakdown_rows=breakdown)
    return view


def render_diagnosis_html(d: Diagnosis) -> str:
    """One Diagnosis as the report shows it: figures, breakdown, hotspots and recommendations."""
    return _render(_DIAGNOSIS, view=diagnosis_view(d))


def render_trial_html(trial_dir: Path) -> str:
    """One trial folder: its headline figures and knob outcomes, then its diagnosis."""
    trial_dir = Path(trial_dir)
    record = json.loads((trial_dir / "trial.json").read_text())
    traces = sorted(trial_dir.glob("*.pt.trace.json*"))
    return _render(_TRIAL, trial=record, folder=str(trial_dir), summary=record.get("summary") or {},
                   knobs={k: v for k, v in (record.get("knobs") or {}).items() if v is not None},
                   outcomes=record.get("knob_outcomes") or {},
                   view=trace_view(traces[0]) if traces else None)


def render_session_html(session_dir: Path) -> str:
    """A session's verdict and all its trials, compactly (the full page is `write_report`)."""
    from advisor.report.html import load_session

    session_dir = Path(session_dir)
    session = load_session(session_dir)
    rows = session["trials"]
    baseline_row = next((r for r in rows if r["name"] == session.get("baseline")), rows[0] if rows else None)
    files = trial_traces(session_dir, baseline_row) if baseline_row else []
    baseline = trace_view(files[0]) if files else None
    return _render(_SESSION, session=session, rows=rows, verdict=verdict(session, rows, baseline),
                   notes=[str(n) for n in session["notes"] or []], folder=str(session_dir),
                   has_report=(session_dir / "report.html").is_file())

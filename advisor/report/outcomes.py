"""What a session's advice came to, for the top of the report: the verdict, each open recommendation beside
the trials that tried it, and each lint finding beside what the session measured or where it ran.

Joins of recorded fields only (a recommendation's id with the rows that tried it, a lint rule with the knob
the session measured, the session's device): every figure shown is one session.json recorded, so advice
shown after a session never contradicts what the session measured.
"""

from __future__ import annotations

from advisor.analysis.bound import BOUNDS
from advisor.knobs import COPY_KNOBS, LINT_FIXES
from advisor.report.formatting import gain

# Rows that re-measure a setting already tried (to confirm the best): not a change of their own.
REMEASURES = ("confirm",)


def changes(rows: list[dict]) -> list[dict]:
    """The rows that tried a change (not the baseline, not a re-measure of a setting already tried)."""
    return [r for r in rows if r.get("recommendation") and r["recommendation"] not in REMEASURES
            and r.get("decision") in ("kept", "reverted", "failed")]


def tried_by(rec_id: str, rows: list[dict]) -> list[dict]:
    """The rows that tried a recommendation, alone or as one half of a pair ('amp+larger-batch')."""
    return [r for r in changes(rows) if rec_id in str(r["recommendation"]).split("+")]


def outcome_text(row: dict, unit: str) -> str:
    """'AMP bf16 (02-amp-bf16): -24.9% samples/s, reverted'."""
    measured = f"{gain(row['gain'])} {unit}, " if row.get("gain") is not None else ""
    return f"{row.get('change') or row['name']} ({row['name']}): {measured}{row.get('decision')}"


def split_recommendations(recommendations: list[dict], rows: list[dict], unit: str) -> tuple[list[dict], list[dict]]:
    """(open, refuted): the open recommendations with `tried` (what the trials of it measured) added, and those
    every trial of which was reverted or failed: the session measured them, so they are shown as measured."""
    still_open, refuted = [], []
    for rec in recommendations:
        tried = tried_by(str(rec.get("id")), rows)
        entry = {**rec, "tried": [outcome_text(r, unit) for r in tried]}
        if tried and not any(r.get("decision") == "kept" for r in tried):
            refuted.append(entry)
        else:
            still_open.append(entry)
    return still_open, refuted


def lint_findings(lint: list[dict], session: dict, rows: list[dict], unit: str) -> list[dict]:
    """Each lint finding with `session_note`: what this session measured of the knob its fix sets (the patch's
    value stands over the fix's guess), or why the fix does not apply where the session ran ('' otherwise)."""
    device = str((session.get("device") or {}).get("type") or "")
    final = session.get("final_knobs") or {}
    out = []
    for finding in lint:
        knob = LINT_FIXES.get(str(finding.get("rule")))
        note = ""
        tried = [r for r in changes(rows) if knob and (r.get("knobs") or {}).get(knob) is not None]
        if knob in COPY_KNOBS and device == "cpu":
            note = ("not measured: it ran on the CPU, where batches are not copied to a device; this applies "
                    "when the script runs on CUDA")
        elif knob and final.get(knob) is not None:
            note = (f"measured: {knob}={final[knob]} was kept ({session.get('best')}); the suggested patch "
                    "sets it, use that value rather than the fix's")
        elif tried:
            note = ("measured, and not kept: "
                    + "; ".join(outcome_text(r, unit) for r in tried))
        out.append({**finding, "session_note": note})
    return out


def bound_label(name: object) -> str | None:
    """A bound's name in words, or None for none recorded."""
    return BOUNDS.get(name) if isinstance(name, str) else None


def verdict(session: dict, rows: list[dict], baseline_bound_line: str | None, job_verdict: str | None = None,
            open_recommendations: list[dict] | None = None) -> dict:
    """The top of the page: what held the baseline back, what was changed and what each change measured, what
    still binds the best trial, and the next open recommendation. A session with no measured trial says what
    failed instead (`failed`: the row of the first trial, which the page shows with its traceback)."""
    unit = session.get("unit") or "samples/s"
    base = next((r for r in rows if r["name"] == session.get("baseline")), rows[0] if rows else None)
    measured = [r for r in rows if r.get("decision") in ("baseline", "kept") and r.get("samples_per_s")]
    # The baseline's bound as the session saw it (trace and steady state), else its trace's alone (older records).
    baseline_bound = bound_label((base or {}).get("bound"))
    if job_verdict is not None:
        held_back = f"Job: {job_verdict}"
    elif baseline_bound:
        evidence = [str(e) for e in (base.get("bound_evidence") or [])]
        held_back = baseline_bound + (f" — {evidence[0]}" if evidence else "")
    elif baseline_bound_line:
        held_back = baseline_bound_line.removeprefix("Bound: ")
    else:
        held_back = "unknown: the baseline trial has no trace"
    recorded = session.get("bound") or {}
    best_row = next((r for r in rows if r["name"] == session.get("best")), None)
    now = recorded.get("label") or bound_label((best_row or {}).get("bound"))
    now_evidence = (recorded.get("evidence") or [""])[0] if recorded.get("label") else ""
    tried = changes(rows)
    return {
        "held_back": held_back,
        "changes": [outcome_text(r, unit) for r in tried if r.get("decision") == "kept"],
        "not_kept": [outcome_text(r, unit) for r in tried if r.get("decision") != "kept"],
        "now": now, "now_evidence": now_evidence,
        "next": (open_recommendations or [{}])[0].get("title") if open_recommendations else None,
        "speedup": session.get("speedup"), "best": session.get("best") if measured else None,
        "failed": base if not measured and base is not None else None,
        "status": session.get("status") or "unknown",
        "prediction_error": prediction_text(session.get("prediction_error")),
    }


def prediction_text(error: dict | None) -> str | None:
    """The session's prediction error in words: how far its predicted changes were from the measured."""
    if not error or error.get("median_abs") is None or not error.get("trials"):
        return None
    signs = error.get("sign_agreement")
    agreed = f"; the sign right in {round(signs * error['trials'])} of {error['trials']}" if signs is not None else ""
    return (f"predicted and measured changes differed by {100 * error['median_abs']:.1f} points at the median "
            f"over {error['trials']} trial(s){agreed}")

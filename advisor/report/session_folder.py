"""A session folder read as untrusted input: session.json conformed to what the report reads, and the trial
folders and trace files it names, followed only inside the session folder."""

from __future__ import annotations

import os
from pathlib import Path

from advisor import files
from advisor.errors import AdvisorError
from advisor.shapes import SESSION, TRIAL, conform_record, read_record

SESSION_SCHEMA = "advisor.session/"
# Every field a template reads, so that an older or partial session.json renders with "n/a" instead of
# failing (the templates run with StrictUndefined to catch their own mistakes).
SESSION_FIELDS = ("target", "script", "command", "cwd", "options", "status", "device", "unit", "user_values",
                  "baseline", "best", "bound", "final_knobs", "trials", "recommendations", "notes", "patch", "speedup",
                  "memory_cap", "prediction_error")
ROW_FIELDS = ("index", "name", "folder", "change", "recommendation", "knobs", "status", "decision", "reason",
              "batch_size", "median_step_s", "samples_per_s", "peak_memory_bytes", "peak_memory_source",
              "capacity_bytes", "loss", "speedup", "gain", "predicted_gain", "predicted_samples_gain", "noise",
              "interval", "tried_under", "helps_now", "bound", "bound_evidence", "outcomes", "compile")


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
RECOMMENDATION_DEFAULTS = {"id": "", "title": "(untitled)", "predicted_gain": None, "worth": None, "bound": None, "helps_now": True,
                           "helps_once": "", "knobs": {}, "evidence": [], "code_change": "", "caveat": ""}
LINT_DEFAULTS = {"file": "", "line": None, "col": None, "rule": "", "title": "", "what": "", "why": "", "fix": ""}


def trial_traceback(session_dir: Path, row: dict) -> str | None:
    """The user's traceback a failed trial recorded in its trial.json (None when there is none or the record
    cannot be read: the page then shows the row's reason alone)."""
    folder = trial_folder(session_dir, row)
    record = folder / "trial.json" if folder is not None else None
    if record is None or not files.is_regular(record):
        return None
    try:
        trial, _problems = conform_record(read_record(record, "advisor.trial/"), TRIAL)
    except AdvisorError:
        return None
    return trial.get("traceback") or None


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

    def take(path: Path | None, label: str, outside: str) -> None:
        """Keep a trace that resolves inside the session folder and is a regular file; else say why not."""
        if path is None:
            problems.append(f"trial {name}: {label} {outside} the session folder: not read")
        elif not files.is_regular(path):
            problems.append(f"trial {name}: {label} is not a regular file: not read")
        else:
            found.append(path)

    for entry in listed:
        take(None if os.path.isabs(entry) else files.inside(root, str((folder / entry).relative_to(root))),
             f"trace file {entry!r}", "is not inside")
    if listed or found:
        return found, problems
    for path in sorted(folder.glob("*.pt.trace.json*")):
        take(files.inside(root, str(path.relative_to(root))), path.name, "links outside")
    return found, problems

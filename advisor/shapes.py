"""advisor's own records (trial.json, session.json) read back as untrusted input.

A record may be hand-edited, written by an older version, or copied from anywhere. Each field a reader
relies on is checked against the shape it expects (`TRIAL`, `SESSION`); a field of another type (text
where a number goes, a list where an object goes, NaN, a negative size) is dropped from the record and
named in the problems, so that the reader shows what it can and says what it could not. Fields no shape
names pass through, with non-finite numbers dropped (they would print as 'nan'). The readers accept what
older versions wrote: NaN and Infinity literals (Python's json writes them) are read, then dropped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from advisor.errors import AdvisorError
from advisor.files import describe_os_error, read_regular
from advisor.knobs import CHOICE, DATALOADER_KNOBS, FLAG as FLAG_KNOB, KNOBS as KNOB_LIST

# Scalar shapes.
TEXT = "text"
NUMBER = "number"  # finite, not negative (sizes, times, rates)
REAL = "real"  # finite, any sign (gains, R²)
COUNT = "count"  # a whole number, not negative
FLAG = "flag"  # true or false
ANY = "any"  # anything; non-finite numbers inside are still dropped

# Beyond this no size, time or rate of a training step is real, and formatting it would print nonsense.
LARGEST = 1e18
_EXPECTED = {TEXT: "text", NUMBER: "a number from 0 to 1e18", REAL: "a number within ±1e18",
             COUNT: "a whole number from 0 to 1e18", FLAG: "true or false"}


class RecordError(AdvisorError):
    """A record file that cannot be read at all: missing, not a regular file, not JSON, not an object."""

    def __init__(self, path: object, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def read_record(path: Path | str, schema: str, what: str = "an advisor trial record") -> dict:
    """The JSON object in `path` whose "schema" starts with `schema` ('advisor.trial/'); RecordError if it
    is not one. Only regular files are opened (a FIFO is refused, not waited on)."""
    try:
        raw = read_regular(path)
    except OSError as exc:
        raise RecordError(path, describe_os_error(exc)) from None
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RecordError(path, f"not valid JSON (not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset "
                                f"{exc.start})") from None
    except ValueError as exc:
        raise RecordError(path, f"not valid JSON ({exc})") from None
    except RecursionError:
        raise RecordError(path, "not valid JSON for this reader (nested too deeply)") from None
    if not isinstance(record, dict) or not isinstance(record.get("schema"), str) \
            or not record["schema"].startswith(schema):
        raise RecordError(path, f"not {what} (no 'schema': '{schema}...')")
    return record


def conform(value, shape, where: str = "", problems: list[str] | None = None):
    """`value` with what does not fit `shape` dropped; each drop appended to `problems` as 'where: why'.

    A shape is a scalar tag (TEXT, NUMBER, REAL, COUNT, FLAG, ANY), a dict {key: shape} (the value must be
    an object; unnamed keys pass), or a one-item list [shape] (the value must be a list; items that do not
    fit are left out). Returns `_DROP` when the value itself does not fit (the caller leaves it out).
    """
    problems = [] if problems is None else problems
    if value is None:  # absent, whatever the shape: readers take null as "not recorded"
        return None
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            problems.append(f"{where or 'the record'}: {_kind(value)} where an object goes")
            return _DROP
        out = {}
        for key, item in value.items():
            fitted = conform(item, shape.get(key, ANY), f"{where}.{key}" if where else str(key), problems)
            if fitted is not _DROP:
                out[key] = fitted
        return out
    if isinstance(shape, list):
        if not isinstance(value, list):
            problems.append(f"{where}: {_kind(value)} where a list goes")
            return _DROP
        out = [conform(item, shape[0], f"{where}[{i}]", problems) for i, item in enumerate(value)]
        return [item for item in out if item is not _DROP]
    if shape == ANY:
        if isinstance(value, (dict, list)):
            return conform(value, {} if isinstance(value, dict) else [ANY], where, problems)
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{where}: {_kind(value)}, not a number")
            return _DROP
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 1e300:
            problems.append(f"{where}: a number too large to show")
            return _DROP
        return value
    if _fits(value, shape):
        return value
    problems.append(f"{where}: {_kind(value)} where {_EXPECTED[shape]} goes")
    return _DROP


class _Drop:
    def __repr__(self) -> str:
        return "<dropped>"


_DROP = _Drop()


def _fits(value, shape: str) -> bool:
    if shape == TEXT:
        return isinstance(value, str)
    if shape == FLAG:
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if shape == COUNT:
        return isinstance(value, int) and 0 <= value <= LARGEST
    # Comparisons, not math.isfinite: a Python int can be too large to convert to a float.
    return (-LARGEST if shape == REAL else 0) <= value <= LARGEST


def _kind(value) -> str:
    """How a problem names a value: 'text', 'a list', 'NaN', 'the number -3', ..."""
    if isinstance(value, str):
        return "text"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, float):
        return f"the number {value:g}"
    if isinstance(value, int):
        return f"the number {value}" if abs(value) < 10**20 else "a number of more than 20 digits"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return "null" if value is None else type(value).__name__


def conform_record(record: dict, shape: dict) -> tuple[dict, list[str]]:
    """(the record with what does not fit `shape` dropped, the problems)."""
    problems: list[str] = []
    return conform(record, shape, "", problems), problems


# ---- the shapes readers rely on ------------------------------------------------------------------------

# A knob's value as a record holds it, by what the knob takes (`advisor.knobs`).
KNOBS = {k.name: TEXT if k.kind == CHOICE else FLAG if k.kind == FLAG_KNOB else COUNT for k in KNOB_LIST}
_LOADER = {name: KNOBS[name] for name in DATALOADER_KNOBS}

# trial.json, as the analysis (diagnosis, rules, terminal, report) reads it.
TRIAL = {
    "schema": TEXT, "name": TEXT, "status": TEXT, "script": TEXT, "message": TEXT, "memory_limit": NUMBER,
    "traceback": TEXT, "error_type": TEXT,
    "knobs": KNOBS, "user_values": _LOADER, "trace_files": [TEXT],
    "windows_cut": TEXT,
    "trace_plan": {"ops_per_step": COUNT, "steps_asked": COUNT, "steps": COUNT, "light": FLAG, "reason": TEXT},
    "dataloaders": [{"effective": _LOADER, "user": _LOADER}],
    "steps": [{"wall_s": NUMBER, "call_s": NUMBER, "batch_size": COUNT}],
    "summary": {
        "samples_per_s": NUMBER, "batch_size": COUNT, "median_step_s": NUMBER, "peak_memory_bytes": NUMBER,
        "accumulation_steps": COUNT, "steps_recorded": COUNT,
        "memory_growth": {"bytes_per_step": REAL, "median_difference_bytes": REAL, "r2": REAL, "steps": COUNT,
                          "source": TEXT},
        "activations": {"checkpoint_candidates": [TEXT],
                        "by_class": [{"class": TEXT, "share": NUMBER, "count": COUNT, "bytes": NUMBER}]},
    },
    "device_facts": {"type": TEXT, "cpu": {"bf16_instructions": [TEXT], "ram_bytes": NUMBER},
                     "gpu": {"total_memory_bytes": NUMBER}},
    "attention_modules": [{"class": TEXT, "rewritable": FLAG, "why": TEXT}],
}

# One row of session.json's "trials", as the report reads it.
SESSION_ROW = {
    "index": COUNT, "name": TEXT, "folder": TEXT, "change": TEXT, "recommendation": TEXT, "knobs": KNOBS,
    "status": TEXT, "decision": TEXT, "reason": TEXT, "batch_size": COUNT, "median_step_s": NUMBER,
    "samples_per_s": NUMBER, "peak_memory_bytes": NUMBER, "peak_memory_source": TEXT, "capacity_bytes": NUMBER,
    "loss": REAL, "speedup": NUMBER, "gain": REAL, "predicted_gain": REAL, "predicted_samples_gain": REAL,
    "noise": NUMBER, "interval": [REAL], "base": TEXT,
    "tried_under": TEXT, "helps_now": FLAG, "bound": TEXT, "bound_evidence": [TEXT],
    "outcomes": {}, "compile": {"compile_s": NUMBER, "graphs": COUNT, "graph_breaks": COUNT, "break_reasons": [TEXT],
                                "pays_back_after_steps": COUNT},
}
# An open recommendation in session.json, as the report's template reads it.
SESSION_RECOMMENDATION = {"id": TEXT, "title": TEXT, "predicted_gain": REAL, "bound": TEXT, "helps_now": FLAG,
                          "helps_once": TEXT, "knobs": {}, "evidence": [TEXT], "code_change": TEXT, "caveat": TEXT}
LINT_FINDING = {"file": TEXT, "line": COUNT, "col": COUNT, "rule": TEXT, "title": TEXT, "what": TEXT, "why": TEXT,
                "fix": TEXT}
SESSION = {
    "schema": TEXT, "target": TEXT, "script": TEXT, "command": TEXT, "cwd": TEXT, "options": {}, "status": TEXT,
    "device": {}, "unit": TEXT, "bound": {"name": TEXT, "label": TEXT, "evidence": [TEXT]},
    "user_values": {}, "baseline": TEXT, "best": TEXT, "final_knobs": {}, "trials": [SESSION_ROW],
    "recommendations": [SESSION_RECOMMENDATION], "notes": [ANY], "patch": TEXT, "speedup": NUMBER,
    "speedup_basis": TEXT, "speedup_pairs": COUNT, "lint": [LINT_FINDING],
    "memory_cap": {"bytes": NUMBER, "held_bytes": NUMBER, "what": TEXT, "device": TEXT, "how": TEXT,
                   "freed_blocks_returned": FLAG},
    "prediction_error": {"trials": COUNT, "median_abs": NUMBER, "sign_agreement": NUMBER}, "graphs": {},
}

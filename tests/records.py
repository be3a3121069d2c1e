"""Session records for tests that give only the fields a test is about: the rest take neutral values, and the
whole is converted to the search's types (`advisor.search.record`), as a resumed session is."""

from __future__ import annotations

import functools
from typing import Any, Callable

import msgspec

from advisor.search.record import SCHEMA, SessionRecord, TrialRow

SESSION = {"schema": SCHEMA, "target": "train.py", "script": None, "command": "", "lint": None, "options": {},
           "status": "running", "started_at": 0.0, "updated_at": 0.0, "device": None, "user_values": {},
           "baseline": None, "best": None, "final_knobs": None, "speedup": None, "trials": [],
           "recommendations": [], "notes": [], "patch": None, "pooled": {}}
ROW = {"index": 0, "name": "", "folder": "", "change": "", "recommendation": None, "knobs": {}, "status": "ok",
       "message": "", "decision": None, "reason": "", "batch_size": None, "median_step_s": None,
       "samples_per_s": None, "peak_memory_bytes": None, "peak_memory_source": None, "capacity_bytes": None,
       "loss": None, "speedup": None, "gain": None, "predicted_gain": None, "noise": None}


def row(**fields: Any) -> TrialRow:
    """A trial row with these fields."""
    return msgspec.convert(ROW | fields, TrialRow)


def session(folder: Any = None, **fields: Any) -> SessionRecord:
    """A session record with these fields (rows given as dicts or rows), held for `folder` where one is given."""
    trials = [t if isinstance(t, TrialRow) else ROW | t for t in fields.pop("trials", [])]
    state = msgspec.convert(SESSION | fields | {"trials": [msgspec.to_builtins(t) for t in trials]}, SessionRecord)
    if folder is not None:
        state.folder = str(folder)
    return state


def record(state: SessionRecord | dict[str, Any], folder: Any = None) -> SessionRecord:
    """`state` as the search holds it: a record, or one made from the fields a test wrote as a dict."""
    if isinstance(state, SessionRecord):
        return state
    fields = {k: v for k, v in state.items() if not k.startswith("_")}  # a test's own notes beside the record
    return session(folder if folder is not None else state.get("_dir"), **fields)


def on_records(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, given a record wherever a test passes the session as its JSON (a dict with "trials")."""
    def as_held(value: Any) -> Any:
        return record(value) if isinstance(value, dict) and "trials" in value else value

    @functools.wraps(function)
    def called(*args: Any, **kwargs: Any) -> Any:
        return function(*map(as_held, args), **{k: as_held(v) for k, v in kwargs.items()})
    return called

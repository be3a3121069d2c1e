"""Where a session's wall time went: start-up, warm-up and compile, measurement, re-runs.

A new trial pays its process start, the script's set-up and the model build (start-up), its first steps
(warm-up, a compile, the profiled steps) and only then its measurement windows; a re-run (a setting
measured again: "again", the best beside a candidate, confirming the best) pays all of it once more.
From each trial's `times` (started_at, first_step_at, last_step_at, ended_at) and its window steps:

    start-up      = started_at → first_step_at, and last_step_at → ended_at (the end of the process)
    warm-up       = first_step_at → last_step_at, less the windows (wait, warm-up, compile, profiled steps)
    measurement   = the window steps' time
    re-runs       = the whole of each trial that measured a setting again

The session's wall time runs from its first trial's start to its last trial's end; what lies outside the
trials (diagnosis, the report) is `other_s`. Two trials that take their windows in turns run at once: each
second of wall time is shared equally among the trials running in it, so a trial's parts are scaled to its
share (`exclusive_times`), and the parts and `other_s` add up to the wall time exactly. Replayed trials
carry simulated times (each costs its recorded start-up and steps, and its drawn windows:
`advisor.trials.replay.surface`), so a replay reports the recorded machine's time. Pure functions over the
session record and the trials' records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from advisor.search.record import SessionRecord, TrialRow
from advisor.search.strategy import knobs_key
from advisor.trials.record import TRIAL_FILE

SHARES = ("startup_s", "warmup_s", "measurement_s", "reruns_s")


def is_rerun(row: TrialRow) -> bool:
    """Whether a row measured a setting the session had measured before."""
    return row.recommendation == "confirm" or str(row.change or "").endswith("(again)")


def row_record(out: Path, row: TrialRow) -> dict[str, Any]:
    """The trial.json of a session row's folder; {} where it cannot be read."""
    try:
        return json.loads((out / row.folder / TRIAL_FILE).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def trial_time(record: dict[str, Any]) -> dict[str, float] | None:
    """{duration_s, startup_s, warmup_s, measurement_s} of one trial; None without its start and end."""
    times = record.get("times") or {}
    start, end = times.get("started_at"), times.get("ended_at")
    if not isinstance(start, (int, float)) or not isinstance(end, (int, float)):
        return None
    duration = max(0.0, end - start)
    first, last = times.get("first_step_at"), times.get("last_step_at")
    steps = max(0.0, last - first) if isinstance(first, (int, float)) and isinstance(last, (int, float)) else 0.0
    steps = min(steps, duration)
    windows = sum(s.get("wall_s") or 0.0 for s in record.get("steps") or []
                  if isinstance(s, dict) and s.get("phase") == "window")
    windows = min(windows, steps)
    return {"duration_s": duration, "startup_s": duration - steps, "warmup_s": steps - windows,
            "measurement_s": windows}


def exclusive_times(spans: list[tuple[float, float]]) -> list[float]:
    """Each span's share of the wall time: every instant divided equally among the spans that hold it."""
    edges = sorted({edge for span in spans for edge in span})
    shares = [0.0] * len(spans)
    for a, b in zip(edges, edges[1:]):
        holding = [i for i, (start, end) in enumerate(spans) if start <= a and end >= b]
        for i in holding:
            shares[i] += (b - a) / len(holding)
    return shares


def session_time(out: Path, state: SessionRecord) -> dict[str, Any] | None:
    """The session's wall time, its shares, and the time and trials it took to first measure the setting
    it ended on (None when no trial recorded its times)."""
    out = Path(out)
    spans, shares = [], dict.fromkeys(SHARES, 0.0)
    timed: list[tuple[dict[str, Any], dict[str, float]]] = []
    ended: dict[str, float] = {}
    simulated = False
    for row in state.trials:
        record = row_record(out, row)
        own = trial_time(record)
        if own is None:
            continue
        times = record["times"]
        simulated |= bool(times.get("simulated"))
        spans.append((times["started_at"], max(times["started_at"], times["ended_at"])))
        timed.append((row, own))
        ended[row.name] = times["ended_at"]
    if not spans:
        return None
    for (row, own), exclusive in zip(timed, exclusive_times(spans)):
        scale = exclusive / own["duration_s"] if own["duration_s"] > 0 else 0.0  # its share of time run together
        if is_rerun(row):
            shares["reruns_s"] += exclusive
        else:
            for key in ("startup_s", "warmup_s", "measurement_s"):
                shares[key] += own[key] * scale
    begin = min(s for s, _ in spans)
    wall = max(e for _, e in spans) - begin
    best = next((t for t in state.trials if t.name == state.best), None)
    first = next((t for t in state.trials if best is not None and t.name in ended
                  and knobs_key(t.knobs) == knobs_key(best.knobs)), None)
    return {"wall_s": wall, **shares, "other_s": max(0.0, wall - sum(shares.values())),
            "to_best_s": ended[first.name] - begin if first else None,
            "trials_to_best": first.index + 1 if first else None, "simulated": simulated}


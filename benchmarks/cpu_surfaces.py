"""The what-if model judged on CPU truth surfaces (issue 54): surfaces recorded on this machine's kind of CPU
with `record_surface.py --knob ... --repeats 3`, each setting measured three times or more in one shuffled
order, so that a setting's own error is known (its `surface.json`).

For every pair of settings that differ in one knob by one step of its axis, four predictors of the change of
samples/s are set against the measured change (the settings' medians):

- model: the what-if model (`advisor.analysis.whatif`) from the first setting's trace, with its priors;
- calibrated: the same model corrected, as a session corrects it, by the baseline's one-knob changes (the
  script's own settings: those pairs are left out of its score);
- reference: the median measured change of the same move (knob, from, to) elsewhere on the surface;
- perfect: what a predictor that knew each setting's true rate would score against these medians (their own
  noise).

A knob the model has no transformation for is counted as "no prediction", never as +0 % (threads have one:
the step's operators on fewer or more of the cores the workers share). Floors
(issue 54), on the calibrated model: median absolute error ≤ 8 points, sign right on ≥ 85 % of the pairs whose
measured change is beyond the noise (two standard errors of the difference).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from advisor.analysis.analyze import analyze_file
from advisor.analysis.whatif import KNOB_OF, calibrate, predict, step_graph

MAX_ERROR = 0.08
MIN_SIGN = 0.85
MEDIAN_OF_HALF_NORMAL = 0.674  # the median of |x| for x ~ N(0, 1)
# Each surface's baseline: the settings the example script runs with as written (two cores: two threads).
BASELINES = {"cpu-image-classifier": {"num_workers": 0, "batch_size": 32, "uint8_copies": False, "threads": 2},
             "cpu-conv-classifier": {"amp": False, "channels_last": False, "batch_size": 32, "compile": False},
             "cpu-char-transformer": {"amp": False, "batch_size": 32, "compile": False, "fused_optimizer": False}}


@dataclass(frozen=True)
class Setting:
    """One setting of a CPU surface: the knobs of its axes, its median rate and that median's error."""

    values: tuple
    rate: float
    relative_se: float
    graph: object


def axes_of(settings: list[dict]) -> list[str]:
    """The knobs that vary across the surface, in the order the first setting names them (persistent_workers
    goes with num_workers: not an axis of its own)."""
    return [n for n in settings[0]["knobs"]
            if n != "persistent_workers" and len({json.dumps(s["knobs"].get(n)) for s in settings}) > 1]


def load(surface: Path) -> tuple[list[str], dict[tuple, Setting]]:
    """The surface's axes and its settings keyed by their values on them (each graph from its first run)."""
    doc = json.loads((surface / "surface.json").read_text())
    axes = axes_of(doc["settings"])
    out = {}
    for s in doc["settings"]:
        trace = next((surface / s["runs"][0]).glob("*.pt.trace.json*"))
        # Off/on knobs and AMP (None or its dtype) as booleans, as the model takes them; counts as they are.
        values = tuple(v if isinstance(v, int) and not isinstance(v, bool) else bool(v)
                       for v in (s["knobs"][a] for a in axes))
        out[values] = Setting(values, s["samples_per_s"], s["relative_se"] or 0.0, step_graph(analyze_file(trace)))
    return axes, out


def pairs_of(axes: list[str], settings: dict[tuple, Setting]) -> list[tuple[tuple, tuple, str]]:
    """(from, to, knob): settings that differ in one knob by one step of its axis, both ways."""
    ladders = {i: sorted({v[i] for v in settings}) for i in range(len(axes))}
    out = []
    for a in settings:
        for i, knob in enumerate(axes):
            j = ladders[i].index(a[i])
            for step in (-1, 1):
                if 0 <= j + step < len(ladders[i]):
                    b = a[:i] + (ladders[i][j + step],) + a[i + 1:]
                    if b in settings:
                        out.append((a, b, knob))
    return out


def model_change(graph: object, knob: str, value: object, params: dict | None = None) -> float | None:
    """The model's change of samples/s, or None where it has no transformation for the knob."""
    if knob not in KNOB_OF or graph is None:
        return None
    return predict(graph, {knob: value}, params)


def scores(rows: list[tuple[float, float, float]]) -> tuple[int, float | None, float | None]:
    """(pairs, median absolute error, sign right over the pairs beyond the noise) of (predicted, measured,
    noise) rows."""
    if not rows:
        return 0, None, None
    decisive = [(p > 0) == (m > 0) for p, m, n in rows if abs(m) > n]
    return (len(rows), statistics.median(abs(p - m) for p, m, _ in rows),
            sum(decisive) / len(decisive) if decisive else None)


def cell(s: tuple) -> str:
    n, err, sign = s
    if not n:
        return f"{'no prediction':>20}"
    return f"{n:3d} {100 * err:5.1f} pt {'—' if sign is None else f'{100 * sign:3.0f}%':>5}"


def print_table(tables: dict[str, dict[str, list]], knobs: list[str] | tuple[str, ...], render, name_width: int,
                cell_width: int) -> None:
    """A line per knob, then "all": each predictor's rows for it as `render` gives them."""
    print(f"  {'knob':<{name_width}}" + "".join(f"{name:>{cell_width}}" for name in tables))
    for knob in (*knobs, "all"):
        cells = [render([r for rs in table.values() for r in rs] if knob == "all" else table.get(knob, []))
                 for table in tables.values()]
        print(f"  {knob:<{name_width}}" + "".join(f"  {c}" for c in cells))


def evaluate(surface: Path) -> bool:
    """Print one CPU surface's table by knob and its floors; whether the calibrated model meets them."""
    axes, settings = load(surface)
    pairs = pairs_of(axes, settings)
    base_values = BASELINES.get(surface.name, {})
    baseline = tuple(base_values.get(a, min(v[i] for v in settings)) for i, a in enumerate(axes))
    truth = {(a, b): settings[b].rate / settings[a].rate - 1 for a, b, _ in pairs}
    # Two standard errors of the measured change, from the two medians' own errors.
    noise = {(a, b): 2 * (1 + truth[(a, b)]) * math.hypot(settings[a].relative_se, settings[b].relative_se)
             for a, b, _ in pairs}
    first = [(a, b, k) for a, b, k in pairs if a == baseline and k in KNOB_OF]
    params = calibrate([(settings[a].graph, {k: b[axes.index(k)]}, truth[(a, b)]) for a, b, k in first])
    tables: dict[str, dict[str, list]] = {"model": {}, "calibrated": {}, "reference": {}, "perfect": {}}
    for a, b, knob in pairs:
        i = axes.index(knob)
        measured, n = truth[(a, b)], noise[(a, b)]
        row = lambda p: (p, measured, n)  # noqa: E731
        predicted = model_change(settings[a].graph, knob, b[i])
        if predicted is not None:
            tables["model"].setdefault(knob, []).append(row(predicted))
            if a != baseline:
                tables["calibrated"].setdefault(knob, []).append(row(model_change(settings[a].graph, knob, b[i],
                                                                                  params)))
        rest = [truth[(x, y)] for x, y, k in pairs if k == knob and (x[i], y[i]) == (a[i], b[i]) and (x, y) != (a, b)]
        tables["reference"].setdefault(knob, []).append(row(statistics.median(rest or [0.0])))
        tables["perfect"].setdefault(knob, []).append((measured + MEDIAN_OF_HALF_NORMAL * n / 2, measured, n))
    floor = statistics.median(s.relative_se for s in settings.values())
    print(f"prediction quality ({surface.name}: {len(settings)} settings, {len(pairs)} one-knob pairs; a setting's "
          f"median known to ±{100 * floor:.1f}%; calibrated from the baseline's {len(first)} pairs: "
          + ", ".join(f"{k} {v:.3g}" for k, v in sorted(params.items())) + ")")
    print("  each cell: pairs, median |predicted − measured| in points, sign right beyond the noise")
    print_table(tables, axes, lambda rows: cell(scores(rows)), 14, 22)
    _, err, sign = scores([r for rs in tables["calibrated"].values() for r in rs])
    ok = err is not None and err <= MAX_ERROR and sign is not None and sign >= MIN_SIGN
    print(f"  floor (calibrated): median error {100 * (err or 0):.1f} pt (≤ {100 * MAX_ERROR:.0f}), sign beyond the "
          f"noise {100 * (sign or 0):.0f}% (≥ {100 * MIN_SIGN:.0f}%): " + ("met" if ok else "MISSED"))
    return ok

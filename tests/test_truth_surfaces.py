"""The CPU truth surfaces (issue 54): how `benchmarks/record_surface.py` names and summarises a grid of any
knobs with repeats, that each recorded surface's `surface.json` says what its runs measured, and how
`benchmarks/cpu_surfaces.py` pairs its settings and leaves a knob without a transformation unpredicted."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from advisor.trials.knobs import Knobs
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import cpu_surfaces  # noqa: E402
from record_surface import knob_axis, knob_points, summarize  # noqa: E402

SURFACES = sorted(p.parent for p in (ROOT / "tests" / "data" / "surfaces").glob("cpu-*/surface.json"))


def test_knob_axes_are_typed_as_the_knobs_and_name_their_settings():
    assert knob_axis("num_workers=0,2") == ("num_workers", [0, 2])
    assert knob_axis("uint8_copies=off,on") == ("uint8_copies", [False, True])
    assert knob_axis("amp=off,bf16") == ("amp", [None, "bf16"])
    with pytest.raises(SystemExit, match="--knob warp=1: expected NAME=V1,V2"):
        knob_axis("warp=1")
    points = knob_points([("num_workers", [0, 2]), ("amp", [None, "bf16"])])
    assert [name for name, _ in points] == ["num_workers=0-amp=off", "num_workers=0-amp=bf16",
                                            "num_workers=2-amp=off", "num_workers=2-amp=bf16"]
    assert points[3][1] == Knobs(num_workers=2, amp="bf16", persistent_workers=True)


def test_the_summary_is_each_settings_median_and_the_noise_floor_its_median_error(tmp_path):
    for folder, rate in (("a-r1", 100.0), ("a-r2", 104.0), ("a-r3", 98.0), ("b-r1", 50.0)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "trial.json").write_text(json.dumps(
            {"status": "ok", "knobs": {"threads": 1}, "summary": {"samples_per_s": rate}}))
    floor = summarize(tmp_path, {"a": ["a-r1", "a-r2", "a-r3", "a-r4"], "b": ["b-r1"], "c": ["c-r1"]})
    doc = json.loads((tmp_path / "surface.json").read_text())
    a, b = doc["settings"]  # c never ran: left out
    assert a["runs"] == ["a-r1", "a-r2", "a-r3"]  # a-r4 stopped by a deadline: no folder to serve
    assert (a["samples_per_s"], a["run_samples_per_s"], b["relative_sd"]) == (100.0, [100.0, 104.0, 98.0], None)
    assert floor == doc["noise_floor"] == pytest.approx(statistics.stdev([100, 104, 98]) / 100 / 3 ** 0.5)


@pytest.mark.parametrize("surface", SURFACES, ids=[s.name for s in SURFACES])
def test_a_recorded_surface_says_what_its_runs_measured(surface):
    doc = json.loads((surface / "surface.json").read_text())
    assert doc["noise_floor"] < 0.05
    for setting in doc["settings"]:
        assert len(setting["runs"]) >= 3
        records = [json.loads((surface / run / "trial.json").read_text()) for run in setting["runs"]]
        assert all(r["status"] == "ok" and r["knobs"] == setting["knobs"] for r in records)
        rates = [r["summary"]["samples_per_s"] for r in records]
        assert setting["samples_per_s"] == statistics.median(rates)
        assert list(Path(surface / setting["runs"][0]).glob("*.pt.trace.json*"))  # the model reads this one


@pytest.mark.parametrize("surface", SURFACES, ids=[s.name for s in SURFACES])
def test_pairs_differ_in_one_knob_and_a_knob_without_a_transformation_has_no_prediction(surface):
    axes, settings = cpu_surfaces.load(surface)
    pairs = cpu_surfaces.pairs_of(axes, settings)
    assert pairs and all(sum(x != y for x, y in zip(a, b)) == 1 and a[axes.index(k)] != b[axes.index(k)]
                         for a, b, k in pairs)
    some = next(iter(settings.values()))
    assert cpu_surfaces.model_change(some.graph, "tf32", True) is None  # no transformation: not +0 %
    assert isinstance(cpu_surfaces.model_change(some.graph, "threads", 1), float)  # the cores' share: a price


def surface_runs(surface: Path) -> dict:
    """Each setting of a CPU truth surface: its runs' measurements by run number (each run a process of its own)."""
    from advisor.trials.record.measurement import measure

    runs: dict[str, dict] = {}
    for record in sorted(surface.glob("*/trial.json")):
        setting, run = record.parent.name.rsplit("-r", 1)
        runs.setdefault(setting, {})[int(run)] = measure([json.loads(record.read_text())["steps"]])
    return runs


def test_the_prior_spread_between_processes_is_the_truth_surfaces_own():
    """`draws.PRIOR`, how far a setting's level moves from one process to the next beyond its windows' noise, is
    the median of what the CPU truth surfaces measured (each setting in three processes), by the estimator the
    session uses on its own runs; and each surface's is beyond what its windows alone say (the draws are real)."""
    from advisor.search import draws
    from advisor.trials.record.measurement import Measurement

    spreads, within = [], []
    for surface in SURFACES:
        runs = surface_runs(surface)
        assert all(sorted(r) == [1, 2, 3] for r in runs.values()), surface
        spreads.append(draws.process_spread([list(r.values()) for r in runs.values()], prior_pairs=0))
        within.append(statistics.median(m.relative_se for r in runs.values() for m in r.values()))
    assert all(s > w for s, w in zip(spreads, within)), (spreads, within)
    assert draws.PRIOR == pytest.approx(statistics.median(spreads), abs=0.005), spreads
    # With no runs of its own, a session's estimate is the prior; runs of one setting that agree pull it down.
    assert draws.process_spread([]) == draws.PRIOR
    steady = [[Measurement(rate, 0.002, (), 50, 5.0, "windows", None) for rate in (100.0, 100.2, 99.9)]] * 8
    assert draws.process_spread(steady) < draws.PRIOR / 2


def test_one_run_of_each_of_two_settings_reads_within_the_width_the_session_says():
    """The note beside a claimed speedup (`draws.run_to_run_width`): on each CPU truth surface, every two settings'
    speedup read from their first two processes each, with the spread those processes give, and then one more run
    of each timed against the other as a user would: the user's ratio falls within the width in most pairs (about
    95 % for a normal; these draws' tails are heavier). The windows' own noise in its place would be overconfident."""
    import itertools
    import math

    from advisor.search import draws

    for surface in SURFACES:
        runs = surface_runs(surface)
        # How far the user's run of each (the third) reads from the claim off the first two of each, in log terms.
        misses = [abs(math.log(b[3].samples_per_s / a[3].samples_per_s * (a[1].samples_per_s + a[2].samples_per_s)
                               / (b[1].samples_per_s + b[2].samples_per_s)))
                  for a, b in itertools.permutations(runs.values(), 2)]

        def inside(width: float) -> float:
            return sum(miss <= math.log(1 + width) for miss in misses) / len(misses)

        spread = draws.process_spread([[r[1], r[2]] for r in runs.values()])
        assert inside(draws.run_to_run_width(spread, 2, 2)) >= 0.85, (surface.name, spread)
        windows = statistics.median(m.relative_se for r in runs.values() for m in r.values())
        assert inside(draws.run_to_run_width(windows, 2, 2)) < 0.85, (surface.name, windows)

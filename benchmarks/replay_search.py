"""Benchmark: the search replayed on response surfaces, under noise and drift, thirty seeds a case.

Surfaces: those in `tests/data/surfaces/` (two recorded on a real H100, two on an H200; three CPU truth
surfaces, each setting recorded three times, judged by each setting's median, where the search also turns
threads, 8-bit copies, channels_last, compile and a fused optimizer) and those of
`benchmarks/pair_surfaces.py` (real trial folders with set throughputs): two where two knobs pay only
together (pinned copies × workers, bf16 × batch), one whose best needs four changes together (bf16, batch,
workers, pinned copies, from a step the loader and the training thread each partly bind), and the same with
a tenth of its settings removed, so that trials there fail. Each is replayed with
`ReplayRunner(noise=S, seed=N, drift=D)`: every served trial's steady-state windows are drawn around the
setting's recorded samples/s (the median of its runs, the figure found/best judges by) with relative spread S,
so each measurement (re-measures included) carries its
own noise; with drift, a load that comes and goes (`advisor.trials.replay.load_drift`: spells of about 20
simulated seconds, each quiet or slowing every step by up to 1 + D times). The budget is a third of the
surface's points. Found/best is the recorded samples/s of the setting the session ends on over the
surface's best.

Each replayed trial costs its recorded start-up and steps and its drawn windows on a simulated clock: the
wall time to the best (when the setting the session ends on was first measured) is printed beside the
trials, and how far the speedup the session reports is from the surface's own (found over the baseline's).

Floors: at 10% spread, with and without drift, on every surface (the one with holes and the ridge included),
the median found/best ≥ 0.97 and the worst of the seeds ≥ 0.85; at 15%, with and without drift, the
median ≥ 0.90; every session within its budget (a third of the surface's points; the ridge's 19 trials).
Each line also counts the levers the trace pointed at that sessions left unmeasured when the budget ended.

With `--draws D` every case is replayed with each served trial a process of its own, its level drawn with
relative spread D about its setting's (`ReplayRunner(draws=D)`; 0.055 is what the CPU truth surfaces measured
between processes, `advisor.search.draws.PRIOR`): how the search holds when no trial's windows show that spread.
The floors are the same; docs/benchmarks.md gives the figures.

    .venv/bin/python benchmarks/replay_search.py [--seeds 30] [--jobs 2] [--draws D] [SURFACE_DIR | BUILT_NAME ...]
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from advisor.search.session import run_session  # noqa: E402
from advisor.search.state import SessionOptions, document  # noqa: E402
from advisor.search.strategy import surface_space  # noqa: E402
from advisor.trials.replay.surface import ReplayRunner, load_surface  # noqa: E402
from pair_surfaces import BUDGETS, SURFACES as BUILT, build_surface  # noqa: E402

SURFACES = ROOT / "tests" / "data" / "surfaces"
DRIFT = 1.0  # a load that slows each step up to twice, half of the time
# (spread, drift) → (median, minimum) of found/best; (0, None) once, as a check that needs no seeds.
CASES = {(0.0, None): None, (0.10, None): (0.97, 0.85), (0.10, DRIFT): (0.97, 0.85),
         (0.15, None): (0.90, 0.0), (0.15, DRIFT): (0.90, 0.0)}


def recorded_sps(folder: Path) -> float:
    """The samples/s a recorded trial stands for: on a surface that measured each setting several times
    (`record_surface.py --repeats`, its surface.json), the setting's median; else what the trial measured."""
    medians = setting_medians(folder.parent)
    if medians:
        return medians[folder.name]
    return json.loads((folder / "trial.json").read_text())["summary"]["samples_per_s"] or 0.0


@functools.cache
def setting_medians(surface: Path) -> dict[str, float]:
    """Each run folder's setting median from a surface's surface.json (read once a surface); {} without one."""
    summary = surface / "surface.json"
    if not summary.exists():
        return {}
    return {run: s["samples_per_s"] for s in json.loads(summary.read_text())["settings"] for run in s["runs"]}


def budget_of(surface: Path, points: list) -> int:
    """The trials a session has on a surface: a third of its points, or the budget its built surface names."""
    return BUDGETS.get(surface.name, len(points) // 3)


def one_session(surface: Path, points: list, noise: float, seed: int, tmp: Path,
                drift: float | None = None, draws: float | None = None) -> tuple[float, int, dict]:
    """(recorded samples/s of the setting found, trials, the session's time record) of one replayed session."""
    out = tmp / f"s-{noise}-{drift}-{draws}-{seed}"
    state = run_session(f"{surface.resolve()}:replay", out, SessionOptions(max_trials=budget_of(surface, points)),
                        runner=ReplayRunner(points, out, noise, seed, drift, draws), script=False,
                        space=surface_space(points), extra={"replay": str(surface.resolve())}, log=lambda m: None,
                        outputs=False)  # the decisions alone: no report, no TensorBoard runs
    state = document(state)  # the record as session.json holds it
    best = next(t for t in state["trials"] if t["name"] == state["best"])
    served = json.loads((out / best["folder"] / "trial.json").read_text()).get("replayed_from")
    found = recorded_sps(Path(served)) if served else 0.0
    base = json.loads((out / state["trials"][0]["folder"] / "trial.json").read_text()).get("replayed_from")
    time = dict(state.get("time") or {}, unmeasured=len(state.get("unmeasured") or []))
    if state.get("speedup") and base and found:  # the speedup it reports against the surface's own
        time["speedup_error"] = state["speedup"] / (found / recorded_sps(Path(base))) - 1
    return found, len(state["trials"]), time


def _session(job: tuple) -> tuple[float, int, dict]:
    surface, noise, seed, drift, tmp, draws = job
    return one_session(surface, load_surface(surface), noise, seed, tmp, drift, draws)


def case_line(runs: list, best: float, budget: int, floor: tuple[float, float] | None) -> tuple[bool, str]:
    """Whether the runs meet the floor, and their figures in one line."""
    ratios = [found / best for found, _, _ in runs]
    trials = [n for _, n, _ in runs]
    median, low = statistics.median(ratios), min(ratios)
    met = (floor is None or (median >= floor[0] and low >= floor[1])) and max(trials) <= budget
    to_best = [t.get("to_best_s") for _, _, t in runs if t.get("to_best_s") is not None]
    walls = [t.get("wall_s") for _, _, t in runs if t.get("wall_s") is not None]
    reached = [t.get("trials_to_best") for _, _, t in runs if t.get("trials_to_best") is not None]
    timing = (f"; best after median {statistics.median(to_best):.0f} s and {statistics.median(reached):g} trials, "
              f"of {statistics.median(walls):.0f} s" if to_best and walls and reached else "")
    errors = [abs(t["speedup_error"]) for _, _, t in runs if t.get("speedup_error") is not None]
    speedup = (f"; speedup off the surface's by median {100 * statistics.median(errors):.0f}%, "
               f"at most {100 * max(errors):.0f}%" if errors else "")
    left = sum(t.get("unmeasured", 0) for _, _, t in runs)
    return met, (f"found/best min {low:.3f} median {median:.3f}; trials min {min(trials)} median "
                 f"{statistics.median(trials):g} max {max(trials)}{timing}{speedup}; levers left unmeasured {left}"
                 f"{'' if met else '   BELOW THE FLOOR'}")


def bench(surface: Path, tmp: Path, seeds: int, pool, draws: float | None = None) -> bool:
    """Every case and seed on one surface; whether it meets the floors."""
    points = load_surface(surface)
    best = max(recorded_sps(p.folder) for p in points)
    budget = budget_of(surface, points)
    print(f"{surface.name}: {len(points)} points, best {best:.0f} samples/s, budget {budget} trials"
          + (f", each trial's level drawn with spread {100 * draws:.1f}%" if draws else ""), flush=True)
    ok = True
    for (noise, drift), floor in CASES.items():
        jobs = [(surface, noise, seed, drift, tmp, draws) for seed in range(seeds if noise else 1)]
        met, line = case_line(pool.map(_session, jobs), best, budget, floor)
        ok &= met
        print(f"  spread {100 * noise:4.1f}%{f' + drift {drift:g}' if drift else '          '}: {line}", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--draws", type=float, default=None, metavar="D",
                        help="each served trial's level drawn about its setting's with relative spread D (0.055)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("surfaces", nargs="*", help="surface folders, or names of pair_surfaces.py's (default: all of both)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, multiprocessing.Pool(args.jobs) as pool:
        tmp = Path(tmp)
        named = [a for a in args.surfaces if a in BUILT]  # a built surface by its name
        recorded = ([Path(a) for a in args.surfaces if a not in BUILT] if args.surfaces
                    else sorted(p for p in SURFACES.iterdir() if p.is_dir()))
        built = [build_surface(name, tmp / name)[0] for name in (named if args.surfaces else BUILT)]
        results = [bench(s, tmp / f"runs-{i}", args.seeds, pool, args.draws) for i, s in enumerate(recorded + built)]
    ok = all(results)
    print(f"{'PASS' if ok else 'FAIL'}: at 10% spread, with and without drift {DRIFT:g}, median ≥ 0.97 and min ≥ "
          "0.85; at 15%, with and without drift, median ≥ 0.90; each session within a third of the points")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

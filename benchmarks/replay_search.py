"""Benchmark: the search replayed on a response surface recorded on a real H100.

`tests/data/surfaces/h100-image-classifier/` holds 52 trials of examples/image_classifier.py at every
point of AMP × batch × workers × pinned copies. The session runs against it (each trial served from the
recording) with a budget of a third of its points. Floor (issue 12): the best the search finds reaches
at least 80% of the surface's best recorded samples/s, with at most a third of its points.

    .venv/bin/python benchmarks/replay_search.py [SURFACE_DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from advisor.trials.replay import ReplayRunner, load_surface  # noqa: E402
from advisor.search.strategy import surface_space  # noqa: E402
from advisor.search.session import run_session  # noqa: E402
from advisor.search.state import SessionOptions

SURFACE = ROOT / "tests" / "data" / "surfaces" / "h100-image-classifier"


def recorded_sps(folder: Path) -> float:
    """The samples/s a recorded trial measured."""
    return json.loads((folder / "trial.json").read_text())["summary"]["samples_per_s"] or 0.0


def main() -> int:
    surface = Path(sys.argv[1]) if len(sys.argv) > 1 else SURFACE
    points = load_surface(surface)
    best_point = max(points, key=lambda p: recorded_sps(p.folder))
    budget = len(points) // 3
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "replay"
        state = run_session(f"{surface.resolve()}:replay", out, SessionOptions(max_trials=budget),
                            runner=ReplayRunner(points, out), script=False, space=surface_space(points),
                            extra={"replay": str(surface.resolve())}, log=lambda m: print("  " + m, flush=True))
        best = next(t for t in state["trials"] if t["name"] == state["best"])
        found = recorded_sps(out / best["folder"])
    ratio, trials = found / recorded_sps(best_point.folder), len(state["trials"])
    print(f"replay ({surface.name}, {len(points)} points, budget {budget} trials)")
    print(f"  surface best : {best_point.folder.name} {recorded_sps(best_point.folder):.0f} samples/s")
    print(f"  found best   : {best['change']} → {best['name']} {found:.0f} samples/s, after {trials} trials")
    print(f"  found/best {ratio:.3f}; trials {trials}/{len(points)} = {trials / len(points):.2f}")
    ok = ratio >= 0.8 and trials <= len(points) / 3
    print(f"  {'PASS' if ok else 'FAIL'}: at least 80% of the surface's best with at most a third of its points")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

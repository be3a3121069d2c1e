"""Benchmark: how close a session's own predictions come to what its trials measured, surface by surface.

Each surface of `replay_search` is replayed once with no noise (every served trial reads its setting's recorded
samples/s), and every trial that measured a predicted change is scored: |predicted − measured| in points of
samples/s, and whether the sign is right. The recording's own noise decides what a sign is: a change within
twice the standard error of the difference of the two settings' recordings (`measurement.noise`, from their
recorded steps or windows) has no sign to get wrong; beyond it, a prediction of no change (within ±0.5%) counts
as wrong. Floors (issue 66) on the surfaces recorded as they are (each point's trace is that setting's own):
median error ≤ 10 points and sign right ≥ 85% on each. The built surfaces of `pair_surfaces` (a recorded trace
lent to a setting whose throughput is set) are printed beside them without a floor: their traces do not show
the step their throughput stands for, so no model reading the trace can be judged there.

    .venv/bin/python benchmarks/session_predictions.py [SURFACE_DIR | BUILT_NAME ...]
"""

from __future__ import annotations

import json
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
from advisor.trials.replay.surface import ReplayRunner, load_surface, settings_of  # noqa: E402
from advisor.trials.record.measurement import measure, noise  # noqa: E402
from pair_surfaces import SURFACES as BUILT, build_surface  # noqa: E402
from replay_search import SURFACES, budget_of  # noqa: E402

FLOOR_ERROR = 0.10
FLOOR_SIGN = 0.85
FLAT = 0.005  # a prediction within ±0.5% says "no change"


def recording(points: list, settings: tuple):
    """The pooled measurement of every recording of one setting (None where the surface has none)."""
    runs = [json.loads((p.folder / "trial.json").read_text()).get("steps") or [] for p in points
            if p.settings == settings]
    return measure(runs) if runs else None


def scored_trials(surface: Path, out: Path) -> list[dict]:
    """Each predicted trial of a noise-free replayed session: name, predicted, measured, the recording's noise."""
    points = load_surface(surface)
    runner = ReplayRunner(points, out, 0.0, 0, None)
    state = run_session(f"{surface.resolve()}:replay", out, SessionOptions(max_trials=budget_of(surface, points)),
                        runner=runner, script=False, space=surface_space(points),
                        extra={"replay": str(surface.resolve())}, log=lambda m: None, outputs=False)
    state = document(state)  # the record as session.json holds it
    rows = {t["name"]: t for t in state["trials"]}
    user = state.get("user_values") or {}
    scored = []
    for t in state["trials"]:
        base = rows.get(t.get("base"))
        if t.get("predicted_samples_gain") is None or t.get("gain") is None or base is None \
                or t.get("recommendation") == "confirm" or t.get("decision") == "not applicable":
            continue
        a, b = recording(points, settings_of(base["knobs"], user)), recording(points, settings_of(t["knobs"], user))
        scored.append({"name": t["name"], "predicted": t["predicted_samples_gain"], "measured": t["gain"],
                       "noise": noise(a, b) if a and b else 0.0})
    return scored


def sign_right(row: dict) -> bool:
    """Whether a prediction's sign is right, beyond the recording's noise (within it, any sign is)."""
    p, m = row["predicted"], row["measured"]
    if abs(m) <= row["noise"]:
        return True
    return abs(p) >= FLAT and (p > 0) == (m > 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    tmp = Path(tempfile.mkdtemp(prefix="session-predictions-"))
    recorded = sorted(p for p in SURFACES.iterdir() if p.is_dir())
    chosen = [(s, True) for s in recorded] + [(build_surface(n, tmp / n)[0], False) for n in BUILT]
    if argv:
        # A surface named by its folder's name or its path; one that names none is an error, not a vacuous "met".
        def names(surface: Path, arg: str) -> bool:
            return surface.name == arg or surface.resolve() == Path(arg).resolve()
        unknown = [a for a in argv if not any(names(s, a) for s, _ in chosen)]
        if unknown:
            print(f"session_predictions: {unknown[0]}: not a surface of tests/data/surfaces or pair_surfaces "
                  f"({', '.join(s.name for s, _ in chosen)})", file=sys.stderr)
            return 2
        chosen = [(s, r) for s, r in chosen if any(names(s, a) for a in argv)]
    met = True
    print("session predictions (each surface replayed once with no noise): trials, median |predicted − measured|,"
          " sign right beyond the recording's noise")
    for surface, floored in chosen:
        rows = scored_trials(surface, tmp / f"session-{surface.name}")
        if not rows:
            print(f"  {surface.name:30s} no predicted trials")
            continue
        err = statistics.median(abs(r["predicted"] - r["measured"]) for r in rows)
        beyond = statistics.median(max(0.0, abs(r["predicted"] - r["measured"]) - r["noise"]) for r in rows)
        right = sum(map(sign_right, rows)) / len(rows)
        ok = beyond <= FLOOR_ERROR and right >= FLOOR_SIGN
        met &= ok or not floored
        verdict = ("met" if ok else "MISSED") if floored else "no floor (built surface)"
        print(f"  {surface.name:30s} {len(rows):2d} trials, median error {100 * err:5.1f} pt ({100 * beyond:4.1f} pt "
              f"beyond the recording's noise), sign right {100 * right:3.0f}%: {verdict}")
        for r in rows:
            print(f"      {r['name']:40s} predicted {100 * r['predicted']:+7.1f}%  measured {100 * r['measured']:+7.1f}%"
                  f"  (noise ±{100 * r['noise']:.1f}%){'' if sign_right(r) else '  sign wrong'}")
    print(f"  floor: median error beyond the noise ≤ {100 * FLOOR_ERROR:.0f} pt and sign right ≥ {100 * FLOOR_SIGN:.0f}% on each recorded "
          f"surface: " + ("met" if met else "MISSED"))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())

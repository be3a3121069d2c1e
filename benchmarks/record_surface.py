"""Record a response surface: real trials of one training step at every point of a knob grid.

Each point is a trial folder (trial.json + its trace) named `AMP-bBATCH-wWORKERS-pin|pageable`, measured
as a session measures (profiled steps, then steady-state windows). `advisor profile --replay DIR` then
runs a session against the surface, offline; `--no-session` skips the session this script runs at the
end on the same machine (the search against the grid it just measured, for comparison).

    .venv/bin/python benchmarks/record_surface.py examples/image_classifier.py:train_step --out surfaces/mine \\
        --amp fp32,bf16 --batch 32,64,128 --workers 0,2,4,8,14 --copies pageable,pinned [-- script args]

Points already recorded in DIR are kept (a stopped recording resumes). On a GPU machine, record with
`--device cuda`; `--copies pinned` (pin_memory with non_blocking copies) applies only there.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from advisor.trials.knobs import Knobs  # noqa: E402
from advisor.trials.record import TRIAL_FILE
from advisor.trials.process.runner import run_trial  # noqa: E402


def point_name(amp: str, batch: int, workers: int, copies: str) -> str:
    """The folder name of one grid point."""
    return f"{amp}-b{batch}-w{workers}-{'pin' if copies == 'pinned' else 'pageable'}"


def point_knobs(amp: str, batch: int, workers: int, copies: str) -> Knobs:
    """The knobs of one grid point (every knob set explicitly, so the surface says what each point ran)."""
    pinned = copies == "pinned"
    return Knobs(amp=None if amp == "fp32" else amp, batch_size=batch, num_workers=workers, pin_memory=pinned,
                 non_blocking=pinned, persistent_workers=True if workers else None)


def values(text: str, kind=str) -> list:
    return [kind(v) for v in text.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    script_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="script.py:train_step")
    parser.add_argument("--out", required=True, help="the surface folder")
    parser.add_argument("--amp", default="fp32,bf16")
    parser.add_argument("--batch", default="32,64,128")
    parser.add_argument("--workers", default="0,2,4")
    parser.add_argument("--copies", default="pageable", help="pageable,pinned")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--window", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--no-session", action="store_true", help="record only; run no session afterwards")
    parser.add_argument("--order", default="shuffled", choices=("shuffled", "grid"),
                        help="shuffled (a fixed seed, so a resumed recording goes on in the same order): a machine "
                             "that drifts while recording does not line up with the grid's outer knob")
    parser.add_argument("--deadline", type=float, default=None,
                        help="start no new point after this many seconds (a lent machine's command has a limit; "
                             "a later run resumes)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    grid = list(itertools.product(values(args.amp), values(args.batch, int), values(args.workers, int),
                                  values(args.copies)))
    if args.order == "shuffled":
        random.Random(0).shuffle(grid)
    begun = time.monotonic()
    for point in grid:
        name = point_name(*point)
        if (out / name / TRIAL_FILE).exists():
            print(f"{name}: recorded already", flush=True)
            continue
        if args.deadline is not None and time.monotonic() - begun > args.deadline:
            print(f"{name}: not started, past the deadline of {args.deadline:g} s", flush=True)
            continue
        started = time.monotonic()
        result = run_trial(args.target, point_knobs(*point), out / name, name=name, steps=args.steps,
                           device=args.device, script_args=script_args, timeout_s=args.timeout,
                           windows=args.windows, window_s=args.window)
        figure = f"{result.samples_per_s:.0f} samples/s" if result.samples_per_s else result.status
        print(f"{name}: {figure} ({time.monotonic() - started:.1f} s)", flush=True)
    if args.no_session:
        return 0
    from advisor.search.strategy import surface_space
    from advisor.trials.process.replay import ReplayRunner, load_surface
    from advisor.search.session import run_session
    from advisor.search.state import SessionOptions

    points = load_surface(out)
    session = out.with_name(out.name + "-replayed")
    state = run_session(f"{out.resolve()}:replay", session, SessionOptions(max_trials=max(2, len(points) // 3)),
                        runner=ReplayRunner(points, session.resolve()), script=False, space=surface_space(points),
                        extra={"replay": str(out.resolve())}, log=lambda m: print("  " + m, flush=True))
    print(f"replayed session: {session} (best {state['best']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

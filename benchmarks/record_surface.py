"""Record a response surface: real trials of one training step at every point of a knob grid.

Each point is a trial folder (trial.json + its trace) named `AMP-bBATCH-wWORKERS-pin|pageable`, measured
as a session measures (profiled steps, then steady-state windows). `advisor profile --replay DIR` then
runs a session against the surface, offline; `--no-session` skips the session this script runs at the
end on the same machine (the search against the grid it just measured, for comparison).

    .venv/bin/python benchmarks/record_surface.py examples/image_classifier.py:train_step --out surfaces/mine \\
        --amp fp32,bf16 --batch 32,64,128 --workers 0,2,4,8,14 --copies pageable,pinned [-- script args]

Points already recorded in DIR are kept (a stopped recording resumes). On a GPU machine, record with
`--device cuda`; `--copies pinned` (pin_memory with non_blocking copies) applies only there.

Any knobs, each setting measured several times (truth with its own noise, issue 54): `--knob NAME=V1,V2`
(repeatable; any field of `Knobs`, booleans as off,on) replaces the four axes above, and `--repeats N`
records every setting N times, all runs in one shuffled order, each in `SETTING-rK`:

    .venv/bin/python benchmarks/record_surface.py examples/image_classifier.py:train_step --device cpu \
        --out tests/data/surfaces/cpu-image-classifier --knob num_workers=0,1,2 --knob batch_size=32,64 \
        --knob uint8_copies=off,on --knob threads=1,2 --repeats 3 --no-session

At the end each setting's runs are summarised (`surface.json`: its knobs, the median samples/s, the
relative spread of its runs, the runs' folders) and the recording's noise floor is printed: the median over
settings of the relative standard error of a setting's median.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from advisor.knobs import BY_NAME  # noqa: E402
from advisor.trials.knobs import Knobs  # noqa: E402
from advisor.trials.record import TRIAL_FILE
from advisor.trials.launch.runner import run_trial  # noqa: E402
from advisor.trials.spec import TrialSpec  # noqa: E402


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




def knob_axis(text: str) -> tuple[str, list]:
    """`NAME=V1,V2` → (name, values as the knob reads them: ints, off/on booleans, strings; `fp32`: no AMP)."""
    name, _, listed = text.partition("=")
    knob = BY_NAME.get(name)
    if knob is None or not listed:
        raise SystemExit(f"--knob {text}: expected NAME=V1,V2 with NAME a knob ({', '.join(BY_NAME)})")
    try:
        return name, [None if v == "fp32" else knob.parse(v) for v in listed.split(",")]
    except ValueError as exc:
        raise SystemExit(f"--knob {text}: {exc}") from None


def knob_points(axes: list[tuple[str, list]]) -> list[tuple[str, Knobs]]:
    """(folder name, knobs) of every setting of the --knob axes."""
    points = []
    for combo in itertools.product(*(v for _, v in axes)):
        settings = dict(zip((n for n, _ in axes), combo))
        name = "-".join(f"{n}={'on' if v is True else 'off' if v is False or v is None else v}"
                        for n, v in settings.items())
        if settings.get("num_workers"):
            settings.setdefault("persistent_workers", True)
        points.append((name, Knobs(**settings)))
    return points


def summarize(out: Path, runs: dict[str, list[str]]) -> float | None:
    """Write surface.json (each setting: knobs, median samples/s, spread, runs) and print each setting's
    figures; return the recording's noise floor (median relative standard error of a setting's median)."""
    settings, errors = [], []
    for name, folders in runs.items():
        rates, knobs, recorded = [], None, []
        for folder in folders:
            path = out / folder / TRIAL_FILE
            if path.exists():
                record = json.loads(path.read_text())
                knobs = record.get("knobs")
                rate = (record.get("summary") or {}).get("samples_per_s")
                if record.get("status") == "ok" and rate:
                    rates.append(rate)
                    recorded.append(folder)  # a run stopped by the deadline is not listed: no folder to serve
        if not rates:
            continue
        median = statistics.median(rates)
        spread = statistics.stdev(rates) / median if len(rates) > 1 else None
        error = spread / math.sqrt(len(rates)) if spread is not None else None
        if error is not None:
            errors.append(error)
        settings.append({"name": name, "knobs": knobs, "samples_per_s": median, "runs": recorded,
                         "run_samples_per_s": rates, "relative_sd": spread, "relative_se": error})
        figure = f", runs ±{100 * spread:.1f}% (sd)" if spread is not None else ""
        print(f"  {name}: {median:.1f} samples/s from {len(rates)} run(s){figure}", flush=True)
    floor = statistics.median(errors) if errors else None
    (out / "surface.json").write_text(json.dumps({"settings": settings, "noise_floor": floor}, indent=1) + "\n")
    if floor is not None:
        print(f"noise floor: a setting's median is known to ±{100 * floor:.1f}% (median relative standard error "
              f"over {len(errors)} settings); a change smaller than twice that is not told from noise")
    return floor


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
    parser.add_argument("--knob", action="append", default=[], metavar="NAME=V1,V2",
                        help="an axis of any knob (repeatable); replaces --amp, --batch, --workers and --copies")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every setting, in one shuffled order")
    parser.add_argument("--traces", default="all", choices=("all", "first"),
                        help="first: keep the trace of each setting's first run only (the others keep trial.json)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="start no new point after this many seconds (a lent machine's command has a limit; "
                             "a later run resumes)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.knob:
        points = knob_points([knob_axis(a) for a in args.knob])
    else:
        points = [(point_name(*p), point_knobs(*p)) for p in itertools.product(
            values(args.amp), values(args.batch, int), values(args.workers, int), values(args.copies))]
    runs = {name: [name] if args.repeats == 1 else [f"{name}-r{k}" for k in range(1, args.repeats + 1)]
            for name, _ in points}
    grid = [(folder, knobs) for name, knobs in points for folder in runs[name]]
    if args.order == "shuffled":
        random.Random(0).shuffle(grid)
    begun = time.monotonic()
    for name, knobs in grid:
        if (out / name / TRIAL_FILE).exists():
            print(f"{name}: recorded already", flush=True)
            continue
        if args.deadline is not None and time.monotonic() - begun > args.deadline:
            print(f"{name}: not started, past the deadline of {args.deadline:g} s", flush=True)
            continue
        started = time.monotonic()
        result = run_trial(TrialSpec(args.target, knobs, out / name, name=name, steps=args.steps, device=args.device,
                                     script_args=script_args, timeout_s=args.timeout, windows=args.windows,
                                     window_s=args.window))
        figure = f"{result.samples_per_s:.0f} samples/s" if result.samples_per_s else result.status
        print(f"{name}: {figure} ({time.monotonic() - started:.1f} s)", flush=True)
    summarize(out, runs)
    if args.traces == "first":
        for folders in runs.values():  # the first run that recorded keeps its trace (r1 may not have run)
            kept = [f for f in folders if list((out / f).glob("*.pt.trace.json*"))]
            for trace in (t for folder in kept[1:] for t in (out / folder).glob("*.pt.trace.json*")):
                trace.unlink()
    if args.no_session:
        return 0
    from advisor.search.strategy import surface_space
    from advisor.trials.replay.surface import ReplayRunner, load_surface
    from advisor.search.session import run_session
    from advisor.search.state import SessionOptions, document

    points = load_surface(out)
    session = out.with_name(out.name + "-replayed")
    state = run_session(f"{out.resolve()}:replay", session, SessionOptions(max_trials=max(2, len(points) // 3)),
                        runner=ReplayRunner(points, session.resolve()), script=False, space=surface_space(points),
                        extra={"replay": str(out.resolve())}, log=lambda m: print("  " + m, flush=True))
    state = document(state)  # the record as session.json holds it
    print(f"replayed session: {session} (best {state['best']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

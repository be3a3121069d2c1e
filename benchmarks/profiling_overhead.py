"""Profiling overhead: the advisor's median step time vs the same steps timed without the profiler.

Both runs are trials of the same script in fresh subprocesses; the only difference is whether
torch.profiler records (CPU activities, shapes, memory). The target is an overhead under 10%.
Runs alternate (profiled, plain, profiled, plain, ...) so a machine that gets busier part-way
through skews both sides alike; the figure per side is the lowest of its runs' median step times,
the run least disturbed by other work on a shared machine.

    .venv/bin/python benchmarks/profiling_overhead.py [--repeats 3] [--steps 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from advisor.trials.knobs import Knobs  # noqa: E402
from advisor.trials.launch.runner import run_trial  # noqa: E402
from advisor.trials.spec import TrialSpec  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TARGETS = ["image_classifier.py:train_step", "char_transformer.py:train_step"]


def median_step(target: str, folder: Path, *, profile: bool, steps: int) -> float:
    """One trial's median step time in seconds."""
    result = run_trial(TrialSpec(str(EXAMPLES / target), Knobs(), folder, steps=steps, device="cpu", profile=profile))
    if not result.ok:
        raise SystemExit(f"{target}: trial {result.status}: {result.message}")
    return result.median_step_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="trials per side per example")
    parser.add_argument("--steps", type=int, default=5, help="recorded steps per trial")
    args = parser.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for target in TARGETS:
            profiled, plain = [], []
            for repeat in range(args.repeats):
                profiled.append(median_step(target, Path(tmp) / f"{target}-p{repeat}", profile=True, steps=args.steps))
                plain.append(median_step(target, Path(tmp) / f"{target}-n{repeat}", profile=False, steps=args.steps))
            with_profiler, without = min(profiled), min(plain)
            ratio = with_profiler / without
            worst = max(worst, ratio)
            print(
                f"{target:34s} profiled {with_profiler * 1e3:8.1f} ms   plain {without * 1e3:8.1f} ms   "
                f"ratio {ratio:.3f} ({(ratio - 1) * 100:+.1f}%)"
            )
    print(f"worst overhead {(worst - 1) * 100:+.1f}% (target under +10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`make bench`: run every benchmark in this folder, print what each measures, fail if any misses its floor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Benchmarks with a floor; record_surface.py is a tool (it records a surface), not one of them.
BENCHMARKS = ("analyze_speed.py", "profiling_overhead.py", "search_quality.py", "replay_search.py", "knob_grid.py",
              "prediction_quality.py", "session_predictions.py", "time_to_answer.py")


def main() -> int:
    failed = []
    for script in (HERE / name for name in BENCHMARKS):
        print(f"== {script.name}", flush=True)
        if subprocess.run([sys.executable, str(script)], cwd=HERE.parent).returncode != 0:
            failed.append(script.name)
    print("bench: " + ("all floors met" if not failed else f"below the floor: {', '.join(failed)}"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

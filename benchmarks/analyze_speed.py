"""Benchmark: `advisor analyze` of the 54 MB v100-memory-events trace, as a whole process, against a
Python process that only does `json.load(gzip.open(path))` on the same file. Wall time and peak memory
(max RSS of each process, from wait4), median of several alternating runs.

Floor (issue 2): advisor takes less time and peaks at no more memory. Exit code 1 if it does not.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "data" / "traces" / "v100-memory-events.pt.trace.json.gz"
RUNS = int(os.environ.get("BENCH_RUNS", "7"))


def measure(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed: {proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss / 1024


def main() -> int:
    if not TRACE.exists():
        print(f"analyze speed: skipped, {TRACE} is absent")
        return 0
    advisor = [sys.executable, "-m", "advisor.cli", "analyze", str(TRACE)]
    baseline = [sys.executable, "-c", "import gzip, json, sys; json.load(gzip.open(sys.argv[1]))", str(TRACE)]
    results = {"advisor analyze": [], "json.load": []}
    for _ in range(RUNS):  # alternate, so background load hits both alike
        results["advisor analyze"].append(measure(advisor))
        results["json.load"].append(measure(baseline))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(m for _, m in v)) for k, v in results.items()}
    (a_t, a_m), (j_t, j_m) = med["advisor analyze"], med["json.load"]
    print(f"analyze speed ({TRACE.name}, {TRACE.stat().st_size / 1e6:.1f} MB gzip, median of {RUNS} runs)")
    print(f"  advisor analyze : {a_t:6.3f} s  {a_m:6.0f} MB peak")
    print(f"  json.load only  : {j_t:6.3f} s  {j_m:6.0f} MB peak")
    print(f"  ratio advisor/json.load: time {a_t / j_t:.2f}, memory {a_m / j_m:.2f}")
    ok = a_t < j_t and a_m <= j_m
    print(f"  {'PASS' if ok else 'FAIL'}: advisor must take less time and no more memory than json.load")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

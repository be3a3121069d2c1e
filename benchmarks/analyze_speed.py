"""Benchmark: `advisor analyze` of the 54 MB v100-memory-events trace, as a whole process, against a
Python process that only does `json.load(gzip.open(path))` on the same file; then a folder of 8 ranks read in
parallel processes against the same folder read one trace after another (ADVISOR_READ_PROCESSES=1). Wall
time, CPU time (user + system, which a loaded machine disturbs less than wall time) and peak memory (max RSS
of each process, from wait4), median of several alternating runs. The advisor's bytecode is compiled first,
as an installed package has it (with PYTHONDONTWRITEBYTECODE set, every run would compile its modules again).

Floors (issues 2 and 70): advisor takes at most half json.load's time (ANALYZE_SHARE) and peaks at no more
memory than json.load nor than it did before issue 70 (PEAK_BEFORE_MB); the 8 ranks are read at least 1.6
times faster in parallel than one after another (on 2 cores and more). Exit code 1 if a floor is not met.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "data" / "traces" / "v100-memory-events.pt.trace.json.gz"
RANK = ROOT / "tests" / "data" / "traces" / "a100-rank3-of-8.pt.trace.json.gz"
RUNS = int(os.environ.get("BENCH_RUNS", "7"))
ANALYZE_SHARE = 0.5  # advisor analyze's time as a share of json.load's, at most
PEAK_BEFORE_MB = 201  # advisor analyze's peak on this trace before issue 70 (195 to 201 MB on the 2-core machine)
RANKS = 8
PARALLEL_SPEEDUP = 1.6


def measure(argv: list[str], env: dict | None = None) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS in MB) of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed: {proc.stderr.read().decode()}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def medians(commands: dict[str, tuple[list[str], dict | None]]) -> dict[str, tuple[float, float, float]]:
    """Median wall time, CPU time and peak of each command, run in turns (background load hits them alike)."""
    results: dict[str, list] = {name: [] for name in commands}
    for _ in range(RUNS):
        for name, (argv, env) in commands.items():
            results[name].append(measure(argv, env))
    return {k: tuple(statistics.median(run[i] for run in v) for i in range(3)) for k, v in results.items()}


def single_trace() -> bool:
    advisor = [sys.executable, "-m", "advisor.cli", "analyze", str(TRACE)]
    baseline = [sys.executable, "-c", "import gzip, json, sys; json.load(gzip.open(sys.argv[1]))", str(TRACE)]
    zlib_only = dict(os.environ, ADVISOR_INFLATE="zlib")
    med = medians({"advisor analyze": (advisor, None), "advisor analyze, zlib": (advisor, zlib_only),
                   "json.load": (baseline, None)})
    (a_t, a_c, a_m), (z_t, z_c, z_m), (j_t, j_c, j_m) = (
        med["advisor analyze"], med["advisor analyze, zlib"], med["json.load"])
    print(f"analyze speed ({TRACE.name}, {TRACE.stat().st_size / 1e6:.1f} MB gzip, median of {RUNS} runs)")
    print(f"  advisor analyze        : {a_t:6.3f} s  {a_c:6.3f} s CPU  {a_m:6.0f} MB peak")
    print(f"  advisor analyze (zlib) : {z_t:6.3f} s  {z_c:6.3f} s CPU  {z_m:6.0f} MB peak  (the fallback without isal)")
    print(f"  json.load only         : {j_t:6.3f} s  {j_c:6.3f} s CPU  {j_m:6.0f} MB peak")
    print(f"  ratio advisor/json.load: time {a_t / j_t:.2f}, CPU {a_c / j_c:.2f}, memory {a_m / j_m:.2f}")
    ok = a_t <= ANALYZE_SHARE * j_t and a_m <= j_m and a_m <= PEAK_BEFORE_MB
    print(f"  {'PASS' if ok else 'FAIL'}: advisor must take at most {ANALYZE_SHARE} of json.load's time and no more "
          f"memory than json.load or {PEAK_BEFORE_MB} MB (its peak before issue 70)")
    return ok


def rank_folder() -> bool:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cores < 2:
        print("rank folder: skipped, one core")
        return True
    with tempfile.TemporaryDirectory(prefix="advisor-ranks-") as folder:
        for rank in range(RANKS):
            shutil.copy(RANK, Path(folder) / f"rank{rank}.pt.trace.json.gz")
        argv = [sys.executable, "-m", "advisor.cli", "analyze", folder]
        med = medians({"parallel": (argv, None), "one after another": (argv, dict(os.environ, ADVISOR_READ_PROCESSES="1"))})
    (p_t, p_c, p_m), (s_t, s_c, s_m) = med["parallel"], med["one after another"]
    speedup = s_t / p_t
    print(f"rank folder ({RANKS} copies of {RANK.name}, {cores} cores, median of {RUNS} runs)")
    print(f"  parallel processes : {p_t:6.3f} s  {p_c:6.3f} s CPU (all processes)  {p_m:6.0f} MB peak (the largest)")
    print(f"  one after another  : {s_t:6.3f} s  {s_c:6.3f} s CPU  {s_m:6.0f} MB peak")
    ok = speedup >= PARALLEL_SPEEDUP
    print(f"  {'PASS' if ok else 'FAIL'}: {speedup:.2f}x faster in parallel, at least {PARALLEL_SPEEDUP}x")
    return ok


def main() -> int:
    if not TRACE.exists() or not RANK.exists():
        print(f"analyze speed: skipped, {TRACE} or {RANK} is absent")
        return 0
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "advisor")], check=True)
    ok = single_trace()
    ok = rank_folder() and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

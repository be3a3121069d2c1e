"""`make gpu-check`: every CUDA path of the advisor proven on a real GPU in one run of at most 8 minutes.

Phases, each with its own time budget (what one leaves unused goes to the next), each run whatever the
others did:

  doctor         `advisor doctor --device cuda --json`
  cuda tests     tests/test_cuda.py: each knob's CUDA branch (memory cap, autocast, pinned non_blocking copies,
                 8-bit copies, TF32, cudnn.benchmark, compile, trials forked from the zygote, DDP on NCCL, the profiler's check), and the
                 8-bit copies of torchvision pipelines (tests/test_uint8_transforms.py)
  session image  `advisor profile examples/image_classifier.py:train_step --device cuda`, at most 8 trials
  grid image     a small grid of the same step (DataLoader workers × pinned non_blocking copies), its best
                 compared with the session's choice
  session conv   the same session on examples/conv_classifier.py

It leaves at most 8 files of at most 16 MB each in the output folder (--out, else $OUT, else
runs/gpu-check-out): summary.json, summary.txt (the table it prints), gpu_check.log (every phase's output),
doctor.json, tests.xml (JUnit), and three archives (sessions.tar.gz, grid.tar.gz, tests.tar.gz) of the
trial folders, their traces as many as fit. Without a CUDA device it says "no CUDA device: nothing
checked" and exits 0. Each phase ends ok, failed, or stopped (it ran out of its time: what it finished is
reported); exit code 1 when a phase failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOTAL_S = 450  # the phases' share of the 8 minutes; the rest is start-up and packing
BUDGETS = {"doctor": 60, "cuda tests": 160, "session image": 75, "grid image": 75, "session conv": 80}
LAST_TRIAL_S = 20  # a session starts no trial this close to its limit: the last one and the report fit
GRACE_S = 15  # after its budget a phase gets Ctrl-C (it writes what it has), then SIGKILL this much later
MAX_FILE = 16 * 2**20
ARCHIVE_BUDGET = 15 * 2**20  # raw bytes per archive: traces are gzipped already, so this bounds the archive
SCHEMA = "advisor.gpu_check/1"
STOPPED = "stopped"  # a phase that ran out of its time: what it finished is reported, nothing failed
IMAGE = f"{ROOT / 'examples' / 'image_classifier.py'}:train_step"
CONV = f"{ROOT / 'examples' / 'conv_classifier.py'}:train_step"
# Every trial of the sessions and the grid is measured alike: short, as the budget asks.
TRIAL = {"steps": 3, "wait": 1, "warmup": 1, "windows": 2, "window_s": 0.5}
TRIAL_TIMEOUT_S = 60


class Run:
    """The run's clock, folders and log."""

    def __init__(self, out: Path, work: Path, device: str):
        self.out, self.work, self.device = out, work, device
        self.started = time.monotonic()
        self.log_path = out / "gpu_check.log"
        self.log = open(self.log_path, "a", buffering=1)

    def say(self, text: str) -> None:
        """A line on the terminal and in the log."""
        print(text, flush=True)
        self.log.write(text + "\n")

    def limit(self, phase: str) -> float:
        """Seconds this phase may take: its budget, with what earlier phases left, never the later ones' share."""
        names = list(BUDGETS)
        later = sum(BUDGETS[n] for n in names[names.index(phase) + 1:])
        return max(0.0, TOTAL_S - (time.monotonic() - self.started) - later)


def run_command(run: Run, command: list[str], limit_s: float, stdout: Any = None,
                grace_s: float = GRACE_S) -> tuple[int | None, float]:
    """Run a command in its own process group, output into the log (or `stdout`), for at most `limit_s`
    (Ctrl-C `grace_s` before, then SIGKILL); its exit code (None: stopped at its limit) and seconds."""
    started = time.monotonic()
    if limit_s < 1:
        run.say(f"$ {' '.join(command)}: no time left for it")
        return None, 0.0
    run.say(f"$ {' '.join(command)}  (at most {limit_s:.0f} s)")
    proc = subprocess.Popen(command, cwd=ROOT, stdout=stdout or run.log, stderr=run.log, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    grace_s = min(grace_s, limit_s / 2)  # a phase left little time still ends at its limit
    try:
        code: int | None = proc.wait(timeout=limit_s - grace_s)
    except subprocess.TimeoutExpired:
        code = None
        os.killpg(proc.pid, signal.SIGINT)  # pytest and advisor profile write what they have on Ctrl-C
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return code, time.monotonic() - started


def phase_doctor(run: Run) -> dict[str, Any]:
    """`advisor doctor --device cuda --json` into doctor.json."""
    with open(run.out / "doctor.json", "w") as f:
        command = [sys.executable, "-m", "advisor.cli", "doctor", "--device", run.device, "--json"]
        # no grace: it writes its JSON only at the end, and a Ctrl-C leaves nothing
        code, seconds = run_command(run, command, run.limit("doctor"), stdout=f, grace_s=2)
    try:
        document = json.loads((run.out / "doctor.json").read_text())
    except ValueError:
        return {"status": "failed", "seconds": seconds, "what": f"no JSON document (exit code {code})"}
    failed = document.get("failed") or []
    devices = next((c["details"].get("devices") for c in document["checks"] if c["name"] == "devices"), None) or []
    names = ", ".join(sorted({d["name"] for d in devices})) or "no device"
    what = f"{names}: " + (f"failed {', '.join(failed)}" if failed else "every check ok")
    return {"status": "ok" if not failed else "failed", "seconds": seconds, "what": what, "exit_code": code,
            "failed": failed}


# The 8-bit copies of torchvision pipelines after a real copy (skipped where torchvision is not installed).
TORCHVISION_ON_CUDA = "tests/test_uint8_transforms.py::test_after_a_real_copy_to_the_gpu_the_numbers_are_the_same"
# A test's id may hold spaces and commas in its parameters ("...[v1 ImageNet, PIL augmentations] PASSED").
TEST_LINE = re.compile(r"^(tests/\S+::.+?)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


def phase_tests(run: Run) -> dict[str, Any]:
    """tests/test_cuda.py, verbose (each test's outcome read from the log, also when stopped at the limit)."""
    before = run.log_path.stat().st_size
    code, seconds = run_command(run, [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "0",
                                      "tests/test_cuda.py", TORCHVISION_ON_CUDA, f"--junitxml={run.out / 'tests.xml'}",
                                      f"--basetemp={run.work / 'tests'}"], run.limit("cuda tests"))
    with open(run.log_path, "rb") as f:
        f.seek(before)
        lines = f.read().decode(errors="replace").splitlines()
    outcomes = dict(m.groups() for m in map(TEST_LINE.match, lines) if m)
    counts = {k: sum(v == k for v in outcomes.values()) for k in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
    bad = [name.split("::")[-1] for name, v in outcomes.items() if v in ("FAILED", "ERROR")]
    what = f"{counts['PASSED']} passed, {counts['FAILED'] + counts['ERROR']} failed, {counts['SKIPPED']} skipped"
    if bad:
        what += f": {', '.join(bad)}"
    if code is None:
        what += " (stopped at its time limit)"
    if bad or (code is not None and code != 0):
        status = "failed"
    elif code is None:
        status = STOPPED
    else:  # a rehearsal on the CPU skips them all
        status = "ok" if counts["PASSED"] > 0 or run.device == "cpu" else "failed"
    return {"status": status, "seconds": seconds, "what": what, "tests": outcomes}


def session_phase(run: Run, phase: str, target: str, folder: str, extra: list[str]) -> dict[str, Any]:
    """`advisor profile TARGET --device cuda` with at most 8 trials, new trials stopping in time for the limit."""
    limit = run.limit(phase)
    out = run.work / "sessions" / folder
    command = [sys.executable, "-m", "advisor.cli", "profile", target, "--device", run.device, "--max-trials", "8",
               "--time-budget", f"{max(1.0, limit - LAST_TRIAL_S - GRACE_S):.0f}", "--out", str(out),
               "--steps", str(TRIAL["steps"]), "--wait", str(TRIAL["wait"]), "--warmup", str(TRIAL["warmup"]),
               "--windows", str(TRIAL["windows"]), "--window", str(TRIAL["window_s"]), "--timeout",
               str(TRIAL_TIMEOUT_S), *extra]
    code, seconds = run_command(run, command, limit)
    try:
        state = json.loads((out / "session.json").read_text())
    except (OSError, ValueError):
        return {"status": "failed", "seconds": seconds, "what": f"no session.json (exit code {code})"}
    trials = state.get("trials") or []
    best = next((t for t in trials if t.get("name") == state.get("best")), None) or {}
    failed = [t["name"] for t in trials if t.get("status") not in ("ok", None)]
    what = (f"{len(trials)} trials, status {state.get('status')}, best {best.get('change') or best.get('name')} "
            f"{best.get('samples_per_s') or 0:.1f} {state.get('unit') or 'samples/s'} "
            f"({best.get('speedup') or 0:.2f}x the baseline; the session claims {state.get('speedup') or 0:.2f}x, "
            f"{state.get('speedup_basis') or 'direct'})")
    if failed:
        what += f"; trials that failed: {', '.join(failed)}"
    if not trials or trials[0].get("status") != "ok":
        status = "failed"
    elif code is None:
        status = STOPPED  # it measured, and ran out of time for more
    else:
        status = "ok" if code == 0 and state.get("status") == "done" else "failed"
    return {"status": status, "seconds": seconds, "what": what, "exit_code": code,
            "best": {"name": best.get("name"), "knobs": best.get("knobs"), "samples_per_s": best.get("samples_per_s")},
            "trials": [{k: t.get(k) for k in ("name", "change", "status", "decision", "samples_per_s", "outcomes")}
                       for t in trials]}


def grid_points() -> list[dict[str, Any]]:
    """DataLoader workers (0, 4, 8 within the cores) × pinned non_blocking copies (off, on)."""
    cores = os.cpu_count() or 1
    return [{"num_workers": w, "pinned": p} for w in (0, 4, 8) if w <= cores for p in (False, True)]


def grid_knobs(point: dict[str, Any]) -> Any:
    """The knobs of one grid point (the example's own values left unset)."""
    from advisor.trials.knobs import Knobs

    workers = point["num_workers"]
    return Knobs(num_workers=workers or None, persistent_workers=True if workers else None,
                 pin_memory=True if point["pinned"] else None, non_blocking=True if point["pinned"] else None)


def phase_grid(run: Run, session: dict[str, Any]) -> dict[str, Any]:
    """The grid on the image classifier, points started only while one more fits in the limit; its best
    against the session's choice (each figure from its own trial)."""
    from advisor.trials.launch.runner import run_trial
    from advisor.trials.spec import TrialSpec

    limit, started = run.limit("grid image"), time.monotonic()
    measured, longest = [], 20.0
    for i, point in enumerate(grid_points()):
        left = limit - (time.monotonic() - started)
        if left < longest + 5:
            run.say(f"  grid: no time for {len(grid_points()) - i} more point(s)")
            break
        began = time.monotonic()
        try:
            result = run_trial(TrialSpec(IMAGE, grid_knobs(point), run.work / "grid" / f"{i:02d}", name=f"{i:02d}",
                                         device=run.device, timeout_s=min(TRIAL_TIMEOUT_S, left - 5), **TRIAL))
            sps = (result.samples_per_s or 0.0) if result.ok else 0.0
            status = result.status
        except Exception as exc:  # a grid point that cannot run is one row, not the end of the phase
            sps, status = 0.0, f"error: {type(exc).__name__}: {exc}"
        longest = max(longest, time.monotonic() - began)
        measured.append({**point, "samples_per_s": sps, "status": status})
        run.say(f"  grid {i + 1}/{len(grid_points())} {point}: {sps:.1f} samples/s ({status})")
    seconds = time.monotonic() - started
    if not measured or not any(p["samples_per_s"] for p in measured):
        return {"status": "failed", "seconds": seconds, "what": "no grid point measured", "points": measured}
    best = max(measured, key=lambda p: p["samples_per_s"])
    what = (f"{len(measured)} points, best workers={best['num_workers']} pinned={best['pinned']} "
            f"{best['samples_per_s']:.1f} samples/s")
    session_sps = ((session.get("best") or {}).get("samples_per_s")) or 0.0
    ratio = session_sps / best["samples_per_s"] if session.get("status") in ("ok", STOPPED) else None
    what += f"; the session's choice {session_sps:.1f} = {ratio:.2f} of it" if ratio is not None else \
        "; no session choice to compare (the session failed)"
    return {"status": "ok", "seconds": seconds, "what": what, "points": measured, "grid_best": best,
            "session_best_samples_per_s": session_sps, "session_over_grid": ratio}


def guarded(run: Run, name: str, phase: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A phase's result; one that raised is a failed phase, and the others still run."""
    run.say(f"== {name}")
    started = time.monotonic()
    try:
        result = phase()
    except Exception as exc:
        result = {"status": "failed", "seconds": time.monotonic() - started, "what": f"{type(exc).__name__}: {exc}"}
    result = {"name": name, "budget_s": BUDGETS[name], **result}
    run.say(f"   {result['status']} in {result['seconds']:.0f} s: {result['what']}")
    return result


def table(phases: list[dict[str, Any]], total_s: float) -> str:
    """The short table of the phases."""
    lines = [f"{'phase':14} {'status':7} {'seconds':>7}  what", "-" * 100]
    lines += [f"{p['name']:14} {p['status']:7} {p['seconds']:7.0f}  {p['what']}" for p in phases]
    lines.append(f"{'total':14} {'':7} {total_s:7.0f}")
    return "\n".join(lines)


def pack(source: Path, archive: Path) -> list[str]:
    """`source` as a .tar.gz of at most ARCHIVE_BUDGET raw bytes: every file but traces first, then traces,
    the baseline's and the smallest first, while they fit; returns the paths left out."""
    files = sorted(p for p in source.rglob("*") if p.is_file()) if source.exists() else []
    traces = [p for p in files if ".pt.trace.json" in p.name]
    others = [p for p in files if p not in traces]
    traces.sort(key=lambda p: ("baseline" not in str(p), p.stat().st_size))
    left_out, used = [], 0
    with tarfile.open(archive, "w:gz") as tar:
        for path in others + traces:
            size = path.stat().st_size
            if used + size > ARCHIVE_BUDGET:
                left_out.append(str(path.relative_to(source)))
                continue
            used += size
            tar.add(path, arcname=str(path.relative_to(source.parent)))
    return left_out


def bound_log(path: Path) -> None:
    """Keep the log within MAX_FILE: its start and its end."""
    if path.stat().st_size <= MAX_FILE:
        return
    data = path.read_bytes()
    head, tail = data[: 2 * 2**20], data[-(MAX_FILE - 3 * 2**20):]
    path.write_bytes(head + b"\n[... the middle of the log is left out ...]\n" + tail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="every CUDA path of the advisor on a real GPU, in 8 minutes")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "runs" / "gpu-check-out"),
                        help="folder for the files to bring back (default $OUT, else runs/gpu-check-out)")
    parser.add_argument("--work", help="folder for the sessions and trials (default runs/gpu-check-<time>)")
    parser.add_argument("--rehearse-on-cpu", action="store_true",
                        help="run the same phases on the CPU (the CUDA tests skip): checks this script, not a GPU")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.rehearse_on_cpu:
        print("no CUDA device: nothing checked")
        return 0
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out, work = Path(args.out).resolve(), Path(args.work or ROOT / "runs" / f"gpu-check-{stamp}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    run = Run(out, work, "cpu" if args.rehearse_on_cpu else "cuda")
    run.say(f"gpu-check {stamp} on {run.device}: torch {torch.__version__}, {torch.cuda.device_count()} CUDA "
            f"device(s), work folder {work}")
    if shutil.which("nvidia-smi"):
        run_command(run, ["nvidia-smi"], 20, grace_s=2)
    # The image classifier's files, made once here rather than inside the first trial that reads them (its
    # time comes out of the first phase's share).
    run_command(run, [sys.executable, str(ROOT / "examples" / "image_classifier.py"), "--epochs", "0"], 60, grace_s=2)
    phases = [guarded(run, "doctor", lambda: phase_doctor(run)),
              guarded(run, "cuda tests", lambda: phase_tests(run))]
    image = guarded(run, "session image", lambda: session_phase(run, "session image", IMAGE, "image_classifier",
                                                                 ["--keep-effective-batch"]))
    phases += [image, guarded(run, "grid image", lambda: phase_grid(run, image)),
               guarded(run, "session conv", lambda: session_phase(run, "session conv", CONV, "conv_classifier", []))]
    total = time.monotonic() - run.started
    text = table(phases, total)
    run.say(text)
    left_out = {}
    for name, folder in (("sessions", work / "sessions"), ("grid", work / "grid"), ("tests", work / "tests")):
        left_out[name] = pack(folder, out / f"{name}.tar.gz")
    summary = {"schema": SCHEMA, "started_at": stamp, "device": run.device, "torch": torch.__version__,
               "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
               "total_s": round(total, 1), "phases": phases, "left_out_of_archives": left_out}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (out / "summary.txt").write_text(text + "\n")
    run.log.close()
    bound_log(run.log_path)
    return 1 if any(p["status"] == "failed" for p in phases) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Whether torch.profiler records what the advisor reads: a profiled step's trace must hold the CPU's
operators and memory events and, on a CUDA device, the device's kernels (recorded through CUPTI) and its
memory events. Where CUPTI is refused (containers often refuse it: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES) the
trace holds no kernels, and every figure computed from it would be wrong without a word of warning.

`probe(device_type, folder)` profiles a tiny step in this process and counts the trace's events, with the
CUPTI errors the profiler printed (Kineto writes them to the process's stderr: its file descriptor is
read). `trace_problems` says what is missing, what it breaks and how to fix it. `advisor doctor` runs the
probe in its own process; before a CUDA baseline the session runs it in a fresh one (`cuda_profiler_problem`),
so that the advisor's process never initialises CUDA. Torch is imported lazily.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from advisor.trials.harness import profiler
from advisor.trials.launch.processes import advisor_importable

PROBE_STEPS = 3
PROBE_TIMEOUT_S = 240.0  # torch's import, CUDA's start and a profiled step: seconds, minutes on a busy machine
_CUPTI_ERROR = re.compile(r"CUPTI_ERROR_[A-Z_]+")
CUPTI_PERMISSION = "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"
CUPTI_PERMISSION_FIX = (
    "let users profile the GPU: on the host, `echo 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' | "
    "sudo tee /etc/modprobe.d/nvidia-profiling.conf`, then reboot (or reload the nvidia kernel module; some "
    "distributions need `sudo update-initramfs -u` first); or run as root. In a container: docker run "
    "--cap-add SYS_ADMIN (or --privileged); on Kubernetes, securityContext.capabilities.add: [\"SYS_ADMIN\"]. "
    "NVIDIA's page: https://developer.nvidia.com/nvidia-development-tools-solutions-err-nvgpuctrperm-cupti")
CUPTI_OTHER_FIX = (
    "only one tool can hold CUPTI: run without Nsight Systems/Compute, a DCGM profiling exporter or another "
    "profiler attached; a libcupti other than torch's own may load first (LD_LIBRARY_PATH naming a CUDA "
    "toolkit's extras/CUPTI/lib64): take it out of LD_LIBRARY_PATH; `advisor doctor --device cuda` checks again")
NO_KERNELS_BREAKS = (
    "every GPU figure of a session (device busy and idle time, Tensor Core kernels, copies, the bound) would be "
    "computed from a trace without the device's work: `advisor profile` stops before a CUDA baseline")


@dataclass(frozen=True)
class Problem:
    """What a trace lacks, what that breaks in a session, and how to fix it."""

    summary: str
    breaks: str
    fix: str


@contextlib.contextmanager
def stderr_into(path: Path) -> Iterator[None]:
    """Send this process's file descriptor 2 (where Kineto's C++ logging goes) into `path` for a while."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "wb") as sink:
            os.dup2(sink.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def count_events(events: list[dict[str, Any]]) -> dict[str, int]:
    """How many of a trace's events the advisor reads, by kind (memory events by their device type)."""
    counts = {"cpu_ops": 0, "kernels": 0, "copies": 0, "runtime": 0, "cpu_memory_events": 0,
              "device_memory_events": 0}
    for event in events:
        cat, name = event.get("cat"), event.get("name")
        if cat == "cpu_op":
            counts["cpu_ops"] += 1
        elif cat == "kernel":
            counts["kernels"] += 1
        elif cat in ("gpu_memcpy", "gpu_memset"):
            counts["copies"] += 1
        elif cat in ("cuda_runtime", "cuda_driver"):
            counts["runtime"] += 1
        elif name == "[memory]":
            device = (event.get("args") or {}).get("Device Type")
            counts["cpu_memory_events" if device == 0 else "device_memory_events"] += 1
    return counts


def probe(device_type: str, folder: Path) -> dict[str, Any]:
    """Profile a tiny step (a host-to-device copy on CUDA, a matmul, allocations) in this process as a trial
    does, and return its trace's event counts, the CUPTI errors printed meanwhile and the profiler's own
    warnings (a few lines)."""
    import torch

    device = torch.device(device_type)
    host = torch.randn(256, 256)
    weight = torch.randn(256, 256, device=device)

    def step() -> float:
        # The batch is made on the host, as a loader makes it: on CUDA too the trace has CPU allocations.
        x = (host * 1.0).to(device)
        return float((x @ weight).relu().sum().item())  # .item() waits for the device

    step()  # CUDA's context and cuBLAS start outside the profiled steps, as a trial's wait steps do
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    log = folder / "profiler-stderr.txt"
    trace = folder / "probe.pt.trace.json"
    with stderr_into(log):
        with profiler.profile(activities=activities, profile_memory=True) as prof:
            for _ in range(PROBE_STEPS):
                step()
        prof.export_chrome_trace(str(trace))
    text = log.read_text(errors="replace")
    events = json.loads(trace.read_text()).get("traceEvents") or []
    # On the CPU Kineto's complaints about the missing GPU are noise; on a GPU they say why CUPTI failed.
    lines = [line.strip() for line in text.splitlines()
             if device.type == "cuda" and ("CUPTI" in line or line.startswith(("WARNING", "ERROR")))]
    return {"device": device.type, **count_events(events),
            "cupti_errors": sorted(set(_CUPTI_ERROR.findall(text))), "profiler_messages": lines[:6]}


def trace_problems(counts: dict[str, Any]) -> list[Problem]:
    """What a probe's trace lacks that the advisor needs; empty when it holds everything."""
    problems = []
    if not counts.get("cpu_ops"):
        problems.append(Problem(
            "a profiled step's trace holds no CPU operators",
            "every figure of a session (the step's time, its breakdown, the bound) comes from them: "
            "`advisor profile` would measure nothing",
            "this torch build's profiler (Kineto) records nothing: install an official torch wheel"))
    if not counts.get("cpu_memory_events"):
        problems.append(Problem(
            "a profiled step's trace holds no CPU memory events (profile_memory=True)",
            "the memory figures (peak memory, the headroom for a larger batch) are missing",
            "this torch build's profiler records no allocations: install an official torch wheel"))
    if counts.get("device") != "cuda":
        return problems
    errors = counts.get("cupti_errors") or []
    if not counts.get("kernels"):
        if CUPTI_PERMISSION in errors:
            problems.append(Problem(f"CUPTI refused the profiler ({CUPTI_PERMISSION}): a profiled step's trace "
                                    "holds no GPU kernels", NO_KERNELS_BREAKS, CUPTI_PERMISSION_FIX))
        else:
            why = f"CUPTI failed ({', '.join(errors)})" if errors else "CUPTI recorded nothing, with no error"
            problems.append(Problem(f"{why}: a profiled step's trace holds no GPU kernels", NO_KERNELS_BREAKS,
                                    CUPTI_OTHER_FIX))
    if not counts.get("device_memory_events"):
        problems.append(Problem(
            "a profiled step's trace holds no device memory events (profile_memory=True)",
            "the device memory figures (peak memory, the headroom for a larger batch, out-of-memory advice) "
            "are missing",
            "torch's CUDA caching allocator reports them: unset PYTORCH_NO_CUDA_MEMORY_CACHING, and a "
            "PYTORCH_CUDA_ALLOC_CONF backend other than the native one"))
    return problems


def nvidia_driver_present() -> bool:
    """Whether this process could see an NVIDIA GPU, told without torch: the driver's files exist and
    CUDA_VISIBLE_DEVICES does not hide every device."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidiactl").exists()


def cuda_profiler_problem(device: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Before a baseline on `device` (auto, cpu, cuda): why a CUDA trial's trace would hold no device
    kernels or no CUDA device would be found (one line: what it breaks and the fix), or None. It runs the
    probe in a fresh process, as a trial runs; nothing when no CUDA trial will run, or when the probe itself
    could not finish (the baseline then says what is wrong)."""
    if device == "cpu" or (device == "auto" and not nvidia_driver_present()):
        return None
    env = dict(os.environ, PYTHONPATH=advisor_importable(os.environ))
    try:
        done = subprocess.run([sys.executable, "-m", "advisor.trials.launch.profiler_check", device],
                              capture_output=True, text=True, timeout=timeout_s, env=env, stdin=subprocess.DEVNULL)
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, OSError, ValueError, IndexError):
        return None
    if result.get("no_cuda"):
        return result["no_cuda"]
    problems = [p for p in trace_problems(result) if "no GPU kernels" in p.summary]
    if not problems:
        return None
    problem = problems[0]
    return (f"--device {device}: {problem.summary}; this breaks {problem.breaks}. Fix: {problem.fix}. "
            "Or profile on the CPU: --device cpu")


def main(argv: list[str] | None = None) -> int:
    """`python -m advisor.trials.launch.profiler_check auto|cuda|cpu`: the probe's counts as one JSON line."""
    import torch

    requested = (argv if argv is not None else sys.argv[1:] or ["auto"])[0]
    available = torch.cuda.is_available()
    if requested == "cuda" and not available:
        print(json.dumps({"no_cuda": "--device cuda: no CUDA device is available to this process"}))
        return 0
    device = "cuda" if requested != "cpu" and available else "cpu"
    with tempfile.TemporaryDirectory(prefix="advisor-probe-") as folder:
        print(json.dumps(probe(device, Path(folder))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

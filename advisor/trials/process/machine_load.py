"""The machine's load from outside the trial, measured beside each steady-state window.

A shared machine's other jobs slow a trial as much as a knob speeds it up; the session can tell the two
apart only if it knows the load changed. `LoadMeter.sample()` says, for the time since its last sample:

- `waited`: the share of the time the trial process's threads were ready to run that they spent waiting
  for a CPU (Linux's /proc/self/task/*/schedstat): contention as the trial meets it. On a saturated
  machine other processes' share of the CPU cannot grow, but the trial's wait still does when another job
  starts; 1 − waited is the share of the CPU the machine gives the trial;
- `other_cpu`: the share of the machine's CPU time that processes outside the trial used (the system's
  busy time, psutil.cpu_times, less the trial process's own and its live children's: DataLoader workers
  are the trial's, not load);
- `gpu_other`: on a GPU, the mean SM utilization (0-1) that other processes had on the trial's device,
  from NVML's per-process samples (nvidia-ml-py); None where NVML cannot say (no GPU, no driver support).

Torch-free; the step driver calls it in the trial process, once per window. Sampling costs about a
millisecond (a walk over the trial's children), a small part of a window.
"""

from __future__ import annotations

import os
from typing import Any


def _busy_and_total() -> tuple[float, float]:
    import psutil

    times = psutil.cpu_times()
    total = sum(times)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


def _own_cpu() -> float:
    """CPU seconds of this process, its reaped children and its live ones (the trial's own work)."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    own = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            own += c.user + c.system
        except psutil.Error:
            continue
    return own


def _scheduled() -> tuple[float, float]:
    """Nanoseconds this process's threads ran, and waited to run, so far (0, 0 where Linux does not say)."""
    run = wait = 0.0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return run, wait
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                fields = f.read().split()
            run, wait = run + float(fields[0]), wait + float(fields[1])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
    return run, wait


class LoadMeter:
    """Other processes' share of the CPU (and of the GPU, where NVML tells) between successive samples."""

    def __init__(self, gpu_index: int | None = None):
        self.gpu = _NvmlOthers(gpu_index) if gpu_index is not None else None
        self.last = self._now()

    def _now(self) -> tuple[float, float, float, float, float]:
        busy, total = _busy_and_total()
        run, wait = _scheduled()
        return busy, total, _own_cpu(), run, wait

    def sample(self) -> dict[str, Any]:
        """{"waited": share | None, "other_cpu": share, "gpu_other": share | None} since the previous sample."""
        now = self._now()
        busy, total, own, run, wait = (max(0.0, a - b) for a, b in zip(now, self.last))  # a thread may have ended
        self.last = now
        other = max(0.0, busy - own) / total if total > 0 else 0.0
        waited = round(wait / (run + wait), 4) if run + wait > 0 else None
        return {"waited": waited, "other_cpu": round(min(1.0, other), 4),
                "gpu_other": self.gpu.sample() if self.gpu else None}


class _NvmlOthers:
    """Mean SM utilization of other processes on one GPU since the previous sample (NVML's process samples)."""

    def __init__(self, index: int):
        self.handle, self.seen = None, 0
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._samples()  # the first call sets the timestamp the next one counts from
        except Exception:  # no driver, no GPU, an NVML without per-process samples: nothing to say
            self.handle = None

    def _samples(self) -> list[Any]:
        import pynvml

        try:
            found = pynvml.nvmlDeviceGetProcessUtilization(self.handle, self.seen)
        except pynvml.NVMLError_NotFound:  # no process sampled since: nothing ran on the device
            return []
        if found:
            self.seen = max(s.timeStamp for s in found)
        return list(found)

    def sample(self) -> float | None:
        if self.handle is None:
            return None
        try:
            samples = self._samples()
        except Exception:
            return None
        mine = {os.getpid(), *_children()}
        others = [s.smUtil for s in samples if s.pid not in mine]
        return round(min(1.0, sum(others) / 100.0 / max(1, len({s.timeStamp for s in samples}))), 4) if samples \
            else 0.0


def _children() -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process().children(recursive=True)]
    except psutil.Error:
        return []

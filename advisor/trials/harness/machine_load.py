"""The machine's load from outside the trial, measured beside each steady-state window.

A shared machine's other jobs slow a trial as much as a knob speeds it up; the session can tell the two
apart only if it knows the load changed. `LoadMeter.sample()` says, for the time since its last sample:

- `taken`: the share of the CPU the trial could have used that others took: its threads' and its
  DataLoader workers' run and wait times (Linux's /proc/PID/task/*/schedstat), against what they asked
  for, capped at the cores it may use: 1 − run / min(run + wait, cores × interval). Contention as the
  trial meets it, less what it does to itself: three busy processes on two cores wait a third of their
  time on a machine of their own, and a change of workers is not a change of the machine. On a saturated
  machine other processes' share of the CPU cannot grow, but the trial's wait still does when another job
  starts;
- `waited`: the share of the time the trial process's own threads were ready to run that they spent
  waiting for a CPU (its workers' demand counts as contention here: kept for the record);
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
import time
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


def _scheduled(pid: int) -> tuple[float, float]:
    """Nanoseconds a process's threads ran, and waited to run, so far (0, 0 where Linux does not say)."""
    run = wait = 0.0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return run, wait
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
            run, wait = run + float(fields[0]), wait + float(fields[1])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
    return run, wait


def _tree_scheduled() -> dict[int, tuple[float, float]]:
    """Per process of the trial (itself and its live children: DataLoader workers), nanoseconds its threads
    ran and waited to run so far."""
    return {pid: _scheduled(pid) for pid in (os.getpid(), *_children())}


def taken_share(run_s: float, wait_s: float, cpu_s: float) -> float | None:
    """The share of the CPU time a trial asked for (its run + wait, at most `cpu_s`: its cores × the
    interval) that it did not get: others took it. None where it asked for none."""
    asked = min(run_s + wait_s, cpu_s) if cpu_s > 0 else run_s + wait_s
    if asked <= 0:
        return None
    return round(min(1.0, max(0.0, 1 - run_s / asked)), 4)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class LoadMeter:
    """Other processes' share of the CPU (and of the GPU, where NVML tells) between successive samples."""

    def __init__(self, gpu_index: int | None = None):
        self.gpu = _NvmlOthers(gpu_index) if gpu_index is not None else None
        self.cores = _cores()
        self.last, self.last_tree = self._now(), _tree_scheduled()

    def _now(self) -> tuple[float, float, float, float]:
        busy, total = _busy_and_total()
        return busy, total, _own_cpu(), time.monotonic()

    def _tree_since(self) -> dict[int, tuple[float, float]]:
        """Per process of the trial, seconds its threads ran and waited since the previous sample (a worker
        that started meanwhile counts from its start; one that ended is gone with its last interval)."""
        tree, before = _tree_scheduled(), self.last_tree
        self.last_tree = tree
        spent = {}
        for pid, (r, w) in tree.items():
            r0, w0 = before.get(pid, (0.0, 0.0))
            spent[pid] = (max(0.0, r - r0) / 1e9, max(0.0, w - w0) / 1e9)
        return spent

    def sample(self) -> dict[str, Any]:
        """{"taken": share | None, "waited": share | None, "other_cpu": share, "gpu_other": share | None}
        since the previous sample."""
        now = self._now()
        busy, total, own, elapsed = (max(0.0, a - b) for a, b in zip(now, self.last))
        self.last = now
        spent = self._tree_since()
        run, wait = spent.get(os.getpid(), (0.0, 0.0))  # this process's own threads
        tree_run, tree_wait = sum(r for r, _ in spent.values()), sum(w for _, w in spent.values())
        other = max(0.0, busy - own) / total if total > 0 else 0.0
        waited = round(wait / (run + wait), 4) if run + wait > 0 else None
        return {"taken": taken_share(tree_run, tree_wait, self.cores * elapsed), "waited": waited,
                "other_cpu": round(min(1.0, other), 4), "gpu_other": self.gpu.sample() if self.gpu else None}


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

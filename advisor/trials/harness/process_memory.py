"""This process's memory as the kernel counts it, the one place a trial reads it: the peak and current resident
set, virtual size and writable data (Linux's /proc/self/status), the lifetime peak (getrusage, what a trial
process records), and the reset of /proc's peak that lets an in-process trial measure its own."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

_STATUS_KEYS = {"VmPeak": "peak_vms_bytes", "VmSize": "vms_bytes", "VmHWM": "peak_rss_bytes", "VmRSS": "rss_bytes",
                "VmData": "data_bytes"}


def proc_status_bytes() -> dict[str, int]:
    """Peak and current virtual size, resident set and writable data from /proc/self/status (Linux), in bytes."""
    found = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in _STATUS_KEYS and value.strip().endswith("kB"):
                found[_STATUS_KEYS[key]] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return found


def peak_rss_bytes() -> int:
    """This process's peak resident set size over its life (getrusage's ru_maxrss: KiB on Linux, bytes on macOS);
    since `reset_peak_rss` it is `proc_status_bytes()["peak_rss_bytes"]` (VmHWM)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux VmHWM), so that a trial in a long-lived process measures its own
    peak; False where the kernel does not allow it (the peak is then the process's)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False

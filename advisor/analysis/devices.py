"""The accelerators a trace ran on: as `deviceProperties` describes them, or as its events' names show.

Vendor from the device name (or hip* runtime calls); compute capability from the properties, or for a
device the file does not describe, the lowest the kernel names allow (a kernel built for sm_X runs on X
or newer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from advisor.analysis.events import TraceDocument
from advisor.analysis.validation import is_byte_count
from advisor.errors import TraceError

if TYPE_CHECKING:  # the Trace is built from the devices found here
    from advisor.analysis.trace import Trace


@dataclass(frozen=True)
class Device:
    """An accelerator used in the trace."""

    index: int
    name: str
    vendor: str  # "nvidia" | "amd" | "intel" | another accelerator's name ("mtia") | "unknown"
    total_memory: int | None
    compute_capability: tuple[int, int] | None  # with described=False: the lowest the kernel names allow
    described: bool = True  # False: not in deviceProperties, recognised from the trace's events

    @property
    def capability_text(self) -> str:
        """'8.0'-style compute capability, or '' when unknown."""
        return "" if self.compute_capability is None else "%d.%d" % self.compute_capability


def described_devices(path: Path | str, doc: TraceDocument, runtime_names: set[str],
                      kernel_kinds: set[str]) -> list[Device]:
    """The devices `deviceProperties` (or legacy `computeProperties`) describes; TraceError for properties
    that cannot be real (a compute capability of 300, a memory size that is not one)."""
    key = "deviceProperties" if doc.deviceProperties else "computeProperties"
    props = doc.deviceProperties or doc.computeProperties or []
    amd_events = any(n.startswith("hip") for n in runtime_names) or "Dispatch Kernel" in kernel_kinds
    devices = []
    for i, p in enumerate(props):
        name = p.name or ""
        lowered = name.lower()
        if any(k in lowered for k in ("amd", "radeon", "instinct")) or amd_events:
            vendor = "amd"
        elif "intel" in lowered:
            vendor = "intel"
        elif name:
            vendor = "nvidia"
        else:
            vendor = "unknown"
        major = p.computeMajor if p.computeMajor is not None else p.major
        minor = p.computeMinor if p.computeMinor is not None else p.minor
        if not all(v is None or 0 <= v < 100 for v in (major, minor)):
            raise TraceError(path, f"{key}[{i}] has compute capability {major}.{minor}, not a real one")
        if not is_byte_count(p.totalGlobalMem):
            raise TraceError(path, f"{key}[{i}] has 'totalGlobalMem': {p.totalGlobalMem}, not a memory size")
        cap = (int(major), int(minor or 0)) if major is not None else None
        index = p.id if isinstance(p.id, int) else i
        total = int(p.totalGlobalMem) if p.totalGlobalMem else None
        devices.append(Device(index=index, name=name, vendor=vendor, total_memory=total, compute_capability=cap))
    return devices


# Kernel names say which vendor's libraries built them, and for NVIDIA the architecture they were compiled
# for (a kernel built for sm_X runs on X or newer, so the device is at least the newest X seen).
NVIDIA_KERNEL = re.compile(r"^(?:void )?(?:volta|turing|ampere|hopper|sm_?\d{2,3}a?)_|cutlass|cudnn|cublas|nvjet|xmma")
AMD_KERNEL = re.compile(r"^Cijk_|rocblas|miopen|hipblaslt|_MI\d+x\d+x\d+", re.IGNORECASE)
NVIDIA_ARCHITECTURES = (("volta_", (7, 0)), ("turing_", (7, 5)), ("ampere_", (8, 0)), ("hopper_", (9, 0)))
SM_IN_NAME = re.compile(r"(?:^|[^a-z0-9])sm_?(\d{2,3})a?(?![0-9])|cutlass_(\d{2,3})_")


def vendor_from_names(runtime_names: set[str], kernel_names: set[str]) -> str:
    """'nvidia', 'amd' or 'unknown', from runtime call names (hip*, cuda*) and kernel names."""
    if any(n.startswith("hip") for n in runtime_names) or any(AMD_KERNEL.search(n) for n in kernel_names):
        return "amd"
    if any(n.startswith("cu") for n in runtime_names) or any(NVIDIA_KERNEL.search(n) for n in kernel_names):
        return "nvidia"
    return "unknown"


def capability_from_names(kernel_names: set[str]) -> tuple[int, int] | None:
    """The lowest NVIDIA compute capability the kernel names allow (volta_ → 7.0, sm90_ → 9.0), or None."""
    found = []
    for name in kernel_names:
        found += [cap for prefix, cap in NVIDIA_ARCHITECTURES if name.startswith(prefix)]
        for m in SM_IN_NAME.finditer(name):
            digits = m.group(1) or m.group(2)  # "80" → 8.0, "100" → 10.0
            found.append((int(digits[:-1]), int(digits[-1])))
    return max(found, default=None)


def devices_from_events(trace: Trace, kernel_names: set[str]) -> list[Device]:
    """Devices the events show when the file describes none: vendor and architecture from names."""
    if not trace.has_device_activity:
        return []
    if trace.accelerator not in (None, "cuda"):
        vendor, cap = trace.accelerator, None
    else:
        vendor = vendor_from_names({e.name for e in trace.runtime}, kernel_names)
        cap = capability_from_names(kernel_names) if vendor == "nvidia" else None
        if vendor == "unknown":
            return []
    return [Device(index=i, name="", vendor=vendor, total_memory=None, compute_capability=cap, described=False)
            for i in (trace.used_device_ids or [0])]

"""What a trial runs on — the device, the CPU, RAM, bf16 support — and the memory cap it runs under.

Inside the trial (torch is imported lazily, so the parent can import this module without torch).
"""

from __future__ import annotations

import os
import platform
import resource
from pathlib import Path
from typing import Any

from advisor.trials.harness.process_memory import proc_status_bytes


class SetupProblem(Exception):
    """The trial cannot start (e.g. no CUDA device for --device cuda): a message, no traceback."""


def resolve_device(requested: str) -> str:
    """`auto` -> cuda when a CUDA device is usable, else cpu; `cuda` without one is an error."""
    import torch

    if requested == "cpu":
        return "cpu"
    available = torch.cuda.is_available()
    if requested == "cuda" and not available:
        raise SetupProblem("--device cuda: no CUDA device is available to this process")
    return "cuda" if available else "cpu"


def cpuinfo() -> tuple[str, set[str]]:
    """The CPU's model name and instruction-set flags (Linux /proc/cpuinfo; empty flags elsewhere)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return model, flags


def cpu_facts() -> dict[str, Any]:
    """CPU model, core counts, RAM, the matrix instructions bf16 speed depends on, and this process's nice value."""
    import psutil
    import torch

    model, flags = cpuinfo()
    return {
        "model": model,
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "torch_threads": torch.get_num_threads(),
        "ram_bytes": psutil.virtual_memory().total,
        "bf16_instructions": bf16_instructions(flags, os.environ),
        "niceness": os.nice(0),  # what share of a busy CPU it gets; a trial has the advisor's own, on Ray too
    }


BF16_FLAGS = {"avx512_bf16", "amx_bf16", "amx_tile"}
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) below which oneDNN, which runs torch's CPU matmuls, computes no bf16.
_ONEDNN_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI"}


def bf16_instructions(flags: set[str], environ: Any) -> list[str]:
    """The CPU's bf16 instruction sets that torch will use: none where oneDNN is capped below them."""
    cap = (environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    if cap in _ONEDNN_WITHOUT_BF16:
        return []
    return sorted(flags & BF16_FLAGS)


def cpu_computes_bf16() -> bool:
    """True when this machine's CPU computes bf16 natively (CPU autocast is then worth trying)."""
    return bool(bf16_instructions(cpuinfo()[1], os.environ))


def cuda_computes_bf16() -> bool:
    """True when the current CUDA device computes bf16 natively (compute capability 8.0, Ampere, and later;
    ROCm devices). torch.cuda.is_bf16_supported() also says True where bf16 is only emulated, slower than
    fp32, where the advisor's AMP is fp16 with a GradScaler instead."""
    import torch

    if not torch.cuda.is_available():
        return False
    return bool(torch.version.hip) or torch.cuda.get_device_capability()[0] >= 8


def gpu_facts() -> dict[str, Any]:
    """The CUDA device the step runs on: allocator view, and nvidia-ml-py's view where present."""
    import torch

    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    free, total = torch.cuda.mem_get_info(index)
    facts: dict[str, Any] = {
        "index": index,
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "total_memory_bytes": props.total_memory,
        "free_memory_bytes_at_start": free,
        "bf16_supported": cuda_computes_bf16(),
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            # NVML numbers devices ignoring CUDA_VISIBLE_DEVICES; the PCI bus id names the same GPU.
            try:
                bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
                handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode())
            except (AttributeError, pynvml.NVMLError):  # older torch has no PCI ids
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            facts["nvml"] = {
                "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
                "memory_total_bytes": int(memory.total),
                "memory_used_bytes_at_start": int(memory.used),
            }
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no nvidia-ml-py, no driver, or a container without NVML
        facts["nvml"] = {"unavailable": f"{type(exc).__name__}: {exc}"}
    return facts


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def device_facts(device_type: str) -> dict[str, Any]:
    """What the trial ran on."""
    import torch

    facts = {
        "type": device_type,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_facts(),
    }
    if device_type == "cuda":
        facts["gpu"] = gpu_facts()
    return facts


MMAP_THRESHOLD = 1 << 20  # blocks this large and larger are mapped alone, and unmapped when freed
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h); setting it also stops its dynamic adjustment


def return_freed_blocks(threshold: int) -> bool:
    """Have glibc's malloc map each block of `threshold` bytes or more alone and unmap it when freed; False
    where the C library is not glibc (the allocator is then as it was)."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))


def cap_memory(limit: int, device_type: str) -> dict[str, Any]:
    """Cap the memory the trial may use, and say what was capped.

    On a CUDA device the cap is on device memory (the caching allocator's per-process fraction): the
    host's address space is no measure there, since CUDA's libraries reserve far more of it than they
    use. On the CPU it is RLIMIT_DATA: the process's writable private memory (heap and anonymous
    mappings, where tensors live), which leaves out shared libraries. The limit is set above what the
    process holds already (torch's own libraries: 0.1 GiB for a CPU build, 0.8 GiB for a CUDA build), so
    that the same --memory-limit leaves the script the same room whichever build of torch is installed.

    Under glibc the allocator is first told to give every freed block of 1 MiB or more back to the system
    (`return_freed_blocks`): by default it keeps them on its free lists and raises its own threshold as
    blocks are freed, so that the process's memory read the allocator's history, not what the step holds
    (measured on examples/gpt.py, context 256: batch 16 with checkpointing needed 1.7 GiB, batch 32 without
    1.1 GiB; with blocks given back, 156 and 734 MiB, in the order the tensors say). Fresh blocks fault
    their pages in on first use, so steps run slower under a CPU cap, every trial of the session alike.
    """
    if device_type == "cuda":
        import torch

        index = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(index).total_memory
        fraction = min(1.0, limit / total)
        torch.cuda.set_per_process_memory_fraction(fraction, index)
        return {"device": f"cuda:{index}", "bytes": min(limit, total), "what": "device memory",
                "how": f"torch.cuda.set_per_process_memory_fraction({fraction:.4g}) of {total} bytes"}
    returned = return_freed_blocks(MMAP_THRESHOLD)
    held = proc_status_bytes().get("data_bytes", 0)  # VmData: what RLIMIT_DATA counts
    resource.setrlimit(resource.RLIMIT_DATA, (held + limit, held + limit))
    return {"device": "cpu", "bytes": limit, "held_bytes": held, "freed_blocks_returned": returned,
            "what": "the process's writable memory (heap and anonymous mappings) beyond what torch held before the script ran",
            "how": f"RLIMIT_DATA at {held + limit} bytes"}

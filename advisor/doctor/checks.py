"""The checks of `advisor doctor`. Each runs what it checks for real, in this process (a matmul on the
device, a profiled step, a pinned copy, a tiny torch.compile, a one-rank process group), and says what a
failure breaks in a session and how to fix it. Torch is imported inside the checks.

A check returns `ok(...)` or raises `CheckFailed(summary, fix)`; `run_check` turns both, and any other
exception, into a `Check`. The machine the checks look at (`Machine`) is the device the advisor would use:
--device auto is CUDA where a device is visible, else the CPU.
"""

from __future__ import annotations

import platform
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from advisor.errors import first_line
from advisor.trials.harness.trial_facts import cpu_facts, cuda_computes_bf16, gpu_facts
from advisor.trials.launch.profiler_check import probe, trace_problems

OK, FAILED, SKIPPED = "ok", "failed", "skipped"
GIB = 2**30
PINNED_BYTES = 64 * 2**20

# What a failure of each check breaks in a session (the profiler's own problems say theirs).
BREAKS = {
    "torch": "nothing runs: every trial imports torch",
    "cpu": "the CPU's facts in trial.json (cores, bf16 instructions) are missing",
    "devices": "--device cuda: no trial can run (--device auto runs the trials on the CPU instead)",
    "precision": "AMP trials (bf16 or fp16 autocast) and the tf32 knob may fail",
    "profiler": "the trace of every trial, which every figure of a session comes from",
    "nvml": "trial.json's device facts lack the driver version and the memory other processes held at start",
    "pinned_memory": "the pin_memory knob: trials with pinned DataLoader batches fail",
    "compile": "the compile knob: a trial that compiles runs eagerly, and the session reports compile as "
               "not applicable",
    "data_parallel": "data-parallel trials (--nproc-per-node, or a script that calls init_process_group) cannot "
                     "start their process group",
}


@dataclass
class Check:
    """One line of the doctor's answer."""

    name: str
    status: str  # OK, FAILED or SKIPPED
    summary: str
    needed: bool = False  # the chosen device needs it: its failure makes the exit code 1
    details: dict[str, Any] = field(default_factory=dict)
    breaks: str | None = None  # what its failure breaks in a session
    fix: str | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON form (advisor.doctor/1's `checks`)."""
        return asdict(self)


@dataclass(frozen=True)
class Machine:
    """The device asked for (auto, cpu, cuda) and the one the advisor would use (cpu, cuda)."""

    requested: str
    device: str


class CheckFailed(Exception):
    """A check's failure: what went wrong (one line) and how to fix it."""

    def __init__(self, summary: str, fix: str, breaks: str | None = None, **details: Any):
        super().__init__(summary)
        self.summary, self.fix, self.breaks, self.details = summary, fix, breaks, details


def ok(name: str, summary: str, /, **details: Any) -> Check:
    """A check that passed (positional-only: a detail may itself be called `name`, as NVML's device name is)."""
    return Check(name, OK, summary, details=details)


def skipped(name: str, why: str) -> Check:
    """A check that does not apply to this device."""
    return Check(name, SKIPPED, why)


def cuda_only(name: str, machine: Machine, why: str = "") -> Check:
    """The skip of a check that only a CUDA device needs, on the CPU."""
    where = "--device cpu: no accelerator is used" if machine.requested == "cpu" else "needs a CUDA device"
    return skipped(name, where + why)


def run_check(name: str, function: Callable[[Machine], Check], machine: Machine) -> Check:
    """Run one check, timed; a failure (expected or not) becomes a FAILED Check naming what it breaks."""
    started = time.perf_counter()
    try:
        check = function(machine)
    except CheckFailed as exc:
        check = Check(name, FAILED, exc.summary, details=exc.details, breaks=exc.breaks or BREAKS[name], fix=exc.fix)
    except Exception as exc:  # the check itself met an error: that is the finding
        check = Check(name, FAILED, first_line(exc), breaks=BREAKS[name],
                      fix="the error above comes from torch; `advisor doctor --json` records it with the others")
    check.seconds = round(time.perf_counter() - started, 3)
    return check


# --- the checks ------------------------------------------------------------------------------------------

def cudnn_text(version: int | None) -> str | None:
    """cuDNN's version number as text: 92400 -> 9.24.0, 8902 -> 8.9.2."""
    if not version:
        return None
    if version >= 10000:
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return f"{version // 1000}.{version % 1000 // 100}.{version % 100}"


def torch_build(machine: Machine) -> Check:
    """torch's version and build: CUDA, cuDNN, the GPU architectures it has kernels for."""
    import torch

    cuda = torch.version.cuda
    cudnn = torch.backends.cudnn.version() if cuda and torch.backends.cudnn.is_available() else None
    arch = torch.cuda.get_arch_list() if cuda else []
    summary = f"torch {torch.__version__}, " + (f"CUDA {cuda}" if cuda else "a CPU-only build")
    if cudnn:
        summary += f", cuDNN {cudnn_text(cudnn)}"
    if arch:
        summary += f"; kernels for {' '.join(arch)}"
    return ok("torch", summary, version=torch.__version__, cuda=cuda, cudnn=cudnn_text(cudnn), arch_list=arch,
              git=torch.version.git_version, python=platform.python_version())


def cpu(machine: Machine) -> Check:
    """The CPU: model, cores, torch's threads, RAM, and the bf16 instructions (the product's own detection)."""
    facts = cpu_facts()
    bf16 = facts["bf16_instructions"]
    what = (f"bf16 instructions {' '.join(bf16)}: bf16 autocast is tried on the CPU" if bf16 else
            "no bf16 instructions: bf16 autocast would be emulated on the CPU, so the advisor does not propose it")
    summary = (f"{facts['model']}: {facts['physical_cores']} cores ({facts['logical_cores']} logical), "
               f"{facts['torch_threads']} torch threads, {facts['ram_bytes'] / GIB:.1f} GiB RAM; {what}")
    return ok("cpu", summary, **facts)


def device_supported(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether torch has kernels for a GPU: a cubin of the same major version and no newer minor, or PTX
    (compute_XY) of no newer version, which the driver compiles."""
    major, minor = capability
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        digits = "".join(ch for ch in number if ch.isdigit())
        if len(digits) < 2:
            continue
        arch_major, arch_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and arch_major == major and arch_minor <= minor:
            return True
        if kind == "compute" and (arch_major, arch_minor) <= (major, minor):
            return True
    return False


def devices(machine: Machine) -> Check:
    """The CUDA devices: name, compute capability, memory, and a computation on each."""
    import torch

    if machine.device == "cpu":
        if machine.requested == "cpu":
            return cuda_only("devices", machine)
        return skipped("devices", "no CUDA device: --device auto runs the trials on the CPU")
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            fix = ("this torch is a CPU-only build: install a CUDA build of torch (https://pytorch.org/get-started: "
                   "pip install torch --index-url https://download.pytorch.org/whl/cuXXX)")
        else:
            fix = ("check the driver with nvidia-smi, and that CUDA_VISIBLE_DEVICES does not hide the GPUs; in a "
                   "container, start it with the GPUs (docker run --gpus all)")
        raise CheckFailed("no CUDA device is available to this process", fix, cuda_build=torch.version.cuda)
    arch = torch.cuda.get_arch_list()
    found = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        capability = (props.major, props.minor)
        free, total = torch.cuda.mem_get_info(index)
        entry = {"index": index, "name": props.name, "compute_capability": f"{props.major}.{props.minor}",
                 "total_memory_bytes": total, "free_memory_bytes": free,
                 "multiprocessors": props.multi_processor_count}
        found.append(entry)
        if not device_supported(capability, arch):
            raise CheckFailed(f"torch {torch.__version__} has no kernels for {props.name} (compute capability "
                              f"{props.major}.{props.minor}; it has {' '.join(arch)})",
                              "install a torch build for this GPU's architecture (an older CUDA build for "
                              "older GPUs)", devices=found)
        if torch.ones(1024, device=f"cuda:{index}").sum().item() != 1024:
            raise CheckFailed(f"cuda:{index} computed a wrong sum", "check the GPU and its driver (nvidia-smi -q)",
                              devices=found)
    described = "; ".join(f"cuda:{d['index']} {d['name']} (compute capability {d['compute_capability']}, "
                          f"{d['total_memory_bytes'] / GIB:.1f} GiB, {d['free_memory_bytes'] / GIB:.1f} GiB free)"
                          for d in found)
    return ok("devices", f"{len(found)} CUDA device(s): {described}", devices=found)


def precision(machine: Machine) -> Check:
    """bf16 (native or emulated, and an autocast matmul run) and TF32 (measured on a matmul)."""
    import torch

    a, b = torch.randn(256, 256, device=machine.device), torch.randn(256, 256, device=machine.device)
    if machine.device == "cpu":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            dtype = (a @ b).dtype
        native = bool(cpu_facts()["bf16_instructions"])
        return ok("precision", f"bf16 autocast ran ({dtype}); {'native' if native else 'emulated'} on this CPU; "
                  "no TF32 on the CPU", bf16_native=native, autocast_dtype=str(dtype), tf32=False)
    native = cuda_computes_bf16()
    amp = torch.bfloat16 if native else torch.float16
    with torch.autocast("cuda", dtype=amp):
        dtype = (a @ b).dtype
    major, minor = torch.cuda.get_device_capability()
    details: dict[str, Any] = {"bf16_native": native, "autocast_dtype": str(dtype), "tf32": major >= 8}
    text = f"autocast {str(amp).removeprefix('torch.')} ran ({dtype}); bf16 " + \
        ("native" if native else "not native (the advisor's AMP is fp16 with a GradScaler here)")
    if major >= 8:
        previous = torch.get_float32_matmul_precision()
        try:
            torch.set_float32_matmul_precision("highest")
            exact = a @ b
            torch.set_float32_matmul_precision("high")
            fast = a @ b
        finally:
            torch.set_float32_matmul_precision(previous)
        difference = float(((fast - exact).abs().max() / exact.abs().max()).item())
        details["tf32_difference"] = difference
        text += (f"; TF32 on Tensor Cores (a TF32 matmul differs from fp32 by {difference:.1e}"
                 f"{': in use' if difference > 0 else ', cuBLAS kept fp32 for it'})")
    else:
        text += f"; no TF32 (compute capability {major}.{minor}; Ampere, 8.0, and later have it)"
    return ok("precision", text, **details)


def profiler(machine: Machine) -> Check:
    """A profiled step's trace: CPU operators and memory events; on CUDA, the device's kernels (CUPTI)."""
    with tempfile.TemporaryDirectory(prefix="advisor-doctor-") as folder:
        counts = probe(machine.device, Path(folder))
    problems = trace_problems(counts)
    if problems:
        first = problems[0]
        summary = "; ".join(p.summary for p in problems)
        raise CheckFailed(summary, first.fix, breaks=first.breaks, **counts)
    if machine.device == "cuda":
        summary = (f"a profiled step's trace holds {counts['kernels']} GPU kernels, {counts['copies']} copies and "
                   f"{counts['device_memory_events']} device memory events (CUPTI works)")
    else:
        summary = (f"a profiled step's trace holds {counts['cpu_ops']} CPU operators and "
                   f"{counts['cpu_memory_events']} memory events")
    return ok("profiler", summary, **counts)


def nvml(machine: Machine) -> Check:
    """NVML (nvidia-ml-py) reads the device the trials run on, as a trial's device facts do."""
    if machine.device != "cuda":
        return cuda_only("nvml", machine)
    facts = gpu_facts()["nvml"]
    problem = facts.get("unavailable")
    if problem:
        if problem.startswith(("ModuleNotFoundError", "ImportError")):
            fix = "pip install nvidia-ml-py"
        else:
            fix = ("NVML is the driver's libnvidia-ml.so: in a container the NVIDIA container toolkit mounts it "
                   "(docker run --gpus all, with NVIDIA_DRIVER_CAPABILITIES including utility)")
        raise CheckFailed(f"NVML unreadable: {problem}", fix)
    return ok("nvml", f"NVML reads {facts['name']} (driver {facts['driver']}, "
              f"{facts['memory_used_bytes_at_start'] / GIB:.1f} of {facts['memory_total_bytes'] / GIB:.1f} GiB used)",
              **facts)


def copy_gbps(source: Any, device: str, repeats: int = 3) -> float:
    """Host-to-device bandwidth of `source` (GB/s), the best of `repeats` timed copies."""
    import torch

    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        source.to(device, non_blocking=True)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return source.numel() * source.element_size() / best / 1e9


def pinned_memory(machine: Machine) -> Check:
    """64 MiB of pinned host memory, copied to the device with non_blocking=True and read back unchanged."""
    import torch

    if machine.device != "cuda":
        return cuda_only("pinned_memory", machine, " (pinned memory serves host-to-device copies)")
    try:
        host = torch.randint(0, 256, (PINNED_BYTES,), dtype=torch.uint8).pin_memory()
    except RuntimeError as exc:
        raise CheckFailed(f"pinned memory cannot be allocated: {first_line(exc)}",
                          "pinned memory is locked host RAM: free RAM, or in a container raise its memory limit "
                          "(and --ulimit memlock=-1)") from None
    if not host.is_pinned():
        raise CheckFailed("a pinned allocation is not pinned", "check the CUDA driver (nvidia-smi)")
    moved = host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    if not torch.equal(moved.cpu(), host):
        raise CheckFailed("a non_blocking copy from pinned memory arrived changed", "check the GPU (nvidia-smi -q)")
    pageable_host = torch.empty(host.shape, dtype=host.dtype).copy_(host)  # plain (pageable) host memory
    pinned, pageable = copy_gbps(host, "cuda"), copy_gbps(pageable_host, "cuda")
    return ok("pinned_memory", f"64 MiB pinned; host-to-device {pinned:.1f} GB/s pinned, {pageable:.1f} GB/s "
              "pageable; a non_blocking copy arrived unchanged", pinned_gbps=pinned, pageable_gbps=pageable)


def compile_check(machine: Machine) -> Check:
    """A C++ compiler (and Triton on CUDA) found, and a tiny function really compiled on the device: its
    input size is drawn anew each time, so no cached kernel stands in for the compile."""
    import torch

    details: dict[str, Any] = {}
    if machine.device == "cuda":
        fix = ("Triton compiles the kernels: install the triton that matches torch (torch's CUDA wheels depend on "
               "it), on a GPU of compute capability 7.0 or later; its launcher needs a C compiler (CC, gcc) "
               "and Python's headers (python3-dev)")
        try:
            import triton
        except ImportError as exc:
            raise CheckFailed(f"Triton is not importable: {first_line(exc)}", fix) from None
        details["triton"] = triton.__version__
    else:
        fix = ("install a C++ compiler and Python's headers (Debian/Ubuntu: apt install g++ python3-dev), or "
               "point CXX at one")
        from torch._inductor.cpp_builder import get_cpp_compiler

        try:
            details["compiler"] = get_cpp_compiler()
        except Exception as exc:  # inductor's own search (CXX, then g++) found no working compiler
            raise CheckFailed(f"no C++ compiler for torch.compile: {first_line(exc)}", fix) from None
    import torch._inductor.config as inductor_config

    def function(x):
        return (x.sin() * 2 + 1).relu().sum()

    x = torch.randn(random.randrange(1000, 1_000_000), device=machine.device)
    started = time.perf_counter()
    try:
        with inductor_config.patch(compile_threads=1):  # no pool of compile workers for one kernel
            got = torch.compile(function, dynamic=False)(x)
    except Exception as exc:
        raise CheckFailed(f"torch.compile failed: {first_line(exc)}", fix, **details) from None
    details["compile_s"] = round(time.perf_counter() - started, 2)
    if not torch.allclose(got, function(x), rtol=1e-3, atol=1e-2):
        raise CheckFailed("the compiled function computes another result than the eager one",
                          "report it to PyTorch with `python -m torch.utils.collect_env`", **details)
    what = f"Triton {details['triton']}" if machine.device == "cuda" else details["compiler"]
    return ok("compile", f"torch.compile of a tiny function on {machine.device} ({what}) in {details['compile_s']} s",
              **details)


def data_parallel(machine: Machine) -> Check:
    """A one-rank process group of each backend DDP uses here (gloo; NCCL on CUDA), with an all-reduce."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    fixes = {"gloo": "gloo binds to the host's name: make it resolve (/etc/hosts), or set GLOO_SOCKET_IFNAME "
                     "(e.g. lo on one node)",
             "nccl": "run with NCCL_DEBUG=INFO to see why; in a container give it shared memory (--ipc=host or "
                     "--shm-size=1g)"}
    if not dist.is_available():
        raise CheckFailed("torch.distributed is not available in this torch build", "install an official torch wheel")
    backends = ["gloo"] + (["nccl"] if machine.device == "cuda" else [])
    details: dict[str, Any] = {}
    for backend in backends:
        if not {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available}[backend]():
            raise CheckFailed(f"{backend} is not built into this torch", fixes[backend], **details)
        device = "cuda" if backend == "nccl" else "cpu"
        try:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timedelta(seconds=60))
            try:
                value = torch.ones(4, device=device)
                dist.all_reduce(value)
                total = value.sum().item()
            finally:
                dist.destroy_process_group()
        except Exception as exc:
            raise CheckFailed(f"a one-rank {backend} process group failed: {first_line(exc)}", fixes[backend],
                              **details) from None
        if total != 4:
            raise CheckFailed(f"a one-rank {backend} all-reduce changed its tensor", fixes[backend], **details)
        details[backend] = True
    if machine.device == "cuda":
        version = torch.cuda.nccl.version()
        details["nccl_version"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    names = ", ".join(f"NCCL {details['nccl_version']}" if b == "nccl" else b for b in backends)
    return ok("data_parallel", f"one-rank process groups of {names} ran an all-reduce", **details)


CHECKS: tuple[tuple[str, Callable[[Machine], Check]], ...] = (
    ("torch", torch_build), ("cpu", cpu), ("devices", devices), ("precision", precision), ("profiler", profiler),
    ("nvml", nvml), ("pinned_memory", pinned_memory), ("compile", compile_check), ("data_parallel", data_parallel))
NEEDED = {"torch", "devices", "profiler"}  # without them a session cannot run, or measures wrong figures

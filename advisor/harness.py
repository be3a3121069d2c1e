"""What runs inside a trial's subprocess: the user's script as `__main__`, its step wrapped and profiled.

The parent (`advisor.trial`) starts `python -c "...harness.main(...)" CONFIG_JSON` in a new process
group. Here we:

1. cap memory if asked (`memory_limit`, `cap_memory`), so an oversized trial fails with the allocator's
   error instead of taking the machine down: device memory on a CUDA device, the process's writable
   memory (RLIMIT_DATA) on the CPU;
2. interpose on `DataLoader.__init__` (the DataLoader knobs, and the user's original values);
3. compile the script with `name = __advisor_wrap__(name)` inserted right after every definition of the
   target (an AST rewrite, as pytest does for asserts; line numbers are the user's own);
4. run it as `__main__` in its own folder. Each outermost call of the target is one step: it runs under
   the step knobs (autocast, GradScaler, gradient accumulation, non_blocking), is timed (synchronizing an accelerator), and ends
   with `prof.step()`, so the trace's `ProfilerStep#N` span N is exactly step N (the time since the end
   of the previous step: data loading in the user's loop plus the call);
5. after the last recorded step, raise `TrialComplete` (a BaseException, so `except Exception` in the
   user's loop does not swallow it), stop DataLoader workers and exit.

Memory: the first call runs under an `ActivationRecorder` (bytes saved for backward per module: the
evidence for activation checkpointing). A step that runs out of memory records, before the error
unwinds its frames, where memory was (`StepDriver.memory_breakdown`: parameters, gradients, optimizer
state, activations, rss/vms and CUDA allocator figures); a finished trial records the same at its end.

Results go to files in the trial folder so that nothing is lost if the process is killed: one JSON line
per step in `steps.jsonl` as it ends, and `harness.json` at the end. The parent merges both into
`trial.json`. Torch is imported only inside functions: `locate_target` is also used by the parent.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import gc
import json
import os
import platform
import resource
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any, Callable

from advisor.knobs import Knobs, LoaderRecord, StepInterposition, dataloader_outcomes, install_dataloader_knobs

WRAP_NAME = "__advisor_wrap__"
STEPS_FILE = "steps.jsonl"
RESULT_FILE = "harness.json"
_OUR_FILES = {os.path.abspath(__file__), os.path.abspath(os.path.join(os.path.dirname(__file__), "knobs.py"))}
_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")


class TargetNotFound(Exception):
    """The script has no definition of the target function or method."""


class SetupProblem(Exception):
    """The trial cannot start (e.g. no CUDA device for --device cuda): a message, no traceback."""


class TrialComplete(BaseException):
    """Raised out of the wrapped step once the recorded steps are done; ends the user's script."""


# --------------------------------------------------------------------------------------------------
# Finding and wrapping the target (torch-free: the parent checks the target before starting a trial)


def _bodies(tree: ast.AST):
    """Every statement list in the tree, with the node that owns it."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield node, body
        for handler in getattr(node, "handlers", []) or []:
            yield handler, handler.body


def locate_target(tree: ast.Module, target: str) -> list[tuple[list[ast.stmt], int]]:
    """Where the target is defined: (statement list, index) of each definition; raises TargetNotFound.

    `name` is a function defined anywhere except directly in a class; `Class.method` is a method in
    the body of a class of that name.
    """
    parts = target.split(".")
    if len(parts) > 2 or not all(p.isidentifier() for p in parts):
        raise TargetNotFound(f"{target!r} is not a function name or Class.method")
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    found = []
    if len(parts) == 1:
        for owner, body in _bodies(tree):
            if isinstance(owner, ast.ClassDef):
                continue
            found += [(body, i) for i, s in enumerate(body) if isinstance(s, funcs) and s.name == target]
    else:
        cls_name, method = parts
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls_name:
                found += [(node.body, i) for i, s in enumerate(node.body) if isinstance(s, funcs) and s.name == method]
    if not found:
        raise TargetNotFound(_not_found_message(tree, target))
    return found


def _not_found_message(tree: ast.Module, target: str) -> str:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names += [f"{node.name}.{s.name}" for s in node.body if isinstance(s, ast.FunctionDef)]
    methods = {n.split(".")[1] for n in names}
    names += sorted(
        {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name not in methods}
    )
    available = ", ".join(names[:12]) or "none"
    return f"no function {target!r} is defined (functions found: {available})"


def rewrite_script(source: str, filename: str, target: str) -> types.CodeType:
    """Compile the script with `name = __advisor_wrap__(name, 'target')` after each target definition."""
    tree = ast.parse(source, filename=filename)
    sites = locate_target(tree, target)
    # Insert from the end of each body so earlier indexes stay valid.
    for body, index in sorted(sites, key=lambda site: (id(site[0]), -site[1])):
        definition = body[index]
        name = definition.name
        wrap = ast.parse(f"{name} = {WRAP_NAME}({name}, {target!r})").body[0]
        for node in ast.walk(wrap):
            node.lineno = node.end_lineno = definition.end_lineno or definition.lineno
            node.col_offset = node.end_col_offset = 0
        body.insert(index + 1, wrap)
    return compile(tree, filename, "exec", dont_inherit=True)


# --------------------------------------------------------------------------------------------------
# Facts, memory and errors


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
    """CPU model, core counts, RAM and the matrix instructions bf16 speed depends on."""
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
        "bf16_supported": torch.cuda.is_bf16_supported(),
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


def cap_memory(limit: int, device_type: str) -> dict[str, Any]:
    """Cap the memory the trial may use, and say what was capped.

    On a CUDA device the cap is on device memory (the caching allocator's per-process fraction): the
    host's address space is no measure there, since CUDA's libraries reserve far more of it than they
    use. On the CPU it is RLIMIT_DATA: the process's writable private memory (heap and anonymous
    mappings, where tensors live), which leaves out shared libraries and untouched reservations.
    """
    if device_type == "cuda":
        import torch

        index = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(index).total_memory
        fraction = min(1.0, limit / total)
        torch.cuda.set_per_process_memory_fraction(fraction, index)
        return {"device": f"cuda:{index}", "bytes": min(limit, total), "what": "device memory",
                "how": f"torch.cuda.set_per_process_memory_fraction({fraction:.4g}) of {total} bytes"}
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return {"device": "cpu", "bytes": limit, "what": "the process's writable memory (heap and anonymous mappings)",
            "how": "RLIMIT_DATA"}


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (Linux reports KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA OOM, Python's MemoryError, or the CPU allocator's RuntimeError."""
    import torch

    oom_types: tuple[type, ...] = (MemoryError,)
    if hasattr(torch, "OutOfMemoryError"):
        oom_types += (torch.OutOfMemoryError,)
    if isinstance(exc, oom_types):
        return True
    text = str(exc).lower()
    if isinstance(exc, RuntimeError) and "dataloader worker" in text and "killed" in text:
        return True  # a worker ended by the kernel's out-of-memory killer
    return isinstance(exc, RuntimeError) and any(t in text for t in _OOM_TEXT)


def user_traceback(exc: BaseException) -> str:
    """The traceback as the user would see it running their script: our frames left out."""
    te = traceback.TracebackException.from_exception(exc)
    pending, seen = [te], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        frames = [f for f in current.stack if os.path.abspath(f.filename) not in _OUR_FILES]
        frames = [f for f in frames if not f.filename.startswith("<string>")]
        current.stack = traceback.StackSummary.from_list(frames)
        pending += [c for c in (current.__cause__, current.__context__) if c is not None]
    return "".join(te.format())


def find_batch_size(args: tuple, kwargs: dict) -> int | None:
    """The leading dimension of the first tensor among the step's arguments (looking one level in)."""
    import torch

    def first_tensor(values, depth=0):
        for value in values:
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                return value
            if depth < 2 and isinstance(value, (list, tuple)):
                found = first_tensor(value, depth + 1)
            elif depth < 2 and isinstance(value, dict):
                found = first_tensor(value.values(), depth + 1)
            else:
                continue
            if found is not None:
                return found
        return None

    tensor = first_tensor(list(args) + list(kwargs.values()))
    return int(tensor.shape[0]) if tensor is not None else None


def loss_value(result: Any) -> float | None:
    """A scalar loss from what the step returned: a number, a one-element tensor, or the first one
    in a tuple/list or under the key `loss`."""
    import torch

    if isinstance(result, dict):
        result = result.get("loss")
    elif isinstance(result, (tuple, list)) and result:
        result = result[0]
    if isinstance(result, torch.Tensor) and result.numel() == 1:
        return float(result.detach().float().item())
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        return float(result)
    return None


# --------------------------------------------------------------------------------------------------
# Where memory goes: tensors of the model and optimizer, activations per module


def proc_status_bytes() -> dict[str, int]:
    """Peak and current virtual size, resident set and writable data from /proc/self/status (Linux), in bytes."""
    keys = {"VmPeak": "peak_vms_bytes", "VmSize": "vms_bytes", "VmHWM": "peak_rss_bytes", "VmRSS": "rss_bytes",
            "VmData": "data_bytes"}
    found = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in keys and value.strip().endswith("kB"):
                found[keys[key]] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return found


def tensor_bytes(tensor: Any) -> int:
    """Bytes of a dense tensor's elements (0 for what has no plain storage)."""
    try:
        return tensor.numel() * tensor.element_size()
    except (RuntimeError, TypeError, AttributeError):
        return 0


def model_tensor_bytes(device_type: str) -> dict[str, Any]:
    """Bytes of parameters, their gradients and optimizer state on the step's device.

    Optimizers and modules are found with one garbage-collector scan; parameters are those of every
    module and every optimizer's param_groups, each counted once.
    """
    import torch

    optimizers, modules = [], []
    for obj in gc.get_objects():
        kind = type(obj)
        if issubclass(kind, torch.optim.Optimizer):
            optimizers.append(obj)
        elif issubclass(kind, torch.nn.Module):
            modules.append(obj)
    params: dict[int, Any] = {}
    for module in modules:
        for param in module.parameters(recurse=False):
            params[id(param)] = param
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for param in group["params"]:
                params[id(param)] = param
    state: dict[int, Any] = {}
    for optimizer in optimizers:
        for values in optimizer.state.values():
            for value in values.values() if isinstance(values, dict) else ():
                if isinstance(value, torch.Tensor):
                    state[id(value)] = value

    def on_device(tensors):
        return sum(tensor_bytes(t) for t in tensors if t is not None and t.device.type == device_type)

    return {
        "parameters": on_device(params.values()),
        "gradients": on_device(p.grad for p in params.values()),
        "optimizer_state": on_device(state.values()),
        "optimizers_found": len(optimizers),
        "modules_found": len(modules),
    }


def _never_fails(hook: Callable[..., None]) -> Callable[..., None]:
    """A module hook whose errors are swallowed: a measurement must never break the user's step."""

    def safe(*args: Any) -> None:
        try:
            hook(*args)
        except Exception:
            pass

    return safe


class ActivationRecorder:
    """For one step: the bytes autograd saves for backward, attributed to every module running then.

    Saved tensors (what a forward keeps for its backward: the activation memory that activation
    checkpointing frees) are seen through `torch.autograd.graph.saved_tensors_hooks`; global module
    forward pre-hooks and hooks keep the stack of modules whose forward is running. Each storage is
    counted once per module and once in the total; parameters and buffers are not activations.
    Module output bytes are recorded too. Storages are told apart by address, so a second forward after
    a backward in the same step may be undercounted.
    """

    def __init__(self):
        self.stack: list[Any] = []
        self.names: dict[int, str] = {}
        self.roots: set[int] = set()
        self.modules: dict[int, dict[str, Any]] = {}
        self.seen: dict[int, set[int]] = {}
        self.total_seen: set[int] = set()
        self.excluded: set[int] = set()
        self.saved_bytes = 0
        self.active = False
        self._exit: Any = None

    def __enter__(self) -> "ActivationRecorder":
        import torch
        from torch.nn.modules import module as module_hooks

        handles = [
            module_hooks.register_module_forward_pre_hook(_never_fails(self._pre)),
            module_hooks.register_module_forward_hook(_never_fails(self._post), always_call=True),
        ]
        saved = torch.autograd.graph.saved_tensors_hooks(self._pack_safely, lambda tensor: tensor)
        saved.__enter__()
        self.active = True

        def close():
            saved.__exit__(None, None, None)
            for handle in handles:
                handle.remove()

        self._exit = close
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            self.active = False
            self._exit()
        self.stack.clear()

    def _entry(self, module: Any) -> dict[str, Any]:
        key = id(module)
        if key not in self.modules:
            cls = type(module)
            self.modules[key] = {"name": self.names.get(key, cls.__name__), "class": cls.__name__,
                                 "module": cls.__module__, "calls": 0, "bytes": 0, "output_bytes": 0,
                                 "leaf": next(module.children(), None) is None,
                                 # inside another module of its class: that one's bytes already hold its own
                                 "nested": any(type(m) is cls for m in self.stack)}
            self.seen[key] = set()
        return self.modules[key]

    def _pre(self, module: Any, args: Any) -> None:
        if not self.stack and id(module) not in self.names:
            # The outermost module called: its submodules get their qualified names from it.
            self.roots.add(id(module))
            for name, sub in module.named_modules():
                self.names.setdefault(id(sub), name or type(module).__name__)
        for tensor in [*module._parameters.values(), *module._buffers.values()]:
            if tensor is not None:
                try:
                    self.excluded.add(tensor.untyped_storage().data_ptr())
                except (RuntimeError, TypeError):
                    pass
        self._entry(module)["calls"] += 1
        self.stack.append(module)

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if self.stack and self.stack[-1] is module:
            self.stack.pop()
        outputs = output if isinstance(output, (tuple, list)) else (
            list(output.values()) if isinstance(output, dict) else [output])
        self._entry(module)["output_bytes"] += sum(tensor_bytes(o) for o in outputs if hasattr(o, "element_size"))

    def _pack_safely(self, tensor: Any) -> Any:
        try:
            self._pack(tensor)
        except Exception:  # a measurement must never break the user's step
            pass
        return tensor

    def _pack(self, tensor: Any) -> None:
        try:
            storage = tensor.untyped_storage()
            address, size = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, TypeError, NotImplementedError):
            return
        if address in self.excluded or size == 0:
            return
        if address not in self.total_seen:
            self.total_seen.add(address)
            self.saved_bytes += size
        for module in {id(m): m for m in self.stack}.values():
            seen = self.seen[id(module)]
            if address not in seen:
                seen.add(address)
                self.modules[id(module)]["bytes"] += size

    def safe_summary(self, step: int, complete: bool) -> dict[str, Any] | None:
        """`summary` with `complete` set, or None if it cannot be built: never hides the step's own error."""
        try:
            return dict(self.summary(step), complete=complete)
        except Exception:
            return None

    def summary(self, step: int, top: int = 10) -> dict[str, Any]:
        """`summary.activations`: the largest modules and module classes by activation bytes."""
        total = self.saved_bytes
        share = (lambda value: round(value / total, 4) if total else None)
        # A lone outermost module is the whole model (all of it, nothing to choose); outermost modules
        # of a repeated class (blocks the user's code calls one by one) are candidates like any other.
        root_classes = [self.modules[key]["class"] for key in self.roots if key in self.modules]
        inner = [dict(m, share=share(m["bytes"])) for key, m in self.modules.items()
                 if key not in self.roots or root_classes.count(m["class"]) > 1]
        by_class: dict[tuple[str, str], dict[str, Any]] = {}
        for m in inner:
            if m["nested"]:
                continue
            entry = by_class.setdefault((m["module"], m["class"]), {
                "class": m["class"], "module": m["module"], "count": 0, "calls": 0, "bytes": 0,
                "output_bytes": 0, "leaf": m["leaf"], "names": []})
            entry["count"] += 1
            entry["calls"] += m["calls"]
            entry["bytes"] += m["bytes"]
            entry["output_bytes"] += m["output_bytes"]
            entry["names"].append(m["name"])
        classes = sorted(by_class.values(), key=lambda e: -e["bytes"])
        for entry in classes:
            entry["share"] = share(entry["bytes"])
            entry["names"] = entry["names"][:8]
        # What activation checkpointing would wrap: a repeated module with submodules of its own
        # (checkpointing a single layer frees little: its input is kept anyway).
        candidates = [e["class"] for e in classes if e["count"] >= 2 and not e["leaf"] and e["bytes"]]
        return {
            "step": step,
            "saved_bytes": total,
            "roots": sorted(self.modules[key]["class"] for key in self.roots if key in self.modules),
            "checkpoint_candidates": candidates[:3],
            "by_class": classes[:top],
            "by_module": sorted(inner, key=lambda m: -m["bytes"])[:top],
            "source": "tensors autograd saved for backward in one step (saved_tensors_hooks), each counted "
                      "once per module whose forward was running; parameters and buffers left out",
        }


# --------------------------------------------------------------------------------------------------
# The step driver


class StepDriver:
    """Wraps the target; turns each outermost call into one timed, profiled step."""

    def __init__(self, config: dict[str, Any], device_type: str, loader_records: list[LoaderRecord]):
        import psutil

        self.out_dir = Path(config["out_dir"])
        self.wait, self.warmup, self.active = config["wait"], config["warmup"], config["active"]
        self.total = self.wait + self.warmup + self.active  # the profiled part, measurement aside
        measure = config.get("measure") or {}
        self.windows = int(measure.get("windows") or 0)
        self.window_s = float(measure.get("window_s") or 0.0)
        self.queue_depth = 0  # batches the loader's workers queue before the first step, known at the first step
        self.settle = 0
        self.window = 0  # the measurement window being filled, and its steps and seconds so far
        self.window_steps = 0
        self.window_wall = 0.0
        self.min_window_steps = 2
        self.done = False
        self.use_profiler = config.get("profile", True)
        self.device_type = device_type
        self.interposition = StepInterposition(Knobs.from_dict(config["knobs"]), device_type, loader_records)
        self.loader_records = loader_records
        self.process = psutil.Process()
        self.index = 0
        self.depth = 0
        self.failed_step: int | None = None
        self.prof = None
        self.period_start = 0.0
        self.times: dict[str, float] = {}
        # Activations are recorded in the first call: not a recorded step unless wait + warmup is 0.
        self.activation_step = 0
        self.activations: dict[str, Any] | None = None
        self.failure_memory: dict[str, Any] | None = None
        self.end_memory: dict[str, Any] | None = None
        self.steps_file = open(self.out_dir / STEPS_FILE, "a", buffering=1)

    def wrap(self, fn: Any, target: str) -> Any:
        """What `__advisor_wrap__` does to each definition of the target."""
        if isinstance(fn, (staticmethod, classmethod)):
            return type(fn)(self.wrap(fn.__func__, target))
        if not callable(fn):
            return fn

        @functools.wraps(fn)
        def step(*args, **kwargs):
            if self.depth:  # a recursive or nested call is part of the current step
                return fn(*args, **kwargs)
            self.depth += 1
            try:
                return self.run_step(fn, args, kwargs)
            except TrialComplete:
                raise
            except BaseException as exc:
                self.failed_step = self.index  # the message says which step failed
                if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    self.record_failure_memory(exc)  # while the traceback still holds the step's tensors
                raise
            finally:
                self.depth -= 1

        return step

    def _synchronize(self) -> None:
        if self.device_type == "cuda":
            import torch

            torch.cuda.synchronize()

    def schedule(self) -> dict[str, Any]:
        """The steps each phase took: skipped (the first `wait`, and the queue the workers filled before
        the first step), warmed up, profiled, settled (the queue refilled while the trace was written),
        then measured in windows."""
        return {"wait": self.wait, "warmup": self.warmup, "active": self.active, "queue_depth": self.queue_depth,
                "settle": self.settle, "windows": self.windows, "window_s": self.window_s,
                "min_window_steps": self.min_window_steps, "windows_measured": self.window}

    def phase(self, index: int) -> str:
        """`wait`, `warmup`, `profiled`, `settle` or `window` for the step with this index."""
        if index < self.wait:
            return "wait"
        if index < self.wait + self.warmup:
            return "warmup"
        if index < self.total:
            return "profiled"
        return "settle" if index < self.total + self.settle else "window"

    def _queue(self) -> int:
        """Batches the DataLoader's workers prepare ahead (workers × prefetch_factor) for the last loader built."""
        if not self.loader_records:
            return 0
        effective = self.loader_records[-1].effective
        workers = effective.get("num_workers") or 0
        return workers * (effective.get("prefetch_factor") or 2) if workers > 0 else 0

    def _start(self) -> None:
        import torch

        # The batches the workers queued before the first step make the loader look free while the step
        # eats them: they are skipped before profiling, and again after it (the queue refills while the
        # trace is written). A window spans at least one cycle of the workers.
        self.queue_depth = self._queue()
        self.wait += self.queue_depth
        self.total += self.queue_depth
        self.settle = self.queue_depth if self.windows else 0
        workers = (self.loader_records[-1].effective.get("num_workers") or 0) if self.loader_records else 0
        self.min_window_steps = max(2, workers)
        self.times["first_step_at"] = time.time()
        if self.use_profiler:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device_type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(
                activities=activities,
                schedule=torch.profiler.schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
                on_trace_ready=torch.profiler.tensorboard_trace_handler(
                    str(self.out_dir), worker_name="trial", use_gzip=True
                ),
                record_shapes=True,
                profile_memory=True,
            )
            self.prof.start()
        self.period_start = time.perf_counter()

    def run_step(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        """One step: knobs around the call, timing, `prof.step()`, the step's record."""
        if self.done:
            raise TrialComplete()
        if self.index == 0:
            self._start()
        if self.index == self.wait + self.warmup and self.device_type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
        entered = time.perf_counter()
        recorder = ActivationRecorder() if self.index == self.activation_step else None
        try:
            with self.interposition.step(args, kwargs), (recorder or contextlib.nullcontext()):
                result = fn(*args, **kwargs)
            if recorder is not None:
                self.activations = recorder.safe_summary(self.index, complete=True)
        finally:
            if recorder is not None and self.activations is None:
                self.activations = recorder.safe_summary(self.index, complete=False)  # up to the failure
        self._synchronize()
        ended = time.perf_counter()
        wall, call = ended - self.period_start, ended - entered
        if self.prof is not None:
            self.prof.step()  # ends span ProfilerStep#index; a trace is exported after the last one
        phase = self.phase(self.index)
        window = self.window if phase == "window" else None
        self.record(self.index, wall, call, args, kwargs, result, phase, window)
        self.index += 1
        if self.index == self.total:
            self.finish()  # the profiler's part is over; measurement (if any) runs without it
            self.done = not self.windows
        if phase == "window":
            self.window_steps += 1
            self.window_wall += wall
            if self.window_wall >= self.window_s and self.window_steps >= self.min_window_steps:
                self.window, self.window_steps, self.window_wall = self.window + 1, 0, 0.0
                self.done = self.window >= self.windows
        self.period_start = time.perf_counter()
        if self.done:
            try:
                self.end_memory = self.memory_breakdown("end")
            except Exception as exc:  # a figure we could not take must not fail a finished trial
                self.end_memory = {"when": "end", "unavailable": f"{type(exc).__name__}: {exc}"}
            self.finish()
            raise TrialComplete()
        return result

    def completed_message(self) -> str:
        """What a trial whose steps all ran says it measured."""
        text = f"{self.active} steps profiled"
        if self.windows:
            text += f", then {self.window} window(s) of at least {self.window_s:g} s measured"
        return text

    def script_ended(self, script: str, target: str) -> dict[str, str]:
        """Status and message when the script returned on its own: ok once the profiled steps ran (with the
        windows it got), an error before."""
        if self.index >= self.total:
            return {"status": "ok", "message": f"{self.completed_message()}; {script} ended after "
                                               f"{self.window} of {self.windows} measurement window(s)"}
        return {"status": "error",
                "message": f"{script} finished after {self.index} call(s) of {target}; the trial needs "
                           f"{self.total} (wait {self.wait} + warmup {self.warmup} + record {self.active})"}

    def record_failure_memory(self, exc: BaseException) -> None:
        """On an out-of-memory error in a step: where memory was at the failure."""
        try:
            if is_out_of_memory(exc):
                self.failure_memory = self.memory_breakdown("at failure")
        except Exception as problem:  # little memory left, or a torch without these counters
            self.failure_memory = {"when": "at failure", "unavailable": f"{type(problem).__name__}: {problem}"}

    def memory_breakdown(self, when: str) -> dict[str, Any]:
        """Bytes of parameters, gradients, optimizer state and activations (estimated), with the totals.

        On CUDA activations are the rest of the allocator's figure (allocated now at a failure, the peak
        at the end); on the CPU, where no allocator figure exists, they are the bytes saved for
        backward in the recorded step.
        """
        breakdown: dict[str, Any] = {"when": when, **model_tensor_bytes(self.device_type), **proc_status_bytes()}
        known = breakdown["parameters"] + breakdown["gradients"] + breakdown["optimizer_state"]
        saved = self.activations["saved_bytes"] if self.activations else None
        breakdown["activations_saved_bytes"] = saved
        if self.device_type == "cuda":
            import torch

            allocated = torch.cuda.memory_allocated()
            breakdown.update(
                cuda_allocated_bytes=allocated,
                cuda_reserved_bytes=torch.cuda.memory_reserved(),
                cuda_max_allocated_bytes=torch.cuda.max_memory_allocated(),
            )
            reference = allocated if when == "at failure" else breakdown["cuda_max_allocated_bytes"]
            breakdown["activations"] = max(0, reference - known)
            breakdown["activations_source"] = (
                "estimated: torch.cuda." + ("memory_allocated" if when == "at failure" else "max_memory_allocated")
                + " minus parameters, gradients and optimizer state")
            breakdown["total_bytes"], breakdown["source"] = reference, "CUDA caching allocator"
        else:
            breakdown["activations"] = saved
            partial = " (partial: that step failed)" if self.activations and not self.activations.get("complete") else ""
            breakdown["activations_source"] = (
                f"estimated: tensors saved for backward in step {self.activations['step']}{partial}"
                if self.activations else None)
            breakdown["total_bytes"] = breakdown.get("rss_bytes")
            breakdown["source"] = "process resident set (includes the framework itself); tensors summed by type"
        return breakdown

    def record(self, index: int, wall: float, call: float, args: tuple, kwargs: dict, result: Any,
               phase: str = "profiled", window: int | None = None) -> None:
        """Append the step's JSON line (flushed, so a killed trial keeps its finished steps)."""
        batch = find_batch_size(args, kwargs)
        batch_source = "step arguments"
        memory = self.process.memory_info()
        if batch is None and self.loader_records:
            batch, batch_source = self.loader_records[-1].effective.get("batch_size"), "DataLoader"
        step = {
            "index": index,
            "wall_s": wall,
            "call_s": call,
            "recorded": phase == "profiled",
            "phase": phase,
            "batch_size": batch,
            "batch_size_source": batch_source if batch is not None else None,
            "loss": loss_value(result),
            "rss_bytes": memory.rss,
            "vms_bytes": memory.vms,
            "data_bytes": getattr(memory, "data", None),  # what a CPU memory_limit (RLIMIT_DATA) counts
        }
        if window is not None:
            step["window"] = window
        if self.device_type == "cuda":
            import torch

            step["cuda_allocated_bytes"] = torch.cuda.memory_allocated()
            step["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
            step["cuda_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
        self.steps_file.write(json.dumps(step) + "\n")

    def finish(self) -> None:
        """Stop the profiler (the trace is already written by then)."""
        self.times["last_step_at"] = time.time()
        if self.prof is not None:
            self.prof.stop()
            self.prof = None

    def close(self, result: dict[str, Any]) -> dict[str, str]:
        """Stop the profiler and write what the steps measured into a trial result; returns the step
        interposition's knob outcomes (those decided while the steps ran and after them)."""
        try:
            self.finish()
        except Exception as exc:  # a profiler that cannot stop must not hide the trial's result
            result["profiler_stop_error"] = f"{type(exc).__name__}: {exc}"
        self.steps_file.close()
        result["memory"] = self.memory()
        result["schedule"] = self.schedule()
        result.setdefault("times", {}).update(self.times)
        return {**self.interposition.outcomes, **self.interposition.outcomes_after_steps()}

    def memory(self) -> dict[str, Any]:
        """Peak memory as the process and the allocator saw it."""
        memory: dict[str, Any] = {"peak_rss_bytes": peak_rss_bytes()}
        if "peak_vms_bytes" in (status := proc_status_bytes()):
            memory["peak_vms_bytes"] = status["peak_vms_bytes"]
        if self.device_type == "cuda":
            import torch

            free, total = torch.cuda.mem_get_info()
            memory.update(
                cuda_max_allocated_bytes=torch.cuda.max_memory_allocated(),
                cuda_max_reserved_bytes=torch.cuda.max_memory_reserved(),
                cuda_free_bytes_at_end=free,
                cuda_total_bytes=total,
            )
        return memory


# --------------------------------------------------------------------------------------------------
# Entry point


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON via a temporary file and a rename: readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def stop_children() -> None:
    """End every process this one started (DataLoader workers): terminate, then kill."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=2)
    for child in alive:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def run(config: dict[str, Any]) -> dict[str, Any]:
    """Run the user's script under the config; return the harness result (written by `main`)."""
    script = os.path.abspath(config["script"])
    target = config["target"]
    result: dict[str, Any] = {"status": "error", "message": "", "steps_expected": None}
    driver = None
    loader_records: list[LoaderRecord] = []
    started = time.time()
    try:
        device_type = resolve_device(config["device"])
        result["device"] = device_facts(device_type)
        if config.get("memory_limit"):
            result["memory_cap"] = cap_memory(int(config["memory_limit"]), device_type)
        knobs = Knobs.from_dict(config["knobs"])
        install_dataloader_knobs(knobs, accelerator=device_type != "cpu", records=loader_records)
        driver = StepDriver(config, device_type, loader_records)
        result["steps_expected"] = driver.total
        source = Path(script).read_text()
        code = rewrite_script(source, script, target)
        module = types.ModuleType("__main__")
        module.__dict__.update(
            __file__=script, __builtins__=builtins, __spec__=None, __loader__=None, __package__=None
        )
        setattr(module, WRAP_NAME, driver.wrap)
        sys.modules["__main__"] = module
        sys.argv = [script, *config.get("script_args", [])]
        sys.path[0] = os.path.dirname(script)
        os.chdir(os.path.dirname(script))
        result["times"] = {"setup_s": time.time() - started}
        try:
            exec(code, module.__dict__)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
        driver.finish()
        result.update(driver.script_ended(os.path.basename(script), target))
    except TrialComplete:
        result.update(status="ok", message=driver.completed_message())
    except TargetNotFound as exc:
        result.update(status="target-not-found", message=str(exc))
    except SetupProblem as exc:
        result.update(status="error", message=str(exc))
    except BaseException as exc:  # the user's error, an OOM, or SIGINT inside the child
        step = f" in step {driver.failed_step}" if driver is not None and driver.failed_step is not None else ""
        try:
            oom = is_out_of_memory(exc)
        except Exception:
            oom = isinstance(exc, MemoryError)
        if oom and driver is not None and driver.failure_memory is None:
            driver.record_failure_memory(exc)  # out of memory outside a step (e.g. loading data)
        if isinstance(exc, KeyboardInterrupt):
            status = "interrupted"
        elif oom:
            status = "oom"
        else:
            status = "error"
        if isinstance(exc, SystemExit):
            text = f"{os.path.basename(script)} exited with code {exc.code}"
        else:
            first = (str(exc).strip().splitlines() or [""])[0]
            text = f"{type(exc).__name__}{step}: {first}" if first else f"{type(exc).__name__}{step}"
        result.update(status=status, message=text, error_type=type(exc).__name__, traceback=user_traceback(exc))
    finally:
        if driver is not None:
            step_outcomes = driver.close(result)
            result["outcomes"] = {**dataloader_outcomes(driver.interposition.knobs, loader_records), **step_outcomes}
            result["dataloaders"] = [
                {"user": r.user, "effective": r.effective, "outcomes": r.outcomes} for r in loader_records
            ]
            result["accumulation"] = driver.interposition.accumulation_record()
            result["memory_breakdown"] = driver.failure_memory or driver.end_memory
            result["activations"] = driver.activations
    result.setdefault("times", {})["harness_s"] = time.time() - started
    return result


def main(argv: list[str]) -> int:
    """`harness CONFIG_JSON`: run one trial and write `harness.json` into its folder."""
    config = json.loads(argv[0])
    out_dir = Path(config["out_dir"])
    result = run(config)
    gc.collect()  # drops the finished script's DataLoader iterators, whose workers then exit
    write_json_atomic(out_dir / RESULT_FILE, result)
    stop_children()
    sys.stdout.flush()
    sys.stderr.flush()
    # The user's non-daemon threads or atexit hooks must not keep a finished trial alive.
    os._exit(0)


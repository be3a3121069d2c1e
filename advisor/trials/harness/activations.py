"""Where a trial's memory goes: the process's figures, the tensors of the model and optimizer, and the
activations each module saves for backward. Inside the trial only (torch imported lazily)."""

from __future__ import annotations

import gc
from typing import Any, Callable

from advisor.trials.harness.process_memory import proc_status_bytes

_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")


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
    """A module hook whose errors are swallowed: a measurement must never break the user's step. Inside a
    region torch.compile traces (a model the script compiled itself) it does nothing: dynamo would trace
    the recorder's own state into the graph, and refuses to."""
    import torch

    def safe(*args: Any) -> None:
        if torch.compiler.is_compiling():
            return
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


def parameter_dtypes() -> dict[str, int]:
    """Bytes of the live modules' parameters by dtype (autocast leaves float64 alone: AMP advice needs this)."""
    import torch

    found: dict[int, Any] = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.nn.Module):
            for param in obj.parameters(recurse=False):
                found[id(param)] = param
    by_dtype: dict[str, int] = {}
    for param in found.values():
        name = str(param.dtype).removeprefix("torch.")
        by_dtype[name] = by_dtype.get(name, 0) + tensor_bytes(param)
    return by_dtype


def memory_breakdown(when: str, device_type: str, activations: dict[str, Any] | None) -> dict[str, Any]:
    """Bytes of parameters, gradients, optimizer state and activations (estimated), with the totals.

    On CUDA activations are the rest of the allocator's figure (allocated now at a failure, the peak
    at the end); on the CPU, where no allocator figure exists, they are the bytes saved for backward
    in the first step (`activations`, the ActivationRecorder's summary).
    """
    breakdown: dict[str, Any] = {"when": when, **model_tensor_bytes(device_type), **proc_status_bytes()}
    known = breakdown["parameters"] + breakdown["gradients"] + breakdown["optimizer_state"]
    saved = activations["saved_bytes"] if activations else None
    breakdown["activations_saved_bytes"] = saved
    if device_type == "cuda":
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
        partial = " (partial: that step failed)" if activations and not activations.get("complete") else ""
        breakdown["activations_source"] = (
            f"estimated: tensors saved for backward in step {activations['step']}{partial}"
            if activations else None)
        breakdown["total_bytes"] = breakdown.get("rss_bytes")
        breakdown["source"] = "process resident set (includes the framework itself); tensors summed by type"
    return breakdown

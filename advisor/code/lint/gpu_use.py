"""Rules about how the script uses the GPU: float16 BatchNorm, DataParallel, emptying the allocator's
cache every step."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from advisor.code.lint.loops import step_loop
from advisor.code.lint.names import DTYPE_HALF
from advisor.code.lint.script import Script
from advisor.code.lint.ast_nodes import is_backward, last_part, source_of


def _half_conversion(script: Script, call: ast.Call) -> bool:
    """`.half()`, `.to(torch.float16)`, `.to(dtype=torch.half)`, `.type(torch.float16)`."""
    if not isinstance(call.func, ast.Attribute):
        return False
    if call.func.attr == "half" and not call.args:
        return True
    if call.func.attr in {"to", "type"}:
        candidates = list(call.args) + [kw.value for kw in call.keywords if kw.arg in {"dtype", None}]
        return any(script.is_torch(arg, DTYPE_HALF) for arg in candidates)
    return False


def check_half_with_batchnorm(script: Script) -> Iterator[tuple[ast.AST, str, str]]:
    """`model.half()` on a model with BatchNorm layers, in a script that trains (calls backward)."""
    # fp16 BatchNorm in eval mode (inference with running statistics) is common and fine.
    trains = any(is_backward(call) for call in script.calls)
    if not trains or not script.models.uses_batchnorm() or script.models.keeps_batchnorm_fp32():
        return
    for call in script.calls:
        if _half_conversion(script, call) and script.models.is_model(call.func.value):
            model = source_of(call.func.value)
            what = f"`{source_of(call)}` converts the whole model, BatchNorm layers included, to float16"
            fix = (
                f"drop `.half()` / the float16 cast and keep `{model}` in float32; run the forward pass and loss"
                " under `with torch.autocast(device_type=\"cuda\", dtype=torch.float16):` and scale the loss"
                " with `scaler = torch.amp.GradScaler(\"cuda\")`"
            )
            yield call, what, fix


def check_data_parallel(script: Script) -> Iterator[tuple[ast.AST, str, str]]:
    """`nn.DataParallel(model)`."""
    for call in script.calls:
        resolved = script.resolve(call.func)
        if last_part(resolved) != "DataParallel" or "DataParallel" in script.local_classes:
            continue
        if not (resolved.startswith("torch.") or resolved == "DataParallel"):
            continue
        model = source_of(call.args[0]) if call.args else "model"
        what = f"`{source_of(call)}` runs one Python process that drives every GPU"
        fix = (
            f"launch with `torchrun --nproc_per_node=<gpus> script.py`, call"
            f" `torch.distributed.init_process_group(\"nccl\")` and wrap with"
            f" `torch.nn.parallel.DistributedDataParallel({model}.to(local_rank), device_ids=[local_rank])`"
            " (plus a `DistributedSampler` for the DataLoader)"
        )
        yield call, what, fix


def check_empty_cache_in_loop(script: Script) -> Iterator[tuple[ast.AST, str, str]]:
    """`torch.cuda.empty_cache()` in a loop that runs once per step."""
    for call in script.calls:
        if not script.is_torch(call.func, {"torch.cuda.empty_cache"}):
            continue
        loops = script.loops(call)
        if loops and step_loop(script, loops[0]):
            what = (
                f"`{source_of(call)}` runs on every iteration of the loop on line {loops[0].lineno}: it returns cached"
                " blocks to the driver, so the next step must allocate them again"
            )
            fix = (
                f"delete the call on line {call.lineno}; if memory is fragmented, set"
                " `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` instead"
            )
            yield call, what, fix

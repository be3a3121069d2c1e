"""DistributedDataParallel's own arguments written into the script: `bucket_cap_mb=...` and the rest set
in each `DistributedDataParallel(...)` call (or `DDP(...)`, as it is often imported)."""

from __future__ import annotations

from typing import Any

import libcst as cst

from advisor.code.syntax import dotted, literal_node, put_keyword
from advisor.knobs import written_at
from advisor.knobs.knob import IN_DDP
from advisor.trials.knobs import Knobs


def ddp_changes(knobs: Knobs, user_values: dict) -> dict[str, Any]:
    """The DDP arguments to write: each knob set to a value other than the script's own."""
    return {knob.written.argument: getattr(knobs, knob.name) for knob in written_at(IN_DDP)
            if getattr(knobs, knob.name) is not None and getattr(knobs, knob.name) != user_values.get(knob.name)}


def is_ddp_call(call: cst.Call) -> bool:
    """`DistributedDataParallel(...)`, `nn.parallel.DistributedDataParallel(...)` or `DDP(...)`."""
    name = dotted(call.func) or ""
    return name.rsplit(".", 1)[-1] in ("DistributedDataParallel", "DDP")


class _DDPRewrite(cst.CSTTransformer):
    def __init__(self, changes: dict[str, Any]):
        self.changes = changes
        self.found = 0

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not is_ddp_call(updated_node):
            return updated_node
        self.found += 1
        for name, value in self.changes.items():
            updated_node = put_keyword(updated_node, name, literal_node(value))
        return updated_node


def rewrite_ddp(module: cst.Module, knobs: Knobs, user_values: dict) -> tuple[cst.Module, list[str]]:
    """The module with the DDP knobs in its DistributedDataParallel calls, and a note when it has none."""
    changes = ddp_changes(knobs, user_values)
    if not changes:
        return module, []
    rewrite = _DDPRewrite(changes)
    module = module.visit(rewrite)
    if rewrite.found:
        return module, []
    text = ", ".join(f"{k}={v!r}" for k, v in changes.items())
    return module, [f"DistributedDataParallel's arguments are not written: the script has no DistributedDataParallel(...) "
                    f"call; pass {text} where the model is wrapped"]

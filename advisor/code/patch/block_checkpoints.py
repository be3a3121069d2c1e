"""The `checkpointing` knob written where the model runs its blocks: in the `forward` of the module that holds
them (the trial's `checkpoint_plan` names its class, file and attribute), each block call of the loop over
`self.<blocks>` becomes `checkpoint(block, ..., use_reentrant=False)`; a call of an `nn.Sequential`
`self.<blocks>(x)` becomes `checkpoint_sequential(self.<blocks>, len(self.<blocks>), x, use_reentrant=False)`.
The import goes after the file's imports."""

from __future__ import annotations

import libcst as cst

from advisor.code.patch.bytes import imports_name
from advisor.code.syntax import after_imports, dotted

IMPORT = "from torch.utils.checkpoint import {name}"


def rewrite_checkpointing(module: cst.Module, plan: dict) -> tuple[cst.Module, int]:
    """The module with the blocks' calls checkpointed in `plan["holder"]`'s forward, and how many calls changed."""
    rewrite = BlockCalls(plan["holder"], f"self.{plan['attribute']}", plan.get("how") == "sequential")
    module = module.visit(rewrite)
    if rewrite.changed:
        name = "checkpoint_sequential" if rewrite.sequential else "checkpoint"
        if not imports_name(module, name):
            body = list(module.body)
            at = after_imports(body)
            module = module.with_changes(body=[*body[:at], cst.parse_statement(IMPORT.format(name=name)),
                                               *body[at:]])
    return module, rewrite.changed


def manual_note(plan: dict) -> str:
    """What to write by hand where the blocks' calls were not found."""
    return (f"activation checkpointing is not written: no call of the {plan.get('block')} blocks "
            f"(self.{plan.get('attribute') or '<blocks>'}) was found in {plan.get('holder')}.forward; wrap each "
            "block's call: x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)")


class BlockCalls(cst.CSTTransformer):
    """In class `holder`'s `forward`: the calls of the blocks in `container`, checkpointed."""

    def __init__(self, holder: str, container: str, sequential: bool):
        super().__init__()
        self.holder, self.container, self.sequential = holder, container, sequential
        self.classes: list[str] = []
        self.in_forward = 0
        self.loop_names: list[str] = []  # names bound to a block by `for <name> in <container>` around here
        self.changed = 0

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.classes.pop()
        return updated_node

    def _here(self, node: cst.FunctionDef) -> bool:
        return node.name.value == "forward" and bool(self.classes) and self.classes[-1] == self.holder

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.in_forward += self._here(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self.in_forward -= self._here(original_node)
        return updated_node

    def visit_For(self, node: cst.For) -> None:
        self.loop_names.append(self._block_name(node) or "")

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        self.loop_names.pop()
        return updated_node

    def _block_name(self, node: cst.For) -> str | None:
        """`for block in self.blocks` or `for i, block in enumerate(self.blocks)`: `block`."""
        if not self.in_forward:
            return None
        source, target = node.iter, node.target
        if isinstance(source, cst.Call) and dotted(source.func) == "enumerate" and source.args \
                and isinstance(target, cst.Tuple) and len(target.elements) == 2:
            source, target = source.args[0].value, target.elements[1].value
        return target.value if dotted(source) == self.container and isinstance(target, cst.Name) else None

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self.in_forward:
            return updated_node
        called = dotted(original_node.func)
        if not self.sequential and called and called in self.loop_names:
            self.changed += 1
            return cst.Call(cst.Name("checkpoint"), [
                cst.Arg(cst.Name(called)), *updated_node.args,
                cst.Arg(cst.Name("False"), keyword=cst.Name("use_reentrant"),
                        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))])
        if self.sequential and called == self.container and len(updated_node.args) == 1 \
                and updated_node.args[0].keyword is None and updated_node.args[0].star == "":
            self.changed += 1
            value = cst.Module([]).code_for_node(updated_node.args[0].value)
            return cst.parse_expression(f"checkpoint_sequential({called}, len({called}), {value}, "
                                        "use_reentrant=False)")
        return updated_node


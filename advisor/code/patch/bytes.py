"""The uint8_copies knob written into the user's code, as a user would write it by hand: the Dataset's
`__getitem__` keeps the decoded image 8-bit (its float conversion and normalization taken out), and the step
converts and normalizes the batch right where it moves it to the device. The trial recorded exactly which
expression and which statement (`trial.json` `uint8_plan`); they are found here by their text."""

from __future__ import annotations

import libcst as cst

from advisor.code.patch.model import MovedInput


def rewrite_dataset_bytes(module: cst.Module, plan: dict) -> tuple[cst.Module, bool]:
    """The Dataset's `__getitem__` handing out the 8-bit image; whether the conversion was found."""
    rewrite = _DatasetBytes(plan)
    return module.visit(rewrite), rewrite.done


def rewrite_step_bytes(module: cst.Module, target: str, plan: dict) -> tuple[cst.Module, bool]:
    """In the step `target`: the batch's image converted and normalized where it is moved to the device."""
    rewrite = _DeviceConversion(target.rsplit(".", 1)[-1], plan)
    module = module.visit(rewrite)
    return module, rewrite.done


class _DatasetBytes(cst.CSTTransformer):
    def __init__(self, plan: dict):
        super().__init__()
        self.cls = str(plan["cls"]).rsplit(".", 1)[-1]
        self.conversion, self.uint8 = plan["conversion"], plan["uint8"]
        self.normalization = plan.get("normalization")
        self.inside = 0
        self.done = False
        self.module = cst.Module([])

    def visit_Module(self, node: cst.Module) -> None:
        self.module = node

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if node.name.value == self.cls:
            self.inside += 1

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        if original_node.name.value == self.cls:
            self.inside -= 1
        return updated_node

    def leave_BinaryOperation(self, original_node: cst.BinaryOperation,
                              updated_node: cst.BaseExpression) -> cst.BaseExpression:
        return self._swap(original_node, updated_node)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.BaseExpression) -> cst.BaseExpression:
        return self._swap(original_node, updated_node)

    def _swap(self, original: cst.CSTNode, updated: cst.BaseExpression) -> cst.BaseExpression:
        if self.inside and not self.done and _same(self.module.code_for_node(original), self.conversion):
            self.done = True
            return cst.parse_expression(self.uint8)
        return updated

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine):
        if self.inside and self.normalization and _same(self.module.code_for_node(original_node.body[0]),
                                                        self.normalization):
            return cst.RemovalSentinel.REMOVE  # normalized on the device instead
        return updated_node


def _same(code: str, text: str) -> bool:
    """Equal up to spacing (the plan holds the expression as Python's ast writes it)."""
    return "".join(code.split()).replace("'", '"') == "".join(str(text).split()).replace("'", '"')


class _DeviceConversion(MovedInput):
    """`x = x.to(device)` of the batch fed to the model → `x = (x.to(device).float() / 255.0 - m) / s`."""

    def __init__(self, function: str, plan: dict):
        super().__init__(function)
        scale, mean, std = plan["scale"], plan.get("mean"), plan.get("std")
        self.template = f"{{moved}}.float() / {scale:g}"
        if mean is not None:
            self.template = f"({self.template} - {mean:g}) / {std:g}"

    def rewritten(self, moved: cst.Call) -> cst.BaseExpression:
        """The batch's `x.to(device)` converted and normalized after the copy."""
        return cst.parse_expression(self.template.format(moved=cst.Module([]).code_for_node(moved)))

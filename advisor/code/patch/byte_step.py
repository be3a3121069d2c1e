"""The step's side of the uint8_copies patch: the batch's `x = x.to(device)` converted and normalized right
after the copy. Scalar constants stay in the line (`x = (x.to(device).float() / 255 - 0.5) / 0.25`);
per-channel ones are made once per device by a small cached function written beside the step, and applied by
another, so the step's line stays short and no tensor is built or copied at each step:

    @functools.cache
    def normalization(device):
        \"\"\"The normalization's constants on `device`, made once.\"\"\"
        mean = torch.as_tensor(IMAGENET_MEAN, dtype=torch.float32, device=device)
        ...
    images = normalized(images.to(device))

The constants are the script's own names where the step's file holds them (`codes`), else their values; in
the dtype the Dataset computed in, shaped for the batch's layout (`dtypes`, `views`:
`advisor.trials.interposition.uint8_probe`)."""

from __future__ import annotations

import sys

import libcst as cst

from advisor.code.patch.facts import ScriptFacts
from advisor.code.patch.model_lines import MovedInput
from advisor.code.syntax import after_imports


def rewrite_step_bytes(module: cst.Module, target: str, plan: dict, names_in_file: bool) -> tuple[cst.Module, bool]:
    """In the step `target`: the batch's image converted and normalized where it is moved to the device;
    `names_in_file`: the plan's constants are named as the step's file names them (the Dataset's file)."""
    function = target.rsplit(".", 1)[-1]
    constants = [_constant(plan, k, names_in_file) for k in (0, 1)] if plan.get("mean") is not None else None
    tensors = constants is not None and any(view is not False for _, view in constants)
    facts = ScriptFacts.collect(module)
    helper = facts.free_name("normalized", "normalized_input", "advisor_normalized") if tensors else None
    rewrite = _DeviceConversion(function, plan, constants, helper)
    module = module.visit(rewrite)
    if not rewrite.done:  # a step that never moves its batch (the CPU): converted where it enters the step
        entry = _EntryConversion(function, rewrite)
        module = module.visit(entry)
        rewrite.done = entry.done
    if rewrite.done and helper is not None:
        module = _with_helpers(module, facts, function, helper, _helpers(plan, constants, facts, helper))
    return module, rewrite.done


class _DeviceConversion(MovedInput):
    """`x = x.to(device)` of the batch fed to the model → its 8-bit bytes converted after the copy."""

    def __init__(self, function: str, plan: dict, constants: list | None, helper: str | None):
        super().__init__(function)
        self.plan, self.constants, self.helper = plan, constants, helper

    def rewritten(self, moved: cst.Call) -> cst.BaseExpression:
        """The batch's `x.to(device)` converted and normalized after the copy."""
        code = cst.Module([]).code_for_node(moved)
        if self.helper is not None:
            return cst.parse_expression(f"{self.helper}({code})")
        text = _scaled(code, self.plan)
        if self.constants is not None:
            (mean, _), (std, _) = self.constants
            text = f"({text} - {mean}) / {std}"
        return cst.parse_expression(text)


class _EntryConversion(cst.CSTTransformer):
    """In the step, the parameter it feeds first to a model call (`model(images)`, `self.net(x)`) converted and
    normalized as its first statement: where the batch enters a step that never moves it with `.to(...)`."""

    def __init__(self, function: str, conversion: _DeviceConversion):
        super().__init__()
        self.function, self.conversion = function, conversion
        self.done = False

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if original_node.name.value != self.function or self.done:
            return updated_node
        parameters = {p.name.value for p in original_node.params.params}
        fed: list[str] = []

        class Fed(cst.CSTVisitor):
            def visit_Call(self, node: cst.Call) -> None:
                first = node.args[0].value if node.args and node.args[0].keyword is None else None
                callee = cst.Module([]).code_for_node(node.func)
                if not fed and isinstance(first, cst.Name) and first.value in parameters and (
                        isinstance(node.func, cst.Name) or callee.startswith("self.")):
                    fed.append(first.value)

        original_node.body.visit(Fed())
        if not fed or not isinstance(updated_node.body, cst.IndentedBlock):
            return updated_node
        converted = cst.Module([]).code_for_node(self.conversion.rewritten(cst.Name(fed[0])))
        statement = cst.parse_statement(f"{fed[0]} = {converted}")
        body = list(updated_node.body.body)
        at = 1 if body and _is_docstring(body[0]) else 0
        self.done = True
        return updated_node.with_changes(body=updated_node.body.with_changes(body=[*body[:at], statement, *body[at:]]))


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Expr) and \
        isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))


def _scaled(code: str, plan: dict) -> str:
    scale = f"{plan['scale']:g}"
    return f"{code}.float() * (1 / {scale})" if plan.get("multiply") else f"{code}.float() / {scale}"


def _constant(plan: dict, k: int, names_in_file: bool) -> tuple[str, list | None | bool]:
    """mean's (k=0) or std's expression, and its view: False for a number applied as it is, None for a
    tensor in its own shape, else the shape the batch's layout needs."""
    value = plan["mean" if k == 0 else "std"]
    code = (plan.get("codes") or [None, None])[k] if names_in_file else None
    dtype = (plan.get("dtypes") or [None, None])[k]
    view = (plan.get("views") or [None, None])[k]
    if plan.get("kind") == "transform":  # as torchvision's Normalize makes them: float32, (C, 1, 1)
        if not isinstance(value, list):
            return code or repr(value), False
        dtype, view = "float32", [-1, 1, 1]
    elif dtype is None:
        return code or repr(value), False
    source = code or _literal(value, dtype)
    return f"torch.as_tensor({source}, dtype=torch.{dtype}, device=device)", view


def _literal(values: float | list, dtype: str) -> str:
    """Values as Python writes them: float32 ones at their shortest (0.485, not 0.48500001430511475)."""
    import numpy as np

    if isinstance(values, list):
        return "[" + ", ".join(_literal(v, dtype) for v in values) + "]"
    return str(np.float32(values)) if dtype == "float32" else repr(float(values))


def _helpers(plan: dict, constants: list, facts: ScriptFacts, helper: str) -> list[cst.BaseStatement]:
    """The cached function that makes the constants on a device, and the one that converts a batch."""
    made = facts.free_name("normalization", "normalization_constants", "advisor_normalization")
    lines, returned = [], []
    for name, (text, view) in zip(("mean", "std"), constants):
        lines.append(f"    {name} = {text}\n")
        shape = "-1, 1, 1" if view and view[0] != 1 and all(v == 1 for v in view[1:]) else \
            ", ".join(map(str, view)) if view else None
        returned.append(f"{name}.view({shape})" if shape else name)
    cached = ("@functools.cache\n"
              f"def {made}(device):\n"
              '    """The normalization\'s constants on `device`, made once."""\n'
              + "".join(lines) + f"    return {', '.join(returned)}\n")
    convert = (f"def {helper}(images):\n"
               '    """The loader\'s 8-bit images as the model\'s input (float, normalized)."""\n'
               f"    mean, std = {made}(images.device)\n"
               f"    return ({_scaled('images', plan)} - mean) / std\n")
    blank = [cst.EmptyLine(), cst.EmptyLine()]
    return [cst.parse_statement(text).with_changes(leading_lines=blank) for text in (cached, convert)]


def _with_helpers(module: cst.Module, facts: ScriptFacts, function: str, helper: str,
                  helpers: list[cst.BaseStatement]) -> cst.Module:
    """The helpers just before the top-level statement that defines the step; functools (and torch) imported."""
    body = list(module.body)
    at = next((i for i, s in enumerate(body) if _defines(s, function)), len(body))
    body[at:at] = helpers
    if not facts.torch_bound:
        index = after_imports(body)
        body[index:index] = [cst.parse_statement("import torch")]
    if not _imports_functools(body):  # among the standard library's imports, in order
        index = next((i for i, s in enumerate(body[:after_imports(body)]) if _sorts_after(s, "functools")),
                     after_imports(body))
        line = cst.parse_statement("import functools")
        if index > 0 and _is_import(body[index - 1]) and not _sorts_after(body[index - 1], "~") \
                and "__future__" not in cst.Module([]).code_for_node(body[index - 1]):
            body[index:index] = [line]  # in the standard library's group, after its imports before it
        elif index < len(body):  # the first import: the next one's blank lines its own, a blank after it
            after = body[index]
            blank = [cst.EmptyLine()] if _sorts_after(after, "~") else []  # isort's blank before the others
            body[index:index + 1] = [line.with_changes(leading_lines=after.leading_lines),
                                     after.with_changes(leading_lines=blank)]
        else:
            body.append(line)
    return module.with_changes(body=body)


def _is_import(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], (cst.Import,
                                                                                             cst.ImportFrom))


def _sorts_after(statement: cst.BaseStatement, name: str) -> bool:
    """An import of a module that isort would put after `name`'s (a later standard one, or any other)."""
    if not _is_import(statement):
        return False
    first = statement.body[0]
    if isinstance(first, cst.ImportFrom):
        if first.relative or first.module is None:
            return True
        module = cst.Module([]).code_for_node(first.module)
    else:
        module = cst.Module([]).code_for_node(first.names[0].name)
    top = module.split(".")[0]
    return top != "__future__" and (top not in sys.stdlib_module_names or module > name)


def _defines(statement: cst.BaseStatement, function: str) -> bool:
    if isinstance(statement, cst.FunctionDef):
        return statement.name.value == function
    return isinstance(statement, cst.ClassDef) and any(
        isinstance(s, cst.FunctionDef) and s.name.value == function for s in statement.body.body)


def _imports_functools(body: list[cst.BaseStatement]) -> bool:
    return any(isinstance(s, cst.SimpleStatementLine) and any(
        isinstance(i, cst.Import) and any(a.evaluated_name == "functools" and a.asname is None for a in i.names)
        for i in s.body) for s in body)

"""The uint8_copies knob written into the user's code, as a user would write it by hand: the Dataset's
`__getitem__` keeps the decoded image 8-bit (its float conversion and normalization taken out), and the step
converts and normalizes the batch right where it moves it to the device. The trial recorded exactly which
expression and which statement (`trial.json` `uint8_plan`); they are found here by their text."""

from __future__ import annotations

import libcst as cst


def rewrite_dataset_bytes(module: cst.Module, plan: dict) -> tuple[cst.Module, bool]:
    """The Dataset's `__getitem__` handing out the 8-bit image; whether the conversion was found."""
    rewrite = _DatasetBytes(plan)
    return module.visit(rewrite), rewrite.done


class _DatasetBytes(cst.CSTTransformer):
    def __init__(self, plan: dict):
        super().__init__()
        self.cls = str(plan["cls"]).rsplit(".", 1)[-1]
        self.conversion, self.uint8 = plan["conversion"], plan["uint8"]
        # The statements that changed the image's values (a normalization, a loop over channels): the step does it.
        self.removed = list(plan.get("removed") or []) or ([plan["normalization"]] if plan.get("normalization") else [])
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
        return self._removed(self.module.code_for_node(original_node.body[0]), updated_node)

    def leave_For(self, original_node: cst.For, updated_node: cst.For):
        return self._removed(self.module.code_for_node(original_node), updated_node)

    def _removed(self, code: str, updated: cst.CSTNode):
        if self.inside and any(_same(code, text) for text in self.removed):
            return cst.RemovalSentinel.REMOVE  # normalized on the device instead
        return updated


def _same(code: str, text: str) -> bool:
    """Equal up to spacing (the plan holds the expression as Python's ast writes it)."""
    return "".join(code.split()).replace("'", '"') == "".join(str(text).split()).replace("'", '"')


def rewrite_pipeline_bytes(module: cst.Module, plan: dict) -> tuple[cst.Module, int, dict]:
    """A torchvision pipeline (`Compose([...])` whose transforms are the plan's, in order) made 8-bit:
    `ToTensor()` → `PILToTensor()` (v1), `ToDtype(torch.float32, ...)` → `ToDtype(torch.uint8, ...)` (v2), its
    `Normalize(...)` taken out; returns the module, how many such pipelines it holds (1 to be written), and
    the Normalize's mean and std as written where they are module-level names (`codes`: the step in the same
    file normalizes with them)."""
    finder = _Pipelines(list(plan.get("transforms") or []))
    module.visit(finder)
    if len(finder.found) != 1:
        return module, len(finder.found), {}
    rewrite = _EightBitPipeline(finder.found[0], plan)
    return module.visit(rewrite), 1, _constants(module, rewrite.normalize)


def _constants(module: cst.Module, normalize: cst.Call | None) -> dict:
    """Of `Normalize(MEAN, STD)` (or `mean=MEAN, std=STD`): the names assigned at the module's top level."""
    if normalize is None:
        return {}
    named = {}
    for i, arg in enumerate(normalize.args[:2]):
        key = arg.keyword.value if arg.keyword is not None else ("mean", "std")[i]
        if isinstance(arg.value, cst.Name):
            named[key] = arg.value.value
    top = {n.value for s in module.body if isinstance(s, cst.SimpleStatementLine) for a in s.body
           if isinstance(a, cst.Assign) for t in a.targets for n in _bound(t.target)}  # MEAN, STD = ... too
    return {"codes": [named.get(key) if named.get(key) in top else None for key in ("mean", "std")]}


def _bound(target: cst.BaseExpression) -> list[cst.Name]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _bound(e.value)]
    return [target] if isinstance(target, cst.Name) else []


def _last_name(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return node.value if isinstance(node, cst.Name) else None


def _element_names(call: cst.Call) -> list[str | None] | None:
    """The transforms' class names of `Compose([A(...), B(...)])` (None for an element that is not a call)."""
    if _last_name(call.func) != "Compose" or not call.args or not isinstance(call.args[0].value, (cst.List, cst.Tuple)):
        return None
    return [_last_name(e.value.func) if isinstance(e.value, cst.Call) else None for e in call.args[0].value.elements]


class _Pipelines(cst.CSTVisitor):
    def __init__(self, names: list[str]):
        super().__init__()
        self.names = names
        self.found: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        if self.names and _element_names(node) == self.names:
            self.found.append(node)


class _EightBitPipeline(cst.CSTTransformer):
    def __init__(self, target: cst.Call, plan: dict):
        super().__init__()
        self.target, self.plan = target, plan
        self.normalize: cst.Call | None = None

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node is not self.target:
            return updated_node
        sequence = updated_node.args[0].value
        elements = []
        for element in sequence.elements:
            name = _last_name(element.value.func)
            if name == "Normalize":
                self.normalize = element.value
                continue  # normalized after the copy, in the step
            if name == "ToTensor":
                func = element.value.func
                renamed = func.with_changes(attr=cst.Name("PILToTensor")) if isinstance(func, cst.Attribute) \
                    else cst.Name("PILToTensor")
                element = element.with_changes(value=element.value.with_changes(func=renamed))
            elif name == "ToDtype":
                element = element.with_changes(value=_to_uint8(element.value))
            elements.append(element)
        if elements and len(elements) < len(sequence.elements):
            elements[-1] = elements[-1].with_changes(comma=sequence.elements[-1].comma)
        return updated_node.with_changes(args=[updated_node.args[0].with_changes(
            value=sequence.with_changes(elements=elements)), *updated_node.args[1:]])


def _to_uint8(call: cst.Call) -> cst.Call:
    """`ToDtype(torch.float32, scale=True)` → `ToDtype(torch.uint8, scale=True)` (positional or `dtype=`)."""
    args = list(call.args)
    for i, arg in enumerate(args):
        if arg.keyword is None or arg.keyword.value == "dtype":
            args[i] = arg.with_changes(value=cst.parse_expression("torch.uint8"))
            break
    return call.with_changes(args=args)


def imports_name(module: cst.Module, name: str) -> bool:
    """Whether the module binds `name` with a `from ... import`."""
    found = []

    class _Find(cst.CSTVisitor):
        def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
            alias = node.asname.name.value if node.asname is not None else _last_name(node.name)
            found.append(alias == name)

    module.visit(_Find())
    return any(found)

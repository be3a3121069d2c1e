"""The step function rewritten: autocast around the forward, the GradScaler, non_blocking copies and gradient
accumulation, and what that needs at module level (the scaler, the accumulation counter, `import torch`)."""

from __future__ import annotations

import dataclasses

import libcst as cst

from advisor.code.patch.facts import ScriptFacts
from advisor.code.patch.step_body import ACCUMULATION_CONSTANT, ACCUMULATION_COUNTER, StepBodyRewrite, StepPlan, \
    is_optimizer
from advisor.code.syntax import after_imports, dotted, is_docstring, method_call, statement_call


def calls_backward(node: cst.CSTNode) -> bool:
    """Whether the node contains a `<x>.backward(...)` call."""
    found = []

    class Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
                found.append(call)

    node.visit(Finder())
    return bool(found)


def uses_autocast(node: cst.CSTNode) -> bool:
    """Whether the node already has a `with ...autocast(...)` block."""
    found = []

    class Finder(cst.CSTVisitor):
        def visit_WithItem(self, item: cst.WithItem) -> None:
            if isinstance(item.item, cst.Call) and (dotted(item.item.func) or "").endswith("autocast"):
                found.append(item)

    node.visit(Finder())
    return bool(found)


class TargetRewrite(cst.CSTTransformer):
    """Rewrites each definition of the target (`f` or `Class.method`) with the step plan."""

    def __init__(self, target: str, plan: StepPlan, facts: ScriptFacts):
        super().__init__()
        self.target = target
        self.plan = plan
        self.facts = facts
        self.owners: list[str | None] = []
        self.matches: list[bool] = []
        self.used_scaler = False
        self.used_accumulation = False

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.owners.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.owners.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        owner = self.owners[-1] if self.owners else None
        key = f"{owner}.{node.name.value}" if owner else node.name.value
        self.matches.append(key == self.target)
        self.owners.append(None)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self.owners.pop()
        if not self.matches.pop():
            return updated_node
        owner = self.owners[-1] if self.owners else None
        return self.rewrite(updated_node, owner)

    def rewrite(self, func: cst.FunctionDef, class_name: str | None) -> cst.FunctionDef:
        """One definition of the target with the plan applied."""
        block = func.body
        if isinstance(block, cst.SimpleStatementSuite):  # `def f(): return x` on one line
            block = cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[s]) for s in block.body])
        params = {p.name.value: (self.facts.module.code_for_node(p.annotation.annotation) if p.annotation else "")
                  for p in (*func.params.posonly_params, *func.params.params, *func.params.kwonly_params)}
        steps = _count_optimizer_steps(block, self.facts)
        plan = self.plan
        if not steps:
            # Without the optimizer step in the target, neither the GradScaler nor accumulation can be
            # written correctly here: autocast alone (and, for fp16, no loss scaling) is what remains.
            plan = dataclasses.replace(plan, accumulation=None)
        inner = StepBodyRewrite(plan, self.facts, params)
        inner.optimizer_steps_total = steps
        # Loss scaling is right only when every backward is scaled and every step unscales.
        inner.use_scaler = plan.fp16 and steps > 0 and not _calls_autograd_backward(block)
        block = block.visit(inner)
        self.used_scaler |= inner.used_scaler
        self.used_accumulation |= bool(plan.accumulation)

        statements = list(block.body)
        head = statements[:1] if statements and is_docstring(statements[0]) else []
        rest = statements[len(head):]
        if self.plan.autocast and rest and not uses_autocast(block):
            rest = self._autocast(rest, params, class_name)
        if plan.accumulation:
            flags = [cst.parse_statement(code) for code in (
                f"first_micro_step = {ACCUMULATION_COUNTER} % {ACCUMULATION_CONSTANT} == 0",
                f"last_micro_step = {ACCUMULATION_COUNTER} % {ACCUMULATION_CONSTANT} == {ACCUMULATION_CONSTANT} - 1",
                f"{ACCUMULATION_COUNTER} += 1",
            )]
            rest = [cst.parse_statement(f"global {ACCUMULATION_COUNTER}"), *_with_prelude(rest, flags)]
            # The blank lines / comments above the first statement go above the global.
            rest[0], rest[1] = (rest[0].with_changes(leading_lines=rest[1].leading_lines),
                                rest[1].with_changes(leading_lines=[]))
        return func.with_changes(body=block.with_changes(body=[*head, *rest]))

    def top_level_loop(self, body: list[cst.BaseStatement]) -> list[cst.BaseStatement] | None:
        """The statements with the one loop among them that calls backward rewritten, looked for under an `if`
        (`if __name__ == "__main__":`) too: a script that trains at its top level, with no step function (nanoGPT's
        train.py). Autocast around each iteration's forward and non_blocking copies; None where there is not one
        such loop, or the plan needs the bounds of a step (the GradScaler, accumulation)."""
        if self.plan.fp16 or self.plan.accumulation:
            return None
        found = [i for i, s in enumerate(body) if not isinstance(s, (cst.FunctionDef, cst.ClassDef))
                 and calls_backward(s)]
        if len(found) != 1:
            return None
        statement = body[found[0]]
        if isinstance(statement, cst.If) and statement.orelse is None and isinstance(statement.body, cst.IndentedBlock):
            inner = self.top_level_loop(list(statement.body.body))
            rewritten = None if inner is None else statement.with_changes(body=statement.body.with_changes(body=inner))
        elif isinstance(statement, (cst.For, cst.While)) and isinstance(statement.body, cst.IndentedBlock):
            rewritten = statement.visit(StepBodyRewrite(self.plan, self.facts, {}))
            if self.plan.autocast and not uses_autocast(rewritten):
                rewritten = self._autocast([rewritten], {}, None)[0]
        else:
            return None
        return None if rewritten is None else [*body[:found[0]], rewritten, *body[found[0] + 1:]]

    def _autocast(self, rest: list[cst.BaseStatement], params: dict[str, str],
                  class_name: str | None) -> list[cst.BaseStatement]:
        """The statements with the forward part under `with torch.autocast(...)`."""
        split = next((i for i, s in enumerate(rest) if calls_backward(s)), None)
        loop = rest[split] if split is not None else None
        if isinstance(loop, (cst.For, cst.While)) and isinstance(loop.body, cst.IndentedBlock):
            # A target that runs its own loop: the forward of each iteration is what autocast covers.
            body = loop.body.with_changes(body=self._autocast(list(loop.body.body), params, class_name))
            return [*rest[:split], loop.with_changes(body=body), *rest[split + 1:]]
        if not split:  # no backward, or backward first: wrap everything
            split = len(rest)
        before, inside, after = [], rest[:split], rest[split:]
        # Not forward work, kept out of the block as torch's AMP recipe keeps it: the batch's copies to the device
        # and zero_grad before the forward (pytorch/examples' MNIST: copies, zero_grad, forward, loss), zero_grad
        # after it.
        while len(inside) > 1 and (_is_zero_grad(inside[0]) or _copies_only(inside[0])):
            before.append(inside.pop(0))
        while len(inside) > 1 and _is_zero_grad(inside[-1]):
            after.insert(0, inside.pop())
        if self.plan.fp16:
            call = 'torch.autocast(device_type="cuda", dtype=torch.float16)'
        else:
            call = f"torch.autocast(device_type={self._device_type(params, class_name)}, dtype=torch.bfloat16)"
        with_statement = cst.With(
            items=[cst.WithItem(item=cst.parse_expression(call))],
            body=cst.IndentedBlock(body=[inside[0].with_changes(leading_lines=[]), *inside[1:]]),
            leading_lines=inside[0].leading_lines,
        )
        return [*before, with_statement, *after]

    def _device_type(self, params: dict[str, str], class_name: str | None) -> str:
        """The autocast device_type: from the script's device variable if obvious, else a literal."""
        for name, annotation in params.items():
            if annotation in ("torch.device", "device"):
                return f"{name}.type"
        for name in params:
            if name in ("device", "dev"):
                return f"torch.device({name}).type"  # a str or a torch.device: both work
        if class_name is not None and params:
            self_name = next(iter(params))
            for attr in sorted(self.facts.class_devices.get(class_name, ())):
                if attr.startswith("self."):
                    return f"{self_name}.{attr[len('self.'):]}.type"
        for name, kind in sorted(self.facts.module_devices.items()):
            if name not in params and kind == "device":
                return f"{name}.type"
        for name, kind in sorted(self.facts.module_devices.items()):
            if name not in params and kind == "str" and "device" in name.lower():
                return f"torch.device({name}).type"
        # The script uses CUDA somewhere but its device is not one obvious name: decide at run time.
        return '"cuda" if torch.cuda.is_available() else "cpu"' if self.facts.mentions_cuda else '"cpu"'


def _with_prelude(statements: list[cst.BaseStatement], prelude: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """The prelude first, or first in the loop that holds the backward (one micro-step per iteration)."""
    split = next((i for i, s in enumerate(statements) if calls_backward(s)), None)
    loop = statements[split] if split is not None else None
    if isinstance(loop, (cst.For, cst.While)) and isinstance(loop.body, cst.IndentedBlock):
        body = loop.body.with_changes(body=_with_prelude(list(loop.body.body), prelude))
        return [*statements[:split], loop.with_changes(body=body), *statements[split + 1:]]
    if statements:
        prelude = [prelude[0].with_changes(leading_lines=statements[0].leading_lines), *prelude[1:]]
        statements = [statements[0].with_changes(leading_lines=[]), *statements[1:]]
    return [*prelude, *statements]


def _calls_autograd_backward(node: cst.CSTNode) -> bool:
    """Whether the node calls `torch.autograd.backward(...)`, which a GradScaler rewrite cannot scale."""
    found = []

    class Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if dotted(call.func) in ("torch.autograd.backward", "autograd.backward"):
                found.append(call)

    node.visit(Finder())
    return bool(found)


def _is_zero_grad(statement: cst.BaseStatement) -> bool:
    """`x.zero_grad(...)`, or that line alone under an `if` (as accumulation guards it)."""
    if isinstance(statement, cst.If) and statement.orelse is None and isinstance(statement.body, cst.IndentedBlock):
        return len(statement.body.body) == 1 and _is_zero_grad(statement.body.body[0])
    return method_call(statement_call(statement), "zero_grad") is not None


def _copies_only(statement: cst.BaseStatement) -> bool:
    """`x, y = x.to(device), y.to(device)` (or `.cuda()`): a line that only moves tensors, no forward work."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Assign)):
        return False
    value = statement.body[0].value
    values = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
    return all(isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) and v.func.attr.value in ("to", "cuda")
               and isinstance(v.func.value, cst.Name) for v in values)


def _count_optimizer_steps(block: cst.CSTNode, facts: ScriptFacts) -> int:
    """How many `optimizer.step()` statements the block has (scaler.update follows the last)."""
    count = []

    class Counter(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, line: cst.SimpleStatementLine) -> None:
            call = statement_call(line)
            if call is not None and not call.args and is_optimizer(method_call(call, "step"), facts):
                count.append(line)

    block.visit(Counter())
    return len(count)


# --------------------------------------------------------------------------------------------------
# Module level: the GradScaler, the accumulation counter, `import torch`


def add_module_statements(module: cst.Module, facts: ScriptFacts, plan: StepPlan,
                          rewrite: TargetRewrite) -> cst.Module:
    """Insert what the rewritten target needs at module level, right after the imports."""
    imports, lines = [], []
    needs_torch = rewrite.used_scaler or bool(plan.autocast)
    if needs_torch and not facts.torch_bound:
        imports.append(cst.parse_statement("import torch"))
    if rewrite.used_scaler:
        lines.append(f'{plan.scaler_name} = torch.amp.GradScaler("cuda")')
    if rewrite.used_accumulation:
        lines.append(f"{ACCUMULATION_CONSTANT} = {plan.accumulation}  # gradient accumulation: one optimizer step "
                     f"every {plan.accumulation} calls of {rewrite.target}")
        lines.append(f"{ACCUMULATION_COUNTER} = 0")
    if not imports and not lines:
        return module
    body = list(module.body)
    index = after_imports(body)
    following = body[index] if index < len(body) else None
    statements = [cst.parse_statement(code) for code in lines]
    if statements:
        # A block of its own: the blank lines that separated the imports from what follows, and again after.
        blank = [line for line in (following.leading_lines if following is not None else []) if line.comment is None]
        statements[0] = statements[0].with_changes(leading_lines=blank or [cst.EmptyLine()])
        if following is not None and not following.leading_lines:
            body[index] = following.with_changes(leading_lines=[cst.EmptyLine()])
    if imports and index > 0 and is_docstring(body[index - 1]):  # no imports: a blank after the docstring
        imports[0] = imports[0].with_changes(leading_lines=[cst.EmptyLine()])
    return module.with_changes(body=[*body[:index], *imports, *statements, *body[index:]])

"""Rules about autograd graphs kept or built for nothing: a loss accumulated with its graph across steps
(memory grows every step), evaluation with autograd on."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from advisor.code.lint.loops import step_loop
from advisor.code.lint.names import FUNCTIONAL_LOSSES, GRAPH_FREE_FUNCTIONS, GRAPH_FREE_METHODS
from advisor.code.lint.script import Script
from advisor.code.lint.ast_nodes import dotted, is_backward, is_const, last_part, source_of


def _loss_call(script: Script, call: ast.Call, criteria: set[str]) -> bool:
    """A call that returns a loss tensor: `criterion(...)`, `loss_fn(...)`, `F.cross_entropy(...)`."""
    name = dotted(call.func)
    if name is None:
        return False
    last = last_part(name).lower()
    if name in criteria or "loss" in last or "criterion" in last:
        return True
    resolved = script.resolve(call.func) or ""
    return resolved.startswith("torch.nn.functional.") and last_part(resolved) in FUNCTIONAL_LOSSES


def _criteria(script: Script) -> set[str]:
    """Names assigned a loss module: `criterion = nn.CrossEntropyLoss()`."""
    names = set()
    for node in ast.walk(script.tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            resolved = script.resolve(node.value.func) or ""
            if resolved.startswith("torch.nn.") and resolved.endswith("Loss"):
                names.update(dotted(t) for t in node.targets if dotted(t))
    return names


class _GraphFlow:
    """Which expressions in one scope hold a tensor that carries an autograd graph."""

    def __init__(self, script: Script, scope: ast.AST, criteria: set[str], returns: dict[str, bool]):
        self.script = script
        self.criteria = criteria
        self.returns = returns  # function name → its return value carries a graph (shared cache)
        self.assignments: dict[str, list[tuple[int, ast.expr | None, ast.AST]]] = {}
        self.backward_on: set[str] = set()  # `x.backward()` called on these names
        self.feeds_backward: set[str] = set()  # names whose value reaches a backward() call
        assigns: list[ast.Assign] = []
        for node in script.walk_scope(scope):
            if isinstance(node, ast.Assign):
                assigns.append(node)
                for target in node.targets:
                    self._record(target, node.value, node)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                self._record(node.target, node.value, node)
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                self._record(node.target, None, node)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "backward"
            ):
                receiver = dotted(node.func.value)
                if receiver:
                    self.backward_on.add(receiver)
                self.feeds_backward.update(_names_in(node.func.value))
        # `loss = sum(losses); loss.backward()`: what flows into a backward() also feeds it.
        for _ in range(2):
            for node in assigns:
                if any(dotted(t) in self.feeds_backward for t in node.targets):
                    self.feeds_backward.update(_names_in(node.value))
        for values in self.assignments.values():
            values.sort(key=lambda entry: entry[0])

    def _record(self, target: ast.AST, value: ast.expr | None, node: ast.AST) -> None:
        name = dotted(target)
        if name is not None:
            self.assignments.setdefault(name, []).append((node.lineno, value, node))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                # `loss, logits = model(x)`: each element comes from an unknown value.
                self._record(element, None, node)

    def carries_graph(self, expr: ast.AST, line: int, depth: int = 0) -> bool | None:
        """Whether `expr`, evaluated at `line`, is a tensor with a graph (a loss, or derived from one):
        True, False (a number, detached, computed without grad) or None (cannot tell)."""
        if depth > 8:
            return None
        if isinstance(expr, ast.Call):
            func = expr.func
            if isinstance(func, ast.Attribute) and func.attr in GRAPH_FREE_METHODS:
                return False
            if isinstance(func, ast.Name) and func.id in GRAPH_FREE_FUNCTIONS:
                return False
            if _loss_call(self.script, expr, self.criteria):
                return True
            if isinstance(func, ast.Name) and func.id in self.script.functions:
                return self._returns_graph(func.id)
            if isinstance(func, ast.Attribute):  # loss.mean(), loss.sum(), loss.float() ...
                return self.carries_graph(func.value, line, depth + 1)
            return None
        if isinstance(expr, ast.BinOp):
            sides = [self.carries_graph(side, line, depth + 1) for side in (expr.left, expr.right)]
            if True in sides:
                return True
            return False if sides == [False, False] else None
        if isinstance(expr, ast.UnaryOp):
            return self.carries_graph(expr.operand, line, depth + 1)
        if isinstance(expr, (ast.Constant, ast.Compare, ast.BoolOp, ast.JoinedStr)):
            return False
        if isinstance(expr, ast.Attribute) and expr.attr == "data":
            return False
        if isinstance(expr, (ast.Name, ast.Attribute)):
            name = dotted(expr)
            if name is None:
                return None
            earlier = [entry for entry in self.assignments.get(name, []) if entry[0] < line]
            if earlier:
                at, value, node = earlier[-1]
                if self.script.grad.without_grad(node):
                    return False  # computed under no_grad: no graph to keep
                if value is not None:
                    known = self.carries_graph(value, at, depth + 1)
                    if known is not None:
                        return known
            # Unknown origin (a parameter, `model(x)`, `outputs.loss`): backward() on it, or its name.
            if name in self.backward_on or "loss" in last_part(name).lower():
                return True
            return None
        if isinstance(expr, ast.Subscript):  # outputs["loss"]
            key = expr.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and "loss" in key.value:
                return True
        return None

    def _returns_graph(self, name: str) -> bool | None:
        """Whether the script's function `name` returns a tensor with a graph (`return loss`)."""
        if name not in self.returns:
            self.returns[name] = None  # provisional: stops recursion through mutually calling functions
            func = self.script.functions[name]
            if self.script.grad.function_without_grad(func):
                self.returns[name] = False
            else:
                flow = _GraphFlow(self.script, func, self.criteria, self.returns)
                results = [
                    flow.carries_graph(node.value, node.lineno) if node.value is not None else False
                    for node in self.script.walk_scope(func)
                    if isinstance(node, ast.Return)
                ]
                if True in results:
                    self.returns[name] = True
                elif results and all(result is False for result in results):
                    self.returns[name] = False
        return self.returns[name]


def _persists_across_steps(script: Script, node: ast.AST, target: ast.AST) -> bool:
    """True if an accumulation runs once per step into a value that outlives the step: inside a loop,
    or in a per-step function into an attribute (`self.total`) or a global/nonlocal name."""
    scope = script.scope(node)
    loops = script.loops(node)
    if loops:
        # A sum over the parts of one step's output that the function returns is that step's loss
        # (`for out in outputs: loss += crit(out)` ... `return loss`), unless the loop runs the steps.
        returned = any(
            isinstance(n, ast.Return) and n.value is not None and dotted(target) in _names_in(n.value)
            for n in script.walk_scope(scope)
        )
        return not returned or step_loop(script, loops[0])
    if not script.runs_per_step(scope):
        return False
    if isinstance(target, ast.Attribute):
        return True
    declared = {
        name
        for n in script.walk_scope(scope)
        if isinstance(n, (ast.Global, ast.Nonlocal))
        for name in n.names
    }
    return isinstance(target, ast.Name) and target.id in declared


def _names_in(node: ast.AST) -> set[str]:
    """Every name and dotted name inside an expression: `torch.stack(self.losses)` → torch, self.losses..."""
    return {name for n in ast.walk(node) if (name := dotted(n)) is not None}


def _accumulations(node: ast.AST) -> tuple[ast.AST, ast.expr, str] | None:
    """(target, added value, fix template) when `node` adds to a running value: `acc += v`,
    `acc = acc + v`, `acc.append(v)`. The template has `{}` where the value's fixed code goes."""
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
        return node.target, node.value, f"{source_of(node.target)} += {{}}"
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.BinOp):
        target, value = node.targets[0], node.value
        if isinstance(value.op, ast.Add) and dotted(target) is not None:
            if dotted(value.left) == dotted(target):
                return target, value.right, f"{source_of(target)} += {{}}"
            if dotted(value.right) == dotted(target):
                return target, value.left, f"{source_of(target)} += {{}}"
    if (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and node.value.func.attr == "append"
        and len(node.value.args) == 1
        and not node.value.keywords
    ):
        return node.value.func.value, node.value.args[0], f"{source_of(node.value.func)}({{}})"
    return None


def _scalar_code(flow: _GraphFlow, value: ast.expr, line: int) -> str:
    """The value's code with each graph-carrying part turned into a Python number (`.item()`)."""
    if isinstance(value, (ast.List, ast.Tuple)):
        parts = [
            _scalar_code(flow, e, line) if flow.carries_graph(e, line) is True else source_of(e) for e in value.elts
        ]
        text = ", ".join(parts)
        return f"[{text}]" if isinstance(value, ast.List) else f"({text}{',' if len(parts) == 1 else ''})"
    return f"{_wrap(source_of(value))}.item()"


def check_loss_accumulation(script: Script) -> Iterator[tuple[ast.AST, str, str]]:
    """`total += loss` or `losses.append(loss)` in a loop, where `loss` still has its autograd graph."""
    criteria = _criteria(script)
    flows: dict[ast.AST, _GraphFlow] = {}
    returns: dict[str, bool | None] = {}
    for node in ast.walk(script.tree):
        found = _accumulations(node)
        if found is None:
            continue
        target, value, template = found
        accumulator = dotted(target)
        if accumulator is None or not _persists_across_steps(script, node, target) or script.grad.without_grad(node):
            continue
        scope = script.scope(node)
        if scope not in flows:
            flows[scope] = _GraphFlow(script, scope, criteria, returns)
        flow = flows[scope]
        # Summing losses on purpose and calling backward on the sum is gradient accumulation, not a leak.
        if accumulator in flow.feeds_backward:
            continue
        line = node.lineno + 1
        carries = flow.carries_graph(value, line)
        if isinstance(value, (ast.List, ast.Tuple)):
            carries = any(flow.carries_graph(e, line) is True for e in value.elts)
        if carries is True:
            what = (
                f"`{source_of(node)}` keeps a tensor that still carries its autograd graph in `{accumulator}`"
                " on every iteration"
            )
            yield value, what, template.format(_scalar_code(flow, value, line))


def _wrap(code: str) -> str:
    """Parenthesise `code` unless it is a plain name, attribute, call or subscript."""
    try:
        expr = ast.parse(code, mode="eval").body
    except SyntaxError:
        return f"({code})"
    return code if isinstance(expr, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) else f"({code})"


def check_eval_without_no_grad(script: Script) -> Iterator[tuple[ast.AST, str, str]]:
    """Forward calls in a loop after `model.eval()` with autograd still on."""
    scopes = {script.scope(call) for call in script.calls}
    for scope in scopes:
        nodes = script.scope_nodes(scope)
        # Where each receiver enters eval mode and where it goes back to training (`.train()`).
        switches: list[tuple[int, str, bool]] = []
        for node in nodes:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.keywords:
                receiver = dotted(node.func.value)
                if receiver is None:
                    continue
                if node.func.attr == "eval" and not node.args:
                    switches.append((node.lineno, receiver, True))
                elif node.func.attr == "train":
                    evaluating = bool(node.args) and is_const(node.args[0], False)
                    switches.append((node.lineno, receiver, evaluating))
        if not any(evaluating for _, _, evaluating in switches):
            continue
        reported_loops: set[ast.AST] = set()
        for node in nodes:
            if not isinstance(node, ast.Call):
                continue
            receiver = dotted(node.func)
            if isinstance(node.func, ast.Attribute) and node.func.attr == "forward":
                receiver = dotted(node.func.value)
            if receiver is None:
                continue
            mode, eval_line = False, 0
            for line, name, evaluating in switches:
                if name == receiver and line < node.lineno:
                    mode, eval_line = evaluating, line
            loops = script.loops(node)
            if not mode or not loops or script.grad.without_grad(node):
                continue
            # The loop to wrap: the outermost one that starts after `.eval()` (not an epoch loop that
            # also trains), else the innermost.
            after_eval = [loop for loop in loops if loop.lineno > eval_line]
            loop = after_eval[-1] if after_eval else loops[0]
            if loop in reported_loops:
                continue
            reported_loops.add(loop)
            # Training with BatchNorm/dropout frozen by `.eval()` needs autograd: not an evaluation.
            if any(is_backward(n) for n in script.walk_scope(loop)):
                continue
            where = f" in `{scope.name}()`" if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else ""
            what = (
                f"`{source_of(node)}` runs after `{receiver}.eval()`{where} with autograd on: every forward pass"
                " records a graph that is never used"
            )
            if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                fix = (
                    f"wrap the loop on line {loop.lineno} in `with torch.inference_mode():` (or decorate"
                    f" `def {scope.name}(...)` with `@torch.no_grad()` if it only evaluates)"
                )
            else:
                fix = f"wrap the loop on line {loop.lineno} in `with torch.inference_mode():`"
            yield node, what, fix

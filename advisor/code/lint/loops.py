"""Which loops run once per training (or eval) step, rather than once per epoch."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from advisor.code.lint.names import ITERATOR_WRAPPERS, OPTIMIZER_NAME
from advisor.code.lint.script import Script
from advisor.code.lint.ast_nodes import dotted, is_backward, is_scope, last_part


def own_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Nodes a loop body runs itself on each iteration: inner loops and nested scopes left out."""
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) or is_scope(node):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def step_loop(script: Script, loop: ast.AST) -> bool:
    """A loop that runs once per training/eval step: a `while` loop, a loop over a DataLoader, or one
    that itself calls backward, steps an optimizer, or calls a step function of the script (one whose
    backward is not inside a loop of its own: `train_one_epoch()` is an epoch, not a step)."""
    if isinstance(loop, ast.While):
        return True
    iterable = loop.iter
    while isinstance(iterable, ast.Call) and iterable.args and dotted(iterable.func) in ITERATOR_WRAPPERS:
        iterable = iterable.args[0]
    iter_name = dotted(iterable) or ""
    if iter_name in script.loader_names or "loader" in last_part(iter_name).lower():
        return True
    for node in own_nodes(loop.body):
        if not isinstance(node, ast.Call):
            continue
        if is_backward(node):
            return True
        if isinstance(node.func, ast.Attribute) and node.func.attr == "step":
            receiver = last_part(dotted(node.func.value))
            if OPTIMIZER_NAME.search(receiver):  # optimizer.step(), scaler.step(opt); not scheduler.step()
                return True
        if isinstance(node.func, ast.Name) and node.func.id in script.functions:
            func = script.functions[node.func.id]
            if any(is_backward(n) for n in own_nodes(func.body)):
                return True
    return False

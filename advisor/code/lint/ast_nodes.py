"""Small questions about syntax nodes that every rule asks: a dotted name, an argument, a constant."""

from __future__ import annotations

import ast


def is_scope(node: ast.AST) -> bool:
    """A function, lambda, class or the module: what names are local to."""
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module))


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def last_part(name: str | None) -> str:
    """The last part of a dotted name ('' for None)."""
    return name.rsplit(".", 1)[-1] if name else ""


def argument(call: ast.Call, name: str, position: int | None = None) -> ast.expr | None:
    """The argument passed as `name=` (or at `position`), else None."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if position is not None and position < len(call.args):
        arg = call.args[position]
        if not isinstance(arg, ast.Starred):
            return arg
    return None


def has_star_kwargs(call: ast.Call) -> bool:
    """Whether the call passes `*args` or `**kwargs` (its arguments cannot all be seen)."""
    return any(kw.arg is None for kw in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args)


def is_const(node: ast.AST | None, *values: object) -> bool:
    """Whether the node is a constant equal to one of `values` (True is not 1 here)."""
    return isinstance(node, ast.Constant) and any(
        node.value is v or (type(node.value) is type(v) and node.value == v) for v in values
    )


def mentions_cuda_string(node: ast.AST) -> bool:
    """True if the expression contains a string like "cuda" / "cuda:0" (also inside f-strings)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value.startswith("cuda"):
            return True
    return False


def source_of(node: ast.AST) -> str:
    """The node's source text, as the messages quote it."""
    return ast.unparse(node)


def is_backward(node: ast.AST) -> bool:
    """A `<x>.backward(...)` call."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward"

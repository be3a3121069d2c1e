"""Where the script runs with autograd off."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from advisor.code.lint.names import NO_GRAD_CONTEXTS, SET_GRAD_ENABLED
from advisor.code.lint.ast_nodes import argument, is_const, is_scope

if TYPE_CHECKING:  # the script builds its parts: they see it, it imports them
    from advisor.code.lint.script import Script


class GradientMode:
    """Where autograd is off: inside a no_grad/inference_mode block, a function decorated with one, after
    `torch.set_grad_enabled(False)`, or in a function called only from such places."""

    def __init__(self, script: Script):
        self.script = script
        self._disabled_at: dict[ast.AST, list[int]] = {}
        self.functions_called_without_grad = self._functions_called_without_grad()

    def is_no_grad_expr(self, expr: ast.AST) -> bool:
        """`torch.no_grad()`, `torch.inference_mode()`, `torch.set_grad_enabled(False)` (or bare)."""
        target = expr.func if isinstance(expr, ast.Call) else expr
        if self.script.is_torch(target, NO_GRAD_CONTEXTS):
            if isinstance(expr, ast.Call) and is_const(argument(expr, "mode", 0), False):
                return False  # inference_mode(False) re-enables autograd
            return True
        if isinstance(expr, ast.Call) and self.script.is_torch(target, SET_GRAD_ENABLED):
            return is_const(argument(expr, "mode", 0), False)
        return False

    def function_without_grad(self, func: ast.AST) -> bool:
        """True for a function of the script that always runs with autograd off."""
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        if any(self.is_no_grad_expr(d) for d in func.decorator_list):
            return True
        return func.name in self.functions_called_without_grad

    def without_grad(self, node: ast.AST) -> bool:
        """True if `node` runs with autograd off: a no_grad/inference_mode block or decorated function."""
        for parent, _ in self.script.ancestors(node):
            if isinstance(parent, (ast.With, ast.AsyncWith)):
                if any(self.is_no_grad_expr(item.context_expr) for item in parent.items):
                    return True
            if is_scope(parent):
                if self.function_without_grad(parent):
                    return True
                if not isinstance(parent, ast.ClassDef):
                    break
        # `torch.set_grad_enabled(False)` as a statement earlier in the same scope.
        scope = self.script.scope(node)
        if scope not in self._disabled_at:
            self._disabled_at[scope] = [
                other.lineno
                for other in self.script.walk_scope(scope)
                if isinstance(other, ast.Expr)
                and isinstance(other.value, ast.Call)
                and self.script.is_torch(other.value.func, SET_GRAD_ENABLED)
                and self.is_no_grad_expr(other.value)
            ]
        return any(line < node.lineno for line in self._disabled_at[scope])

    def _functions_called_without_grad(self) -> set[str]:
        """Names of the script's functions that are called inside a no_grad block (and nowhere else)."""
        inside: set[str] = set()
        outside: set[str] = set()
        for call in self.script.calls:
            if isinstance(call.func, ast.Name) and call.func.id in self.script.functions:
                in_block = False
                for parent, _ in self.script.ancestors(call):
                    if isinstance(parent, (ast.With, ast.AsyncWith)) and any(
                        self.is_no_grad_expr(item.context_expr) for item in parent.items
                    ):
                        in_block = True
                        break
                    if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                        self.is_no_grad_expr(d) for d in parent.decorator_list
                    ):
                        in_block = True
                        break
                (inside if in_block else outside).add(call.func.id)
        return inside - outside

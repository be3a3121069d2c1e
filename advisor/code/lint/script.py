"""The parsed script: its syntax tree with parent links, import aliases, scopes and loops, and the facts
every rule shares (`Script`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from advisor.code.lint.grad_mode import GradientMode
from advisor.code.lint.models import Models
from advisor.code.lint.ast_nodes import dotted, is_scope, last_part
from advisor.code.lint.values import CommandLineOptions, CudaDevices


class Script:
    """A parsed script with parent links, import aliases and the module-wide facts the rules use: where
    autograd is off (`grad`), which names hold a CUDA device (`devices`), the command-line options and their
    defaults (`options`), which names hold a model (`models`)."""

    def __init__(self, tree: ast.Module, source: str, filename: str):
        self.tree = tree
        self.source = source
        self.filename = filename
        self._assigned: dict[ast.AST, dict[str, list[ast.expr]]] = {}
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.aliases = self._import_aliases()
        self.calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        self.local_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        self.functions = {
            n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        self.loader_names = {  # names a DataLoader is assigned to: `train_loader`, `self.loader`
            dotted(t)
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and self.is_dataloader(node.value)
            for t in node.targets
            if dotted(t)
        }
        self.functions_called_in_loops = {
            call.func.id
            for call in self.calls
            if isinstance(call.func, ast.Name) and call.func.id in self.functions and self.loops(call)
        }
        # The facts every rule shares, each in its own module.
        self.devices = CudaDevices(self)
        self.options = CommandLineOptions(self)
        self.models = Models(self)
        self.grad = GradientMode(self)

    # -- names ---------------------------------------------------------------------------------------

    def _import_aliases(self) -> dict[str, str]:
        aliases: dict[str, str] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:
                        root = alias.name.split(".")[0]
                        aliases[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        return aliases

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted name of an expression with import aliases expanded: `nn.Linear` → `torch.nn.Linear`."""
        name = dotted(node)
        if name is None:
            return None
        root, _, rest = name.partition(".")
        if root in self.aliases:
            full = self.aliases[root]
            return f"{full}.{rest}" if rest else full
        if root == "nn":  # snippets that use `nn.` without importing it
            return f"torch.nn.{rest}"
        return name

    def is_torch(self, node: ast.AST, names: set[str]) -> bool:
        """True if `node` names one of the fully qualified `names` (after alias expansion)."""
        resolved = self.resolve(node)
        return resolved in names

    def is_dataloader(self, call: ast.Call) -> bool:
        """`DataLoader(...)` from torch, however it was imported (not a class of the script's own)."""
        resolved = self.resolve(call.func)
        if last_part(resolved) != "DataLoader":
            return False
        if resolved == "DataLoader" and "DataLoader" in self.local_classes:
            return False
        return resolved.startswith("torch.") or resolved in {"DataLoader", "data.DataLoader"}

    # -- structure ------------------------------------------------------------------------------------

    def ancestors(self, node: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
        """(parent, child-on-the-path) pairs from `node` up to the module."""
        while node in self.parents:
            parent = self.parents[node]
            yield parent, node
            node = parent

    def scope(self, node: ast.AST) -> ast.AST:
        """The function, lambda, class or module that `node` belongs to."""
        for parent, _ in self.ancestors(node):
            if is_scope(parent):
                return parent
        return self.tree

    def loops(self, node: ast.AST) -> list[ast.For | ast.AsyncFor | ast.While]:
        """Loops whose body runs `node` on every iteration, innermost first, within its own scope."""
        found = []
        for parent, child in self.ancestors(node):
            if is_scope(parent):
                break
            if isinstance(parent, (ast.For, ast.AsyncFor, ast.While)) and child in parent.body:
                found.append(parent)
        return found

    def walk_scope(self, root: ast.AST) -> Iterator[ast.AST]:
        """Every node under `root` that belongs to the same scope (nested functions/classes skipped)."""
        stack = list(ast.iter_child_nodes(root))
        while stack:
            node = stack.pop()
            yield node
            if not is_scope(node):
                stack.extend(ast.iter_child_nodes(node))

    def assigned(self, scope: ast.AST) -> dict[str, list[ast.expr]]:
        """Values assigned to each (dotted) name by plain `=` in one scope, in source order (cached)."""
        if scope not in self._assigned:
            values: dict[str, list[ast.expr]] = {}
            nodes = sorted(
                (n for n in self.walk_scope(scope) if isinstance(n, ast.Assign)), key=lambda n: n.lineno
            )
            for node in nodes:
                for target in node.targets:
                    if dotted(target):
                        values.setdefault(dotted(target), []).append(node.value)
            self._assigned[scope] = values
        return self._assigned[scope]

    def scope_nodes(self, scope: ast.AST) -> list[ast.AST]:
        """The nodes of one scope in source order."""
        nodes = [n for n in self.walk_scope(scope) if hasattr(n, "lineno")]
        return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))

    def runs_per_step(self, scope: ast.AST) -> bool:
        """True for a function of the script that runs once per step: called from a loop, or named
        like `train_step` (advisor profiles `script.py:train_step`, called by a loop we may not see)."""
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        return scope.name in self.functions_called_in_loops or "step" in scope.name.lower()

"""`advisor lint`: a static check of a training script for mistakes that waste GPU memory or time.

The script is parsed, never run or imported: only its syntax tree (stdlib `ast`) is read, with simple
data flow inside one function (which names hold a loss, a model, a CUDA device, a batch). Each rule is a
small function in `RULES`; it yields `LintFinding`s that name the line, what is wrong, why it costs
memory or time, and the code change that fixes it.

JSON output (`advisor lint --json`) is a list of objects, one per finding, sorted by file and line:

    {"file": "train.py",        # the path as given on the command line
     "line": 12, "col": 9,      # 1-based position of the offending expression
     "rule": "loss-accumulation",
     "title": "loss tensor accumulated across iterations",
     "what": "...",             # this occurrence, quoting the code
     "why": "...",              # what it costs (same text for every finding of a rule)
     "fix": "..."}              # the concrete code change

A finding is silenced by a comment on its line: `# advisor: ignore` (all rules) or
`# advisor: ignore[rule-id, other-rule]`.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import json
import os
import re
import stat
import sys
import tokenize
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from advisor.errors import AdvisorError
from advisor.escape import for_terminal
from advisor.files import NotARegularFile, describe_os_error, is_regular, read_regular

if TYPE_CHECKING:  # rich is imported when findings are printed, not when they are computed
    from rich.console import Console


class LintError(AdvisorError):
    """A file that cannot be linted: missing, unreadable, not Python."""

    def __init__(self, path: object, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


@dataclasses.dataclass(frozen=True)
class LintFinding:
    """One mistake found in a script: where, which rule, what, why, and the fix."""

    file: str
    line: int
    col: int
    rule: str
    title: str
    what: str
    why: str
    fix: str

    def to_dict(self) -> dict[str, object]:
        """The finding as a JSON-ready dict (the documented `--json` shape)."""
        return dataclasses.asdict(self)

    def location(self) -> str:
        """`file:line:col`, the form editors and terminals make clickable."""
        return f"{self.file}:{self.line}:{self.col}"


# ---------------------------------------------------------------------------------------------------
# Names the rules recognise. Kept here, in one place, so a new spelling is a one-line change.

NO_GRAD_CONTEXTS = {
    "torch.no_grad",
    "torch.inference_mode",
    "torch.autograd.no_grad",
    "torch.autograd.inference_mode",
    "torch.autograd.grad_mode.no_grad",
    "torch.autograd.grad_mode.inference_mode",
}
SET_GRAD_ENABLED = {"torch.set_grad_enabled", "torch.autograd.set_grad_enabled"}

# torch.nn.functional losses, for `F.cross_entropy(...)` style criteria.
FUNCTIONAL_LOSSES = {
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "ctc_loss",
    "poisson_nll_loss", "gaussian_nll_loss", "cosine_embedding_loss", "margin_ranking_loss",
    "hinge_embedding_loss", "multi_margin_loss", "multilabel_margin_loss", "soft_margin_loss",
    "multilabel_soft_margin_loss", "triplet_margin_loss", "triplet_margin_with_distance_loss",
}
# Calls that turn a tensor into a Python number or cut it from the graph.
GRAPH_FREE_METHODS = {"item", "detach", "tolist", "numpy", "detach_"}
GRAPH_FREE_FUNCTIONS = {"float", "int", "bool", "round", "len", "str"}

BATCHNORM_NAMES = re.compile(r"^(BatchNorm[123]d|SyncBatchNorm|LazyBatchNorm[123]d|batch_norm)$")
# torchvision constructors of models that contain BatchNorm layers.
BATCHNORM_MODELS = re.compile(
    r"^(resnet\d+|resnext\w+|wide_resnet\w+|densenet\d+|mobilenet_v[23]\w*|efficientnet\w*|regnet_\w+"
    r"|inception_v3|googlenet|shufflenet\w+|mnasnet\w+|vgg\d+_bn|fcn_resnet\w+|deeplabv3_\w+)$"
)
DTYPE_HALF = {"torch.float16", "torch.half"}
DATALOADER_POSITIONAL = {"num_workers": 5, "pin_memory": 7}  # DataLoader(dataset, batch_size, ...)


# ---------------------------------------------------------------------------------------------------
# The parsed script and the facts every rule shares.


def _is_scope(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module))


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _last(name: str | None) -> str:
    return name.rsplit(".", 1)[-1] if name else ""


def _keyword(call: ast.Call, name: str, position: int | None = None) -> ast.expr | None:
    """The argument passed as `name=` (or at `position`), else None."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if position is not None and position < len(call.args):
        arg = call.args[position]
        if not isinstance(arg, ast.Starred):
            return arg
    return None


def _has_star_kwargs(call: ast.Call) -> bool:
    return any(kw.arg is None for kw in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args)


def _is_const(node: ast.AST | None, *values: object) -> bool:
    return isinstance(node, ast.Constant) and any(
        node.value is v or (type(node.value) is type(v) and node.value == v) for v in values
    )


def _mentions_cuda_string(node: ast.AST) -> bool:
    """True if the expression contains a string like "cuda" / "cuda:0" (also inside f-strings)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value.startswith("cuda"):
            return True
    return False


def _code(node: ast.AST) -> str:
    return ast.unparse(node)


class Script:
    """A parsed script with parent links, import aliases and the module-wide facts the rules use."""

    def __init__(self, tree: ast.Module, source: str, filename: str):
        self.tree = tree
        self.source = source
        self.filename = filename
        self._assigned: dict[ast.AST, dict[str, list[ast.expr]]] = {}
        self._grad_disabled_at: dict[ast.AST, list[int]] = {}
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
            _dotted(t)
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and self.is_dataloader(node.value)
            for t in node.targets
            if _dotted(t)
        }
        self.cuda_device_names = self._cuda_device_names()
        self.cli_options = self._cli_options()
        self.model_names = self._model_names()
        self.functions_called_without_grad = self._functions_called_without_grad()
        self.functions_called_in_loops = {
            call.func.id
            for call in self.calls
            if isinstance(call.func, ast.Name) and call.func.id in self.functions and self.loops(call)
        }

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
        name = _dotted(node)
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
        if _last(resolved) != "DataLoader":
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
            if _is_scope(parent):
                return parent
        return self.tree

    def loops(self, node: ast.AST) -> list[ast.For | ast.AsyncFor | ast.While]:
        """Loops whose body runs `node` on every iteration, innermost first, within its own scope."""
        found = []
        for parent, child in self.ancestors(node):
            if _is_scope(parent):
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
            if not _is_scope(node):
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
                    if _dotted(target):
                        values.setdefault(_dotted(target), []).append(node.value)
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

    # -- gradient mode ----------------------------------------------------------------------------

    def _is_no_grad_expr(self, expr: ast.AST) -> bool:
        """`torch.no_grad()`, `torch.inference_mode()`, `torch.set_grad_enabled(False)` (or bare)."""
        target = expr.func if isinstance(expr, ast.Call) else expr
        if self.is_torch(target, NO_GRAD_CONTEXTS):
            if isinstance(expr, ast.Call) and _is_const(_keyword(expr, "mode", 0), False):
                return False  # inference_mode(False) re-enables autograd
            return True
        if isinstance(expr, ast.Call) and self.is_torch(target, SET_GRAD_ENABLED):
            return _is_const(_keyword(expr, "mode", 0), False)
        return False

    def _function_without_grad(self, func: ast.AST) -> bool:
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        if any(self._is_no_grad_expr(d) for d in func.decorator_list):
            return True
        return func.name in self.functions_called_without_grad

    def without_grad(self, node: ast.AST) -> bool:
        """True if `node` runs with autograd off: a no_grad/inference_mode block or decorated function."""
        for parent, _ in self.ancestors(node):
            if isinstance(parent, (ast.With, ast.AsyncWith)):
                if any(self._is_no_grad_expr(item.context_expr) for item in parent.items):
                    return True
            if _is_scope(parent):
                if self._function_without_grad(parent):
                    return True
                if not isinstance(parent, ast.ClassDef):
                    break
        # `torch.set_grad_enabled(False)` as a statement earlier in the same scope.
        scope = self.scope(node)
        if scope not in self._grad_disabled_at:
            self._grad_disabled_at[scope] = [
                other.lineno
                for other in self.walk_scope(scope)
                if isinstance(other, ast.Expr)
                and isinstance(other.value, ast.Call)
                and self.is_torch(other.value.func, SET_GRAD_ENABLED)
                and self._is_no_grad_expr(other.value)
            ]
        return any(line < node.lineno for line in self._grad_disabled_at[scope])

    def _functions_called_without_grad(self) -> set[str]:
        """Names of the script's functions that are called inside a no_grad block (and nowhere else)."""
        inside: set[str] = set()
        outside: set[str] = set()
        for call in self.calls:
            if isinstance(call.func, ast.Name) and call.func.id in self.functions:
                in_block = False
                for parent, _ in self.ancestors(call):
                    if isinstance(parent, (ast.With, ast.AsyncWith)) and any(
                        self._is_no_grad_expr(item.context_expr) for item in parent.items
                    ):
                        in_block = True
                        break
                    if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                        self._is_no_grad_expr(d) for d in parent.decorator_list
                    ):
                        in_block = True
                        break
                (inside if in_block else outside).add(call.func.id)
        return inside - outside

    # -- data flow --------------------------------------------------------------------------------

    def _cuda_device_names(self) -> set[str]:
        """Names (or attribute names) that hold a CUDA device: `device = torch.device("cuda" ...)`."""
        names: set[str] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if _mentions_cuda_string(node.value) or self._is_cuda_call(node.value):
                    for target in targets:
                        if isinstance(target, (ast.Name, ast.Attribute)):
                            names.add(_last(_dotted(target)) or getattr(target, "attr", ""))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.posonlyargs + node.args.args
                defaults = [None] * (len(args) - len(node.args.defaults)) + list(node.args.defaults)
                pairs = list(zip(args, defaults)) + list(zip(node.args.kwonlyargs, node.args.kw_defaults))
                for arg, default in pairs:
                    if default is not None and _mentions_cuda_string(default):
                        names.add(arg.arg)
            elif isinstance(node, ast.Call) and _last(_dotted(node.func)) == "add_argument":
                # argparse: `parser.add_argument("--device", default="cuda")` → `args.device`
                default = _keyword(node, "default")
                if default is not None and _mentions_cuda_string(default):
                    for arg in node.args:
                        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                            names.add(arg.value.lstrip("-").replace("-", "_"))
        return names

    def _cli_options(self) -> dict[str, ast.Call]:
        """argparse options by destination: `--num-workers` → `num_workers` → its add_argument call."""
        options: dict[str, ast.Call] = {}
        for call in self.calls:
            if _last(_dotted(call.func)) != "add_argument":
                continue
            dest = _keyword(call, "dest")
            if isinstance(dest, ast.Constant) and isinstance(dest.value, str):
                options[dest.value] = call
                continue
            flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            long = [f for f in flags if f.startswith("--")] or flags
            if long:
                options[long[0].lstrip("-").replace("-", "_")] = call
        return options

    def constant_value(self, node: ast.AST | None) -> ast.AST | None:
        """The node itself, or for `args.num_workers` the default of its argparse option (a Constant)."""
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in self.cli_options:
            option = self.cli_options[node.attr]
            default = _keyword(option, "default")
            if default is None:
                action = _keyword(option, "action")
                if _is_const(action, "store_true"):
                    return ast.Constant(False)
                return ast.Constant(None)
            return default
        return node

    def _is_cuda_call(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and self.resolve(node.func) == "torch.cuda.current_device"

    def is_cuda_target(self, node: ast.AST) -> bool:
        """True if an argument of `.to(...)` names a CUDA device."""
        if _mentions_cuda_string(node):
            return True
        if isinstance(node, (ast.Name, ast.Attribute)):
            return _last(_dotted(node)) in self.cuda_device_names
        return False

    def cuda_copy(self, call: ast.Call) -> bool:
        """`x.cuda(...)` or `x.to(<cuda device>, ...)`."""
        if not isinstance(call.func, ast.Attribute):
            return False
        if call.func.attr == "cuda":
            return True
        if call.func.attr == "to":
            device = _keyword(call, "device", 0)
            return device is not None and self.is_cuda_target(device)
        return False

    def _model_names(self) -> set[str]:
        """Names (last part) bound to a model: an nn.Module subclass of the script, torchvision, nn.*."""
        self.module_classes = {
            n.name
            for n in ast.walk(self.tree)
            if isinstance(n, ast.ClassDef) and any(_last(self.resolve(b)) == "Module" for b in n.bases)
        }
        names = {"model", "net", "network"}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and self.is_model_expr(node.value, self.module_classes):
                for target in node.targets:
                    if isinstance(target, (ast.Name, ast.Attribute)):
                        names.add(_last(_dotted(target)))
        return names

    def is_model_expr(self, node: ast.AST, module_classes: set[str] | None = None) -> bool:
        """A model constructor call, possibly chained: `Net().cuda()`, `torchvision.models.resnet18()`."""
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(
            node.func.value, ast.Call
        ):
            node = node.func.value  # Net().to(device).half() → Net()
        if not isinstance(node, ast.Call):
            return False
        resolved = self.resolve(node.func) or ""
        if module_classes and resolved in module_classes:
            return True
        last = _last(resolved)
        if resolved.startswith("torch.nn.") and not resolved.startswith("torch.nn.functional."):
            # Layer classes (nn.Sequential, nn.Conv2d), not losses, parameters or helper functions.
            return last[:1].isupper() and not last.endswith("Loss") and last != "Parameter"
        return resolved.startswith(("torchvision.models.", "timm.create_model")) or (
            resolved.startswith("models.") and "torchvision.models" in self.aliases.values()
        )

    def is_model(self, node: ast.AST) -> bool:
        """True if `node` is a model: a known model name, or a model constructor call (`model.cuda()` too)."""
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in {
            "to", "cuda", "cpu", "float", "half", "train", "eval", "requires_grad_",
        }:
            node = node.func.value  # model.cuda().half(): look at `model`
        if isinstance(node, (ast.Name, ast.Attribute)):
            return _last(_dotted(node)) in self.model_names
        return self.is_model_expr(node, self.module_classes)

    def uses_batchnorm(self) -> bool:
        """True if the script builds BatchNorm layers itself or a torchvision model that has them."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name):
                name = node.id
            elif isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                name = node.value  # torch.hub.load("pytorch/vision", "resnet50"), timm names
            else:
                continue
            if BATCHNORM_NAMES.match(name) or BATCHNORM_MODELS.match(name):
                return True
        return False

    def keeps_batchnorm_fp32(self) -> bool:
        """True if the script puts BatchNorm back in fp32: `if isinstance(m, nn.BatchNorm2d): m.float()`."""
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.If):
                continue
            names = [getattr(n, "attr", None) or getattr(n, "id", "") for n in ast.walk(node.test)]
            if any(BATCHNORM_NAMES.match(name) for name in names) and any(
                isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "float"
                for sub in ast.walk(node)
            ):
                return True
        return False


# ---------------------------------------------------------------------------------------------------
# The rules. Each gets the parsed script and yields (node, what, fix); `lint_source` adds the rest.

RuleCheck = Callable[[Script], Iterator[tuple[ast.AST, str, str]]]


@dataclasses.dataclass(frozen=True)
class Rule:
    """A lint rule: its stable id, a short title, why it matters, and the check."""

    id: str
    title: str
    why: str
    check: RuleCheck


def _loss_call(script: Script, call: ast.Call, criteria: set[str]) -> bool:
    """A call that returns a loss tensor: `criterion(...)`, `loss_fn(...)`, `F.cross_entropy(...)`."""
    name = _dotted(call.func)
    if name is None:
        return False
    last = _last(name).lower()
    if name in criteria or "loss" in last or "criterion" in last:
        return True
    resolved = script.resolve(call.func) or ""
    return resolved.startswith("torch.nn.functional.") and _last(resolved) in FUNCTIONAL_LOSSES


def _criteria(script: Script) -> set[str]:
    """Names assigned a loss module: `criterion = nn.CrossEntropyLoss()`."""
    names = set()
    for node in ast.walk(script.tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            resolved = script.resolve(node.value.func) or ""
            if resolved.startswith("torch.nn.") and resolved.endswith("Loss"):
                names.update(_dotted(t) for t in node.targets if _dotted(t))
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
                receiver = _dotted(node.func.value)
                if receiver:
                    self.backward_on.add(receiver)
                self.feeds_backward.update(_names_in(node.func.value))
        # `loss = sum(losses); loss.backward()`: what flows into a backward() also feeds it.
        for _ in range(2):
            for node in assigns:
                if any(_dotted(t) in self.feeds_backward for t in node.targets):
                    self.feeds_backward.update(_names_in(node.value))
        for values in self.assignments.values():
            values.sort(key=lambda entry: entry[0])

    def _record(self, target: ast.AST, value: ast.expr | None, node: ast.AST) -> None:
        name = _dotted(target)
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
            name = _dotted(expr)
            if name is None:
                return None
            earlier = [entry for entry in self.assignments.get(name, []) if entry[0] < line]
            if earlier:
                at, value, node = earlier[-1]
                if self.script.without_grad(node):
                    return False  # computed under no_grad: no graph to keep
                if value is not None:
                    known = self.carries_graph(value, at, depth + 1)
                    if known is not None:
                        return known
            # Unknown origin (a parameter, `model(x)`, `outputs.loss`): backward() on it, or its name.
            if name in self.backward_on or "loss" in _last(name).lower():
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
            if self.script._function_without_grad(func):
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
            isinstance(n, ast.Return) and n.value is not None and _dotted(target) in _names_in(n.value)
            for n in script.walk_scope(scope)
        )
        return not returned or _step_loop(script, loops[0])
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
    return {name for n in ast.walk(node) if (name := _dotted(n)) is not None}


def _accumulations(node: ast.AST) -> tuple[ast.AST, ast.expr, str] | None:
    """(target, added value, fix template) when `node` adds to a running value: `acc += v`,
    `acc = acc + v`, `acc.append(v)`. The template has `{}` where the value's fixed code goes."""
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
        return node.target, node.value, f"{_code(node.target)} += {{}}"
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.BinOp):
        target, value = node.targets[0], node.value
        if isinstance(value.op, ast.Add) and _dotted(target) is not None:
            if _dotted(value.left) == _dotted(target):
                return target, value.right, f"{_code(target)} += {{}}"
            if _dotted(value.right) == _dotted(target):
                return target, value.left, f"{_code(target)} += {{}}"
    if (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and node.value.func.attr == "append"
        and len(node.value.args) == 1
        and not node.value.keywords
    ):
        return node.value.func.value, node.value.args[0], f"{_code(node.value.func)}({{}})"
    return None


def _scalar_code(flow: _GraphFlow, value: ast.expr, line: int) -> str:
    """The value's code with each graph-carrying part turned into a Python number (`.item()`)."""
    if isinstance(value, (ast.List, ast.Tuple)):
        parts = [
            _scalar_code(flow, e, line) if flow.carries_graph(e, line) is True else _code(e) for e in value.elts
        ]
        text = ", ".join(parts)
        return f"[{text}]" if isinstance(value, ast.List) else f"({text}{',' if len(parts) == 1 else ''})"
    return f"{_wrap(_code(value))}.item()"


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
        accumulator = _dotted(target)
        if accumulator is None or not _persists_across_steps(script, node, target) or script.without_grad(node):
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
                f"`{_code(node)}` keeps a tensor that still carries its autograd graph in `{accumulator}`"
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
                receiver = _dotted(node.func.value)
                if receiver is None:
                    continue
                if node.func.attr == "eval" and not node.args:
                    switches.append((node.lineno, receiver, True))
                elif node.func.attr == "train":
                    evaluating = bool(node.args) and _is_const(node.args[0], False)
                    switches.append((node.lineno, receiver, evaluating))
        if not any(evaluating for _, _, evaluating in switches):
            continue
        reported_loops: set[ast.AST] = set()
        for node in nodes:
            if not isinstance(node, ast.Call):
                continue
            receiver = _dotted(node.func)
            if isinstance(node.func, ast.Attribute) and node.func.attr == "forward":
                receiver = _dotted(node.func.value)
            if receiver is None:
                continue
            mode, eval_line = False, 0
            for line, name, evaluating in switches:
                if name == receiver and line < node.lineno:
                    mode, eval_line = evaluating, line
            loops = script.loops(node)
            if not mode or not loops or script.without_grad(node):
                continue
            # The loop to wrap: the outermost one that starts after `.eval()` (not an epoch loop that
            # also trains), else the innermost.
            after_eval = [loop for loop in loops if loop.lineno > eval_line]
            loop = after_eval[-1] if after_eval else loops[0]
            if loop in reported_loops:
                continue
            reported_loops.add(loop)
            # Training with BatchNorm/dropout frozen by `.eval()` needs autograd: not an evaluation.
            if any(_is_backward(n) for n in script.walk_scope(loop)):
                continue
            where = f" in `{scope.name}()`" if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else ""
            what = (
                f"`{_code(node)}` runs after `{receiver}.eval()`{where} with autograd on: every forward pass"
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


def _half_conversion(script: Script, call: ast.Call) -> bool:
    """`.half()`, `.to(torch.float16)`, `.to(dtype=torch.half)`, `.type(torch.float16)`."""
    if not isinstance(call.func, ast.Attribute):
        return False
    if call.func.attr == "half" and not call.args:
        return True
    if call.func.attr in {"to", "type"}:
        candidates = list(call.args) + [kw.value for kw in call.keywords if kw.arg in {"dtype", None}]
        return any(script.is_torch(arg, DTYPE_HALF) for arg in candidates)
    return False


def check_half_with_batchnorm(script: Script) -> Iterator[tuple[ast.AST, str, str]]:
    """`model.half()` on a model with BatchNorm layers, in a script that trains (calls backward)."""
    # fp16 BatchNorm in eval mode (inference with running statistics) is common and fine.
    trains = any(_is_backward(call) for call in script.calls)
    if not trains or not script.uses_batchnorm() or script.keeps_batchnorm_fp32():
        return
    for call in script.calls:
        if _half_conversion(script, call) and script.is_model(call.func.value):
            model = _code(call.func.value)
            what = f"`{_code(call)}` converts the whole model, BatchNorm layers included, to float16"
            fix = (
                f"drop `.half()` / the float16 cast and keep `{model}` in float32; run the forward pass and loss"
                " under `with torch.autocast(device_type=\"cuda\", dtype=torch.float16):` and scale the loss"
                " with `scaler = torch.amp.GradScaler(\"cuda\")`"
            )
            yield call, what, fix


def check_data_parallel(script: Script) -> Iterator[tuple[ast.AST, str, str]]:
    """`nn.DataParallel(model)`."""
    for call in script.calls:
        resolved = script.resolve(call.func)
        if _last(resolved) != "DataParallel" or "DataParallel" in script.local_classes:
            continue
        if not (resolved.startswith("torch.") or resolved == "DataParallel"):
            continue
        model = _code(call.args[0]) if call.args else "model"
        what = f"`{_code(call)}` runs one Python process that drives every GPU"
        fix = (
            f"launch with `torchrun --nproc_per_node=<gpus> script.py`, call"
            f" `torch.distributed.init_process_group(\"nccl\")` and wrap with"
            f" `torch.nn.parallel.DistributedDataParallel({model}.to(local_rank), device_ids=[local_rank])`"
            " (plus a `DistributedSampler` for the DataLoader)"
        )
        yield call, what, fix


def _with_keywords(call: ast.Call, **values: object) -> str:
    """The call's source with each `name=value` added or replaced: the concrete fixed line."""
    args = list(call.args)
    keywords = [kw for kw in call.keywords if kw.arg not in values]
    for name, value in values.items():
        position = DATALOADER_POSITIONAL.get(name)
        if position is not None and position < len(args):
            args[position] = ast.Constant(value)  # it was given positionally: replace it in place
        else:
            keywords.append(ast.keyword(arg=name, value=ast.Constant(value)))
    return _code(ast.Call(func=call.func, args=args, keywords=keywords))


# Where batches come from. An origin is a frozenset of the DataLoader calls a value may come from;
# UNKNOWN in it means "some source we cannot see" (a parameter without visible callers, a helper).
UNKNOWN = "?"
ITERATOR_WRAPPERS = {"enumerate", "iter", "zip", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "itertools.islice"}


class _BatchFlow:
    """Which names hold a batch, and from which DataLoader it was read (within a scope, plus one step
    through the script's own calls: `for b in loader: train_step(b)`, `evaluate(model, val_loader)`)."""

    def __init__(self, script: Script):
        self.script = script
        self.loader_vars: dict[str, ast.Call] = {}
        self.loader_containers: dict[str, frozenset] = {}  # `loaders = {"train": DataLoader(...), ...}`
        containers = (ast.Dict, ast.DictComp, ast.List, ast.ListComp, ast.Tuple)
        for node in ast.walk(script.tree):
            if not isinstance(node, ast.Assign):
                continue
            names = [_dotted(t) for t in node.targets if _dotted(t)]
            if isinstance(node.value, ast.Call) and script.is_dataloader(node.value):
                for name in names:
                    self.loader_vars[name] = node.value
            elif isinstance(node.value, containers):
                calls = frozenset(
                    n for n in ast.walk(node.value) if isinstance(n, ast.Call) and script.is_dataloader(n)
                )
                for name in names if calls else []:
                    self.loader_containers[name] = calls
        self._names: dict[ast.AST, dict[str, frozenset]] = {}

    def loaders_of(self, expr: ast.AST, scope: ast.AST, depth: int = 0) -> frozenset:
        """The DataLoaders an iterable expression stands for: `loader`, `enumerate(loader)`, a parameter."""
        if depth > 4:
            return frozenset({UNKNOWN})
        if isinstance(expr, ast.Call):
            if self.script.is_dataloader(expr):
                return frozenset({expr})
            if _dotted(expr.func) in ITERATOR_WRAPPERS and expr.args:
                args = expr.args if _dotted(expr.func) == "zip" else expr.args[:1]
                return frozenset().union(*(self.loaders_of(a, scope, depth + 1) for a in args))
            return frozenset({UNKNOWN})
        if isinstance(expr, ast.Subscript) and _dotted(expr.value) in self.loader_containers:
            return self.loader_containers[_dotted(expr.value)]  # dataloaders[phase]
        name = _dotted(expr)
        if name is None:
            return frozenset({UNKNOWN})
        if isinstance(expr, ast.Name) and isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # A local name or a parameter shadows a module-level loader of the same name.
            values = self.script.assigned(scope).get(name)
            if values:  # `it = iter(loader)`
                return frozenset().union(*(self.loaders_of(v, scope, depth + 1) for v in values))
            arguments = scope.args.posonlyargs + scope.args.args + scope.args.kwonlyargs
            if any(a.arg == name for a in arguments):
                return self._from_callers(scope, name, depth, self.loaders_of)
        if name in self.loader_vars:
            return frozenset({self.loader_vars[name]})
        if isinstance(expr, ast.Attribute):  # `self.train_loader` set in __init__, iterated in a method
            same_last = [call for var, call in self.loader_vars.items() if _last(var) == _last(name)]
            if same_last:
                return frozenset(same_last)
        if isinstance(expr, ast.Name):  # module level: `it = iter(loader)`
            values = self.script.assigned(self.script.tree).get(name)
            if values:
                return frozenset().union(*(self.loaders_of(v, scope, depth + 1) for v in values))
        return frozenset({UNKNOWN})

    def _from_callers(self, scope: ast.AST, param: str, depth: int, resolve: Callable) -> frozenset:
        """Resolve a parameter of the script's function `scope` through what its callers pass."""
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) or depth > 3:
            return frozenset({UNKNOWN})
        positional = [a.arg for a in scope.args.posonlyargs + scope.args.args]
        if param not in positional + [a.arg for a in scope.args.kwonlyargs]:
            return frozenset({UNKNOWN})
        sites = [c for c in self.script.calls if isinstance(c.func, ast.Name) and c.func.id == scope.name]
        if not sites:
            return frozenset({UNKNOWN})
        found: frozenset = frozenset()
        for site in sites:
            index = positional.index(param) if param in positional else None
            arg = _keyword(site, param, index)
            if arg is None:
                found |= {UNKNOWN}
            else:
                found |= resolve(arg, self.script.scope(site), depth + 1)
        return found

    def origin_of(self, expr: ast.AST, scope: ast.AST, depth: int = 0) -> frozenset:
        """The DataLoaders the batch names in `expr` were read from (empty: `expr` holds no batch)."""
        names = self.batch_names(scope, depth)
        found: frozenset = frozenset()
        for node in ast.walk(expr):
            if isinstance(node, ast.Name) and node.id in names:
                found |= names[node.id]
        return found

    def batch_names(self, scope: ast.AST, depth: int = 0) -> dict[str, frozenset]:
        """Names in `scope` bound to a batch, each with its origin."""
        if scope in self._names:
            return self._names[scope]
        self._names[scope] = names = {}  # provisional entry: a recursive call sees no batches
        if self.script.runs_per_step(scope):  # `def train_step(x, y)`: the arguments are the batch
            arguments = scope.args.posonlyargs + scope.args.args + scope.args.kwonlyargs
            for arg in arguments:
                if arg.arg not in {"self", "cls"}:
                    origin = self._from_callers(scope, arg.arg, depth, self.origin_of)
                    if origin:
                        names[arg.arg] = origin
        assignments = []
        for node in self.script.walk_scope(scope):
            if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                iterable = node.iter
                if isinstance(iterable, ast.Call) and _dotted(iterable.func) == "range":
                    continue  # counters, not batches
                origin = self.loaders_of(iterable, scope, depth)
                for n in ast.walk(node.target):
                    if isinstance(n, ast.Name):
                        names[n.id] = names.get(n.id, frozenset()) | origin
            elif isinstance(node, ast.Assign):
                assignments.append(node)
        for node in assignments:
            if isinstance(node.value, ast.Call) and _dotted(node.value.func) == "next" and node.value.args:
                origin = self.loaders_of(node.value.args[0], scope, depth)
                for n in (n for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)):
                    names[n.id] = names.get(n.id, frozenset()) | origin
        # `inputs, labels = batch`, `x = batch["x"]`: two passes reach names derived from derived names.
        for _ in range(2):
            for node in assignments:
                origin = frozenset().union(
                    *(names[n.id] for n in ast.walk(node.value) if isinstance(n, ast.Name) and n.id in names)
                )
                if origin:
                    for n in (n for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)):
                        names[n.id] = names.get(n.id, frozenset()) | origin
        return names

    def copies(self) -> list[tuple[ast.Call, frozenset]]:
        """`.cuda()` / `.to(cuda)` calls on batch data, once per step, each with the batch's origin."""
        found = []
        for call in self.script.calls:
            if not self.script.cuda_copy(call):
                continue
            scope = self.script.scope(call)
            if not (self.script.loops(call) or self.script.runs_per_step(scope)):
                continue
            receiver = call.func.value
            if self.script.is_model(receiver):
                continue
            origin = self.origin_of(receiver, scope)
            if origin:
                found.append((call, origin))
        return found


def _batch_copies(script: Script) -> list[tuple[ast.Call, frozenset]]:
    """The script's batch copies to CUDA with their origins, computed once per script."""
    if not hasattr(script, "batch_copies"):
        script.batch_copies = _BatchFlow(script).copies()
    return script.batch_copies


def _pinned(script: Script, call: ast.Call) -> bool:
    """True if a DataLoader call passes a pin_memory that is not plainly false (nor defaults to false)."""
    pin = script.constant_value(_keyword(call, "pin_memory", DATALOADER_POSITIONAL["pin_memory"]))
    return pin is not None and not _is_const(pin, False, None, 0)


def _dataloaders(script: Script) -> list[ast.Call]:
    return [c for c in script.calls if script.is_dataloader(c) and not _has_star_kwargs(c)]


def check_dataloader_workers(script: Script) -> Iterator[tuple[ast.AST, str, str]]:
    """`DataLoader(...)` that loads batches in the training process (no `num_workers`, 0, or a
    command-line option whose default is 0)."""
    for call in _dataloaders(script):
        given = _keyword(call, "num_workers", DATALOADER_POSITIONAL["num_workers"])
        workers = script.constant_value(given)
        if workers is not None and not _is_const(workers, 0, None):
            continue
        if given is None:
            shown = "without `num_workers`"
        elif workers is given:
            shown = "with `num_workers=0`"
        else:  # `num_workers=args.num_workers` and `--num-workers` defaults to 0: change the default
            option = script.cli_options[given.attr]
            what = (
                f"`{_short(call)}` takes `num_workers={_code(given)}`, whose command-line default is"
                f" {_code(workers)}: unless it is given, batches are loaded in the training process"
            )
            fixed = ast.Call(
                func=option.func,
                args=option.args,
                keywords=[kw for kw in option.keywords if kw.arg != "default"]
                + [ast.keyword(arg="default", value=ast.Constant(4))],
            )
            yield given, what, f"{_code(fixed)}  (line {option.lineno})"
            continue
        what = f"`{_short(call)}` is built {shown}: batches are loaded in the training process"
        if _keyword(call, "persistent_workers") is None:
            fix = _with_keywords(call, num_workers=4, persistent_workers=True)
        else:
            fix = _with_keywords(call, num_workers=4)
        yield call, what, fix


def check_dataloader_pin_memory(script: Script) -> Iterator[tuple[ast.AST, str, str]]:
    """`DataLoader(...)` without `pin_memory=True` whose batches are copied to CUDA."""
    copies = _batch_copies(script)
    for call in _dataloaders(script):
        if _pinned(script, call):
            continue
        # Its batches are copied, or a copy's batch comes from a source we cannot see.
        used = [copy for copy, origin in copies if call in origin or UNKNOWN in origin]
        if used:
            what = (
                f"`{_short(call)}` does not pin memory, yet its batches are copied to the GPU"
                f" (line {used[0].lineno}: `{_code(used[0])}`)"
            )
            yield call, what, _with_keywords(call, pin_memory=True)


def check_non_blocking_copy(script: Script) -> Iterator[tuple[ast.AST, str, str]]:
    """Copies to CUDA without `non_blocking=True` of batches from a DataLoader that pins memory."""
    loaders = _dataloaders(script)
    pinned = [c for c in loaders if _pinned(script, c)]
    if not pinned:
        return
    for call, origin in _batch_copies(script):
        # A batch of unknown origin counts as pinned only when every DataLoader of the script pins.
        unknown_pinned = UNKNOWN in origin and len(pinned) == len(loaders)
        sources = [c for c in pinned if c in origin] or (pinned if unknown_pinned else [])
        if not sources:
            continue
        flag = _keyword(call, "non_blocking", 1 if call.func.attr == "cuda" else None)
        if flag is None or _is_const(flag, False, 0):
            what = (
                f"`{_code(call)}` copies a pinned batch synchronously: the CPU waits for the copy"
                f" (the DataLoader on line {sources[0].lineno} uses pin_memory)"
            )
            fixed = ast.Call(
                func=call.func,
                args=call.args[:1] if call.func.attr == "cuda" else list(call.args),
                keywords=[kw for kw in call.keywords if kw.arg != "non_blocking"]
                + [ast.keyword(arg="non_blocking", value=ast.Constant(True))],
            )
            yield call, what, _code(fixed)


OPTIMIZER_NAME = re.compile(r"optim|^opt|scaler", re.IGNORECASE)


def _is_backward(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward"


def _own_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Nodes a loop body runs itself on each iteration: inner loops and nested scopes left out."""
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) or _is_scope(node):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _step_loop(script: Script, loop: ast.AST) -> bool:
    """A loop that runs once per training/eval step: a `while` loop, a loop over a DataLoader, or one
    that itself calls backward, steps an optimizer, or calls a step function of the script (one whose
    backward is not inside a loop of its own: `train_one_epoch()` is an epoch, not a step)."""
    if isinstance(loop, ast.While):
        return True
    iterable = loop.iter
    while isinstance(iterable, ast.Call) and iterable.args and _dotted(iterable.func) in ITERATOR_WRAPPERS:
        iterable = iterable.args[0]
    iter_name = _dotted(iterable) or ""
    if iter_name in script.loader_names or "loader" in _last(iter_name).lower():
        return True
    for node in _own_nodes(loop.body):
        if not isinstance(node, ast.Call):
            continue
        if _is_backward(node):
            return True
        if isinstance(node.func, ast.Attribute) and node.func.attr == "step":
            receiver = _last(_dotted(node.func.value))
            if OPTIMIZER_NAME.search(receiver):  # optimizer.step(), scaler.step(opt); not scheduler.step()
                return True
        if isinstance(node.func, ast.Name) and node.func.id in script.functions:
            func = script.functions[node.func.id]
            if any(_is_backward(n) for n in _own_nodes(func.body)):
                return True
    return False


def check_empty_cache_in_loop(script: Script) -> Iterator[tuple[ast.AST, str, str]]:
    """`torch.cuda.empty_cache()` in a loop that runs once per step."""
    for call in script.calls:
        if not script.is_torch(call.func, {"torch.cuda.empty_cache"}):
            continue
        loops = script.loops(call)
        if loops and _step_loop(script, loops[0]):
            what = (
                f"`{_code(call)}` runs on every iteration of the loop on line {loops[0].lineno}: it returns cached"
                " blocks to the driver, so the next step must allocate them again"
            )
            fix = (
                f"delete the call on line {call.lineno}; if memory is fragmented, set"
                " `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` instead"
            )
            yield call, what, fix


def _short(call: ast.Call) -> str:
    """The call's source, shortened for a message."""
    text = _code(call)
    return text if len(text) <= 60 else text[:57] + "..."


RULES: dict[str, Rule] = {
    rule.id: rule
    for rule in [
        Rule(
            "loss-accumulation",
            "loss tensor accumulated across iterations",
            "The sum is a tensor that references the autograd graph of every iteration it was added in, so "
            "activations are never freed and memory grows step after step until CUDA runs out of memory.",
            check_loss_accumulation,
        ),
        Rule(
            "eval-without-no-grad",
            "evaluation with autograd enabled",
            "model.eval() changes dropout and BatchNorm, not autograd: without torch.no_grad() or "
            "torch.inference_mode() every forward pass stores its activations for a backward that never "
            "comes, costing memory (often a smaller possible eval batch) and time.",
            check_eval_without_no_grad,
        ),
        Rule(
            "half-with-batchnorm",
            "model.half() with BatchNorm layers",
            "BatchNorm running statistics and its variance computation in float16 overflow and lose "
            "precision, so training becomes unstable (NaN losses) and accuracy drops. torch.autocast runs "
            "matmuls and convolutions in float16 but keeps BatchNorm and the weights in float32.",
            check_half_with_batchnorm,
        ),
        Rule(
            "data-parallel",
            "nn.DataParallel",
            "DataParallel replicates the model and scatters inputs from one Python thread on every step; the "
            "GIL and the copies through GPU 0 make it slower than DistributedDataParallel (one process per "
            "GPU), which PyTorch recommends even on a single machine.",
            check_data_parallel,
        ),
        Rule(
            "dataloader-num-workers",
            "DataLoader without worker processes",
            "With num_workers=0 (the default) loading, decoding and augmenting each batch runs in the "
            "training process between steps, and the GPU waits for it. Start with 4 workers (up to the CPU "
            "cores per GPU); persistent_workers=True keeps them alive between epochs.",
            check_dataloader_workers,
        ),
        Rule(
            "dataloader-pin-memory",
            "DataLoader without pin_memory on a CUDA path",
            "Copies from pageable host memory go through a staging buffer and cannot run asynchronously; "
            "pin_memory=True puts batches in page-locked memory, so host-to-device copies are faster and can "
            "overlap compute.",
            check_dataloader_pin_memory,
        ),
        Rule(
            "non-blocking-copy",
            "synchronous copy of a pinned batch",
            "Without non_blocking=True a copy from pinned memory still blocks the CPU until it finishes, so "
            "the next kernels are queued late; with it the copy overlaps the work already queued on the GPU.",
            check_non_blocking_copy,
        ),
        Rule(
            "empty-cache-in-loop",
            "torch.cuda.empty_cache() inside the training loop",
            "empty_cache() releases the caching allocator's free blocks to the driver; the next step has to "
            "cudaMalloc them again, which synchronizes the device and slows every step. It does not make "
            "more memory available to PyTorch itself.",
            check_empty_cache_in_loop,
        ),
    ]
}


# ---------------------------------------------------------------------------------------------------
# Running the rules.

_IGNORE = re.compile(r"#\s*advisor:\s*ignore(?:\[([^\]]*)\])?")


def _ignored_lines(source: str) -> dict[int, set[str] | None]:
    """Lines with `# advisor: ignore[...]` comments: line → rule ids (None means every rule)."""
    ignored: dict[int, set[str] | None] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT and (match := _IGNORE.search(token.string)):
                rules = match.group(1)
                ignored[token.start[0]] = (
                    None if rules is None else {r.strip() for r in rules.split(",") if r.strip()}
                )
    except (tokenize.TokenError, SyntaxError):
        pass
    return ignored


def lint_tree(tree: ast.Module, source: str, filename: str) -> list[LintFinding]:
    """Run every rule on an already parsed script; LintError if it is too deeply nested to walk."""
    try:
        return _lint_tree(tree, source, filename)
    except RecursionError:  # a tree Python could parse but not walk back recursively (a very long expression)
        raise LintError(filename, "an expression is nested too deeply (or is too long) to check") from None


def _lint_tree(tree: ast.Module, source: str, filename: str) -> list[LintFinding]:
    script = Script(tree, source, filename)
    ignored = _ignored_lines(source)
    findings: set[LintFinding] = set()
    for rule in RULES.values():
        for node, what, fix in rule.check(script):
            line = getattr(node, "lineno", 1)
            skip = ignored.get(line, set())
            if skip is None or rule.id in skip:
                continue
            findings.add(
                LintFinding(
                    file=filename,
                    line=line,
                    col=getattr(node, "col_offset", 0) + 1,
                    rule=rule.id,
                    title=rule.title,
                    what=what,
                    why=rule.why,
                    fix=fix,
                )
            )
    return sorted(findings, key=lambda f: (f.file, f.line, f.col, f.rule))


def parse_source(source: str, filename: str) -> ast.Module:
    """The syntax tree of a script; LintError (`file:line:col: syntax error: ...`) if it is not Python."""
    try:
        return ast.parse(source, filename=filename)
    except SyntaxError as exc:
        where = filename
        if exc.lineno is not None:
            where = f"{filename}:{exc.lineno}" + (f":{exc.offset}" if exc.offset else "")
        raise LintError(where, f"syntax error: {exc.msg}") from None
    except ValueError as exc:  # null bytes, on Pythons that report them this way
        raise LintError(filename, f"not Python source: {exc}") from None
    except (RecursionError, MemoryError):  # Python's own parser gives up on very deeply nested expressions
        raise LintError(filename, "an expression is nested too deeply (or is too long) to check") from None


def lint_source(source: str, filename: str = "<string>") -> list[LintFinding]:
    """Lint Python source text; raises LintError if it is not valid Python."""
    return lint_tree(parse_source(source, filename), source, filename)


def read_source(path: str | Path) -> str:
    """The text of a Python file, decoded as Python does (PEP 263 coding line); LintError if unreadable.
    Only a regular file is read: a FIFO or a device is refused, not waited on."""
    path = Path(path)
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            raise LintError(path, "is a directory, not a Python file")
        data = read_regular(path)
    except FileNotFoundError:
        raise LintError(path, "no such file") from None
    except NotARegularFile:
        raise LintError(path, "not a regular file (a FIFO, socket or device)") from None
    except OSError as exc:
        raise LintError(path, f"cannot read: {describe_os_error(exc)}") from None
    except ValueError as exc:  # a NUL in the name
        raise LintError(path, f"not a usable path ({exc})") from None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        raise LintError(path, "cannot decode: not UTF-8 and no valid `# coding:` line") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as Python reads source


def lint_file(path: str | Path) -> list[LintFinding]:
    """Lint one Python file; raises LintError if it is missing, unreadable or not valid Python."""
    return lint_source(read_source(path), str(path))


def script_findings(script: Path) -> list[dict] | None:
    """Findings on the script a trial names, as JSON-ready dicts (they can name the line behind a leak);
    None if it is not a regular .py file or cannot be linted (the path comes from trial.json: nothing else
    is opened)."""
    if not script.name.endswith(".py") or not is_regular(script):
        return None
    try:
        return [f.to_dict() for f in lint_file(script)]
    except LintError:
        return None


SKIPPED_FOLDERS = {"venv", "site-packages", "__pycache__", "node_modules", "build", "dist"}


def expand_paths(paths: list[str]) -> list[Path]:
    """Files to lint: each file as given, each folder as its `*.py` files (sorted, recursive; hidden
    folders, virtual environments and build output left out)."""
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*.py")
                if not any(part.startswith(".") or part in SKIPPED_FOLDERS for part in p.relative_to(path).parts)
            )
            if not found:
                raise LintError(path, "folder has no .py files")
            files.extend(found)
        else:
            files.append(path)
    return files


# ---------------------------------------------------------------------------------------------------
# Command line.


def add_lint_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `advisor lint`."""
    parser.add_argument("paths", nargs="+", metavar="script.py", help="Python files (or folders) to check")
    parser.add_argument("--json", action="store_true", help="print the findings as a JSON list")


def lint_command(args: argparse.Namespace) -> int:
    """`advisor lint`: exit 1 if anything is found, 0 if clean, 2 (LintError) for bad input."""
    files = expand_paths(args.paths)
    # Read and parse everything first so that a bad file fails the command before any output.
    parsed = []
    for path in files:
        source = read_source(path)
        parsed.append((parse_source(source, str(path)), source, str(path)))
    findings = [finding for tree, source, name in parsed for finding in lint_tree(tree, source, name)]
    if args.json:
        json.dump([f.to_dict() for f in findings], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_findings(findings, len(files))
    return 1 if findings else 0


def print_findings(findings: list[LintFinding], file_count: int, console: Console | None = None) -> None:
    """Print findings as a readable list with rich: location and rule, then what, why, fix.

    The why of a rule is printed at its first finding only: it is the same text every time."""
    from rich.console import Console
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    console = console or Console(highlight=False)
    explained: set[str] = set()
    for finding in findings:
        header = Text()
        header.append(for_terminal(finding.location()), style="bold")
        header.append("  ")
        header.append(finding.rule, style="bold yellow")
        header.append(f"  {finding.title}")
        console.print(header)
        # A two-column grid keeps wrapped lines aligned under their text, not under the label.
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="cyan", no_wrap=True)
        grid.add_column()
        # What and fix quote the script's code: a control character in a string literal is shown escaped.
        grid.add_row("what", Text(for_terminal(finding.what)))
        if finding.rule not in explained:
            grid.add_row("why", Text(finding.why, style="dim"))
            explained.add(finding.rule)
        grid.add_row("fix", Text("\n".join(for_terminal(line) for line in finding.fix.split("\n")), style="green"))
        console.print(Padding(grid, (0, 0, 1, 4)))
    files = "file" if file_count == 1 else "files"
    if findings:
        noun = "finding" if len(findings) == 1 else "findings"
        console.print(Text(f"{len(findings)} {noun} in {file_count} {files}", style="bold"))
    else:
        console.print(Text(f"No findings in {file_count} {files}", style="bold green"))

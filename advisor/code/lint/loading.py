"""Rules about the input pipeline: DataLoaders without workers or pinned memory, synchronous copies of
pinned batches. Which names hold a batch, and from which DataLoader, is followed through the script."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from advisor.code.lint.names import DATALOADER_POSITIONAL, ITERATOR_WRAPPERS
from advisor.code.lint.script import Script
from advisor.code.lint.ast_nodes import argument, dotted, has_star_kwargs, is_const, last_part, source_of


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
    return source_of(ast.Call(func=call.func, args=args, keywords=keywords))


# Where batches come from. An origin is a frozenset of the DataLoader calls a value may come from;
# UNKNOWN in it means "some source we cannot see" (a parameter without visible callers, a helper).
UNKNOWN = "?"


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
            names = [dotted(t) for t in node.targets if dotted(t)]
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
            if dotted(expr.func) in ITERATOR_WRAPPERS and expr.args:
                args = expr.args if dotted(expr.func) == "zip" else expr.args[:1]
                return frozenset().union(*(self.loaders_of(a, scope, depth + 1) for a in args))
            return frozenset({UNKNOWN})
        if isinstance(expr, ast.Subscript) and dotted(expr.value) in self.loader_containers:
            return self.loader_containers[dotted(expr.value)]  # dataloaders[phase]
        name = dotted(expr)
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
            same_last = [call for var, call in self.loader_vars.items() if last_part(var) == last_part(name)]
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
            arg = argument(site, param, index)
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
                if isinstance(iterable, ast.Call) and dotted(iterable.func) == "range":
                    continue  # counters, not batches
                origin = self.loaders_of(iterable, scope, depth)
                for n in ast.walk(node.target):
                    if isinstance(n, ast.Name):
                        names[n.id] = names.get(n.id, frozenset()) | origin
            elif isinstance(node, ast.Assign):
                assignments.append(node)
        for node in assignments:
            if isinstance(node.value, ast.Call) and dotted(node.value.func) == "next" and node.value.args:
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
            if not self.script.devices.cuda_copy(call):
                continue
            scope = self.script.scope(call)
            if not (self.script.loops(call) or self.script.runs_per_step(scope)):
                continue
            receiver = call.func.value
            if self.script.models.is_model(receiver):
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
    pin = script.options.constant_value(argument(call, "pin_memory", DATALOADER_POSITIONAL["pin_memory"]))
    return pin is not None and not is_const(pin, False, None, 0)


def _dataloaders(script: Script) -> list[ast.Call]:
    return [c for c in script.calls if script.is_dataloader(c) and not has_star_kwargs(c)]


def check_dataloader_workers(script: Script) -> Iterator[tuple[ast.AST, str, str]]:
    """`DataLoader(...)` that loads batches in the training process (no `num_workers`, 0, or a
    command-line option whose default is 0)."""
    for call in _dataloaders(script):
        given = argument(call, "num_workers", DATALOADER_POSITIONAL["num_workers"])
        workers = script.options.constant_value(given)
        if workers is not None and not is_const(workers, 0, None):
            continue
        if given is None:
            shown = "without `num_workers`"
        elif workers is given:
            shown = "with `num_workers=0`"
        else:  # `num_workers=args.num_workers` and `--num-workers` defaults to 0: change the default
            option = script.options.by_dest[given.attr]
            what = (
                f"`{_short(call)}` takes `num_workers={source_of(given)}`, whose command-line default is"
                f" {source_of(workers)}: unless it is given, batches are loaded in the training process"
            )
            fixed = ast.Call(
                func=option.func,
                args=option.args,
                keywords=[kw for kw in option.keywords if kw.arg != "default"]
                + [ast.keyword(arg="default", value=ast.Constant(4))],
            )
            yield given, what, f"{source_of(fixed)}  (line {option.lineno})"
            continue
        what = f"`{_short(call)}` is built {shown}: batches are loaded in the training process"
        if argument(call, "persistent_workers") is None:
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
                f" (line {used[0].lineno}: `{source_of(used[0])}`)"
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
        flag = argument(call, "non_blocking", 1 if call.func.attr == "cuda" else None)
        if flag is None or is_const(flag, False, 0):
            what = (
                f"`{source_of(call)}` copies a pinned batch synchronously: the CPU waits for the copy"
                f" (the DataLoader on line {sources[0].lineno} uses pin_memory)"
            )
            fixed = ast.Call(
                func=call.func,
                args=call.args[:1] if call.func.attr == "cuda" else list(call.args),
                keywords=[kw for kw in call.keywords if kw.arg != "non_blocking"]
                + [ast.keyword(arg="non_blocking", value=ast.Constant(True))],
            )
            yield call, what, source_of(fixed)


def _short(call: ast.Call) -> str:
    """The call's source, shortened for a message."""
    text = source_of(call)
    return text if len(text) <= 60 else text[:57] + "..."

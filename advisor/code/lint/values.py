"""Where values come from: names that hold a CUDA device, command-line options and their defaults."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from advisor.code.lint.ast_nodes import argument, dotted, is_const, last_part, mentions_cuda_string

if TYPE_CHECKING:  # the script builds its parts: they see it, it imports them
    from advisor.code.lint.script import Script


class CudaDevices:
    """Names that hold a CUDA device (`device = torch.device("cuda")`, a parameter or argparse default
    "cuda"), and the calls that copy to one."""

    def __init__(self, script: Script):
        self.script = script
        self.names = self._cuda_device_names()

    def _cuda_device_names(self) -> set[str]:
        """Names (or attribute names) that hold a CUDA device: `device = torch.device("cuda" ...)`."""
        names: set[str] = set()
        for node in ast.walk(self.script.tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if mentions_cuda_string(node.value) or self.is_cuda_call(node.value):
                    for target in targets:
                        if isinstance(target, (ast.Name, ast.Attribute)):
                            names.add(last_part(dotted(target)) or getattr(target, "attr", ""))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.posonlyargs + node.args.args
                defaults = [None] * (len(args) - len(node.args.defaults)) + list(node.args.defaults)
                pairs = list(zip(args, defaults)) + list(zip(node.args.kwonlyargs, node.args.kw_defaults))
                for arg, default in pairs:
                    if default is not None and mentions_cuda_string(default):
                        names.add(arg.arg)
            elif isinstance(node, ast.Call) and last_part(dotted(node.func)) == "add_argument":
                # argparse: `parser.add_argument("--device", default="cuda")` → `args.device`
                default = argument(node, "default")
                if default is not None and mentions_cuda_string(default):
                    for arg in node.args:
                        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                            names.add(arg.value.lstrip("-").replace("-", "_"))
        return names

    def is_cuda_call(self, node: ast.AST) -> bool:
        """`torch.cuda.current_device()`."""
        return isinstance(node, ast.Call) and self.script.resolve(node.func) == "torch.cuda.current_device"

    def is_cuda_target(self, node: ast.AST) -> bool:
        """True if an argument of `.to(...)` names a CUDA device."""
        if mentions_cuda_string(node):
            return True
        if isinstance(node, (ast.Name, ast.Attribute)):
            return last_part(dotted(node)) in self.names
        return False

    def cuda_copy(self, call: ast.Call) -> bool:
        """`x.cuda(...)` or `x.to(<cuda device>, ...)`."""
        if not isinstance(call.func, ast.Attribute):
            return False
        if call.func.attr == "cuda":
            return True
        if call.func.attr == "to":
            device = argument(call, "device", 0)
            return device is not None and self.is_cuda_target(device)
        return False


class CommandLineOptions:
    """The script's argparse options by destination, and the defaults a name like `args.num_workers` has."""

    def __init__(self, script: Script):
        self.script = script
        self.by_dest = self._cli_options()

    def _cli_options(self) -> dict[str, ast.Call]:
        """argparse options by destination: `--num-workers` → `num_workers` → its add_argument call."""
        options: dict[str, ast.Call] = {}
        for call in self.script.calls:
            if last_part(dotted(call.func)) != "add_argument":
                continue
            dest = argument(call, "dest")
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
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in self.by_dest:
            option = self.by_dest[node.attr]
            default = argument(option, "default")
            if default is None:
                action = argument(option, "action")
                if is_const(action, "store_true"):
                    return ast.Constant(False)
                return ast.Constant(None)
            return default
        return node

"""What the script defines, read once: module constants, argparse defaults, optimizers, schedulers, devices,
the functions there are (`ScriptFacts`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from advisor.code.syntax import dotted, keyword_arg, literal_value


def argparse_dest(call: cst.Call) -> str | None:
    """The attribute name `parser.add_argument(...)` stores into."""
    options = []
    for arg in call.args:
        if arg.keyword is not None:
            if arg.keyword.value == "dest" and isinstance(arg.value, cst.SimpleString):
                return str(arg.value.evaluated_value)
            continue
        if isinstance(arg.value, cst.SimpleString):
            options.append(str(arg.value.evaluated_value))
    if not options:
        return None
    chosen = next((o for o in options if o.startswith("--")), options[0])
    return chosen.lstrip("-").replace("-", "_") or None


def is_optimizer_constructor(call: cst.Call, optim_imports: set[str]) -> bool:
    """`torch.optim.X(...)`, `optim.X(...)` or `X(...)` with X imported from torch.optim."""
    name = dotted(call.func) or ""
    if "lr_scheduler" in name:
        return False
    return name.startswith(("torch.optim.", "optim.")) or name in optim_imports


@dataclass
class ScriptFacts:
    """What one read of the syntax tree learns about the script, for the rewrites to use."""

    module: cst.Module
    constants: dict[str, list[Any]] = field(default_factory=dict)  # module-level NAME = literal
    argparse_defaults: dict[str, list[tuple[bool, Any]]] = field(default_factory=dict)  # dest -> defaults
    optimizers: set[str] = field(default_factory=set)
    schedulers: set[str] = field(default_factory=set)
    module_devices: dict[str, str] = field(default_factory=dict)  # name -> "device" | "str"
    class_devices: dict[str, set[str]] = field(default_factory=dict)  # class -> {attr of self}
    functions: dict[str, int] = field(default_factory=dict)  # "f" / "C.m" -> how many definitions
    module_names: set[str] = field(default_factory=set)
    torch_bound: bool = False
    mentions_cuda: bool = False
    optim_imports: set[str] = field(default_factory=set)  # names imported from torch.optim
    # NAME = {"key": value, ...} anywhere (None: NAME assigned something else too), and what may change them after:
    # the arguments of NAME.update(...) and the keys of NAME[key] = ... (None: a key not written as a literal).
    dicts: dict[str, list[cst.Dict | None]] = field(default_factory=dict)
    dict_updates: dict[str, list[cst.BaseExpression]] = field(default_factory=dict)
    dict_keys_set: dict[str, list[Any]] = field(default_factory=dict)

    @classmethod
    def collect(cls, module: cst.Module) -> "ScriptFacts":
        """Read the whole module once."""
        facts = cls(module)
        facts._read_module_level()
        module.visit(_FactsVisitor(facts))
        return facts

    def _read_module_level(self) -> None:
        for statement in self.module.body:
            if not isinstance(statement, cst.SimpleStatementLine):
                if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                    self.module_names.add(statement.name.value)
                continue
            for small in statement.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                    for alias in small.names:
                        bound = alias.evaluated_alias or alias.evaluated_name
                        self.module_names.add(bound.split(".")[0])
                if isinstance(small, cst.Assign):
                    for t in small.targets:
                        if isinstance(t.target, cst.Name):
                            self._module_assignment(t.target.value, small.value, single=len(small.targets) == 1)
                elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                    if small.value is not None:
                        self._module_assignment(small.target.value, small.value, single=True)

    def _module_assignment(self, name: str, value: cst.BaseExpression, *, single: bool) -> None:
        self.module_names.add(name)
        ok, literal = literal_value(value)
        # A name assigned twice is not a constant: record a marker that never matches.
        self.constants.setdefault(name, []).append(literal if ok and single else NOT_LITERAL)
        if isinstance(value, cst.Call) and dotted(value.func) in ("torch.device", "device"):
            self.module_devices[name] = "device"
        elif isinstance(value, (cst.SimpleString, cst.IfExp)):
            self.module_devices.setdefault(name, "str")

    def constant(self, name: str) -> tuple[bool, Any]:
        """(True, value) when `name` is assigned exactly once at module level, to a literal."""
        values = self.constants.get(name, [])
        if len(values) == 1 and values[0] is not NOT_LITERAL:
            return True, values[0]
        return False, None

    def argparse_default(self, dest: str) -> tuple[bool, Any]:
        """(True, value) when every `add_argument` for `dest` has the same literal `default=`."""
        defaults = self.argparse_defaults.get(dest, [])
        if defaults and all(ok for ok, _ in defaults) and len({repr(v) for _, v in defaults}) == 1:
            return True, defaults[0][1]
        return False, None

    def mapping_entry(self, name: str, key: str) -> cst.BaseExpression | None:
        """What `key` is in the mapping NAME (`DataLoader(data, **NAME)`), where that is known from the source alone:
        NAME assigned once, to a dict literal that has `key`, and nothing after it that could set `key` (an
        `update` from a dict literal without it, or a name assigned once to one, leaves it alone). Else None."""
        assigned = self.dicts.get(name, [])
        if len(assigned) != 1 or assigned[0] is None:
            return None
        entry = _entry(assigned[0], key)
        if entry is None or any(k is None or k == key for k in self.dict_keys_set.get(name, [])):
            return None
        for update in self.dict_updates.get(name, []):
            other = update if isinstance(update, cst.Dict) else None
            if isinstance(update, cst.Name) and len(self.dicts.get(update.value, [])) == 1:
                other = self.dicts[update.value][0]
            if other is None or not _plain(other) or _entry(other, key) is not None:
                return None
        return entry

    def target_exists(self, target: str) -> bool:
        """Whether `f` (a function not directly in a class) or `C.m` is defined."""
        return bool(self.functions.get(target))

    def not_found_message(self, target: str) -> str:
        """One line: the target is missing, and what is there instead."""
        names = ", ".join(sorted(self.functions)[:12]) or "none"
        return f"no function {target!r} is defined (functions found: {names})"

    def free_name(self, *candidates: str) -> str:
        """The first candidate the module does not already bind."""
        return next((c for c in candidates if c not in self.module_names), candidates[-1])


NOT_LITERAL = object()


def _plain(mapping: cst.Dict) -> bool:
    """A dict literal whose every key is a string literal (no `**other` in it)."""
    return all(isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString) for e in mapping.elements)


def _entry(mapping: cst.Dict, key: str) -> cst.BaseExpression | None:
    """The value of `key` in a plain dict literal; None where it has none, or is not plain."""
    if not _plain(mapping):
        return None
    return next((e.value for e in mapping.elements if e.key.evaluated_value == key), None)  # type: ignore[union-attr]


class _FactsVisitor(cst.CSTVisitor):
    """Collects optimizers, schedulers, argparse defaults, devices and function definitions."""

    def __init__(self, facts: ScriptFacts):
        super().__init__()
        self.facts = facts
        self.owners: list[str | None] = []  # class name, or None for a function, innermost last
        self.optim_imports = facts.optim_imports

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = dotted(alias.name) or ""
            # `import torch.nn` binds torch too; `import torch as t` does not.
            if alias.asname is None and (name == "torch" or name.startswith("torch.")):
                self.facts.torch_bound = True

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        source = dotted(node.module) if node.module is not None else ""
        if source == "torch.optim" and not isinstance(node.names, cst.ImportStar):
            self.optim_imports.update((a.asname.name.value if a.asname else a.name.value)  # type: ignore[union-attr]
                                      for a in node.names)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.owners.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.owners.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        owner = self.owners[-1] if self.owners else None
        key = f"{owner}.{node.name.value}" if owner else node.name.value
        for param in (*node.params.posonly_params, *node.params.params, *node.params.kwonly_params):
            annotation = self.facts.module.code_for_node(param.annotation.annotation) if param.annotation else ""
            if annotation.endswith("Optimizer"):
                self.facts.optimizers.add(param.name.value)
        self.facts.functions[key] = self.facts.functions.get(key, 0) + 1
        self.owners.append(None)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.owners.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            if isinstance(t.target, cst.Name):
                self.facts.dicts.setdefault(t.target.value, []).append(
                    node.value if isinstance(node.value, cst.Dict) and len(node.targets) == 1 else None)
            elif isinstance(t.target, cst.Subscript) and isinstance(t.target.value, cst.Name):
                index = t.target.slice[0].slice if len(t.target.slice) == 1 else None
                ok, key = literal_value(index.value) if isinstance(index, cst.Index) else (False, None)
                self.facts.dict_keys_set.setdefault(t.target.value.value, []).append(key if ok else None)
        if not isinstance(node.value, cst.Call):
            return
        func = dotted(node.value.func) or ""
        for t in node.targets:
            name = dotted(t.target)
            if name is None:
                continue
            if "lr_scheduler" in func:
                self.facts.schedulers.add(name)
            elif is_optimizer_constructor(node.value, self.optim_imports):
                self.facts.optimizers.add(name)
            elif func in ("torch.device", "device") and name.startswith("self."):
                cls = next((o for o in reversed(self.owners) if o is not None), None)
                if cls is not None:
                    self.facts.class_devices.setdefault(cls, set()).add(name)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.target, cst.Name):  # `kwargs |= other` updates it as `kwargs.update(other)` does
            self.facts.dict_updates.setdefault(node.target.value, []).append(
                node.value if isinstance(node.operator, cst.BitOrAssign) else cst.Ellipsis())

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Attribute):
            attr = node.func.attr.value
            if attr == "add_argument":
                dest = argparse_dest(node)
                if dest:
                    default = keyword_arg(node, "default")
                    entry = literal_value(default.value) if default else (False, None)
                    self.facts.argparse_defaults.setdefault(dest, []).append(entry)
            elif attr == "cuda":
                self.facts.mentions_cuda = True
            elif attr in ("update", "pop", "popitem", "setdefault", "clear") and isinstance(node.func.value, cst.Name):
                # One positional mapping given to update; keywords, more arguments or another mutation: nothing
                # known of what it sets or takes out.
                known = (attr == "update" and len(node.args) == 1 and node.args[0].keyword is None
                         and not node.args[0].star)
                self.facts.dict_updates.setdefault(node.func.value.value, []).append(
                    node.args[0].value if known else cst.Ellipsis())

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = node.evaluated_value
        if isinstance(value, str) and (value == "cuda" or value.startswith("cuda:")):
            self.facts.mentions_cuda = True

"""Where a script's setting is set: the literal behind `DataLoader(batch_size=config.batch_size)`, even in
another module of the user's repository.

A suggested patch must change the place that sets a value — a config field's default, an attribute the
script assigns, a keyword of a config's constructor, a function's parameter default — not write a
literal over the expression that reads it (that would silently disable the script's own setting). The
search reads the syntax trees (libcst) of the files that matter: the script, the file that builds the
training loader, and the modules of the repository they import. A definition qualifies only when its
literal is the value the trial saw, so a default overridden elsewhere is never the one changed. Torch is
never imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from advisor.code.syntax import literal_node, literal_value

KINDS_BY_PREFERENCE = ("attribute", "keyword", "field", "parameter")


@dataclass(frozen=True)
class Definition:
    """One place that sets `name` to a literal: its file, its line, and what kind of place it is."""

    file: Path
    line: int
    name: str
    kind: str  # "attribute" (x.name = 1), "keyword" (Config(name=1)), "field" (class body), "parameter"
    value: Any


def parse(path: Path) -> cst.Module | None:
    """A file's syntax tree, or None when it cannot be read or parsed."""
    try:
        return cst.parse_module(path.read_bytes())
    except (OSError, cst.ParserSyntaxError, UnicodeDecodeError):
        return None


def imported_files(module: cst.Module, folder: Path, root: Path) -> list[Path]:
    """The .py files of the modules a file imports that lie inside the repository (`root`)."""
    names: list[str] = []

    class Imports(cst.CSTVisitor):
        def visit_Import(self, node: cst.Import) -> None:
            names.extend(cst.Module([]).code_for_node(alias.name) for alias in node.names)

        def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
            if node.module is not None and not node.relative:
                names.append(cst.Module([]).code_for_node(node.module))

    module.visit(Imports())
    found = []
    for name in names:
        for base in (folder, root):
            path = base.joinpath(*name.split("."))
            for candidate in (path.with_suffix(".py"), path / "__init__.py"):
                if candidate.is_file() and candidate.resolve().is_relative_to(root.resolve()):
                    found.append(candidate.resolve())
    return found


def search_files(script: Path, loader_file: Path, root: Path) -> list[Path]:
    """The script, the loader's file, then the repository modules either imports (each once, in that order)."""
    ordered: list[Path] = []
    for path in (script.resolve(), loader_file.resolve()):
        if path not in ordered:
            ordered.append(path)
    for path in list(ordered):
        module = parse(path)
        if module is not None:
            for found in imported_files(module, path.parent, root):
                if found not in ordered:
                    ordered.append(found)
    return ordered


class _Definitions(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, path: Path, name: str, parameters: bool):
        super().__init__()
        self.path, self.name, self.parameters = path, name, parameters
        self.found: list[Definition] = []
        self.classes = 0

    def _add(self, node: cst.CSTNode, kind: str, value_node: cst.BaseExpression) -> None:
        ok, value = literal_value(value_node)
        if ok:
            line = self.get_metadata(PositionProvider, node).start.line
            self.found.append(Definition(self.path, line, self.name, kind, value))

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        for statement in node.body.body if isinstance(node.body, cst.IndentedBlock) else ():
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value is not None:
                    if small.target.value == self.name:
                        self._add(small, "field", small.value)
                elif isinstance(small, cst.Assign) and len(small.targets) == 1:
                    target = small.targets[0].target
                    if isinstance(target, cst.Name) and target.value == self.name:
                        self._add(small, "field", small.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if isinstance(target.target, cst.Attribute) and target.target.attr.value == self.name:
                self._add(node, "attribute", node.value)

    def visit_Call(self, node: cst.Call) -> None:
        callee = node.func.attr.value if isinstance(node.func, cst.Attribute) else (
            node.func.value if isinstance(node.func, cst.Name) else "")
        if callee in ("DataLoader", "add_argument"):
            return  # the use being resolved, or a command-line flag (resolved by its own rule)
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == self.name:
                self._add(arg, "keyword", arg.value)

    def visit_Param(self, node: cst.Param) -> None:
        if self.parameters and node.name.value == self.name and node.default is not None:
            self._add(node, "parameter", node.default)


def definitions(path: Path, name: str, *, parameters: bool = False) -> list[Definition]:
    """Every literal definition of `name` in one file (function parameters too if asked)."""
    module = parse(path)
    if module is None:
        return []
    visitor = _Definitions(path, name, parameters)
    MetadataWrapper(module, unsafe_skip_copy=True).visit(visitor)
    return visitor.found


def find_setting(name: str, value: Any, files: list[Path], kinds: tuple[str, ...]) -> Definition | None:
    """The place that sets `name` to the value the trial saw: the earliest file in `files` that has one
    (the script first: what it sets overrides a default), and in it the most specific of `kinds`; None
    when no place sets it to that value."""
    for path in files:
        found = [d for d in definitions(path, name, parameters="parameter" in kinds)
                 if d.kind in kinds and d.value == value and type(d.value) is type(value)]
        if found:
            return min(found, key=lambda d: (KINDS_BY_PREFERENCE.index(d.kind), d.line))
    return None


@dataclass
class Elsewhere:
    """Where the training loader's values may be set beyond its own call, and what a patch changes there."""

    files: list[Path]  # the script, the loader's file, the repository modules they import
    loader_file: Path
    changes: list[tuple[Definition, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def set(self, name: str, seen: Any, new: Any, *, parameters: bool) -> bool:
        """Plan `name` from `seen` to `new` where it is set: a parameter default of the loader's own file
        for a bare name; an attribute, a constructor keyword or a class field for `x.name`."""
        if parameters:
            found = find_setting(name, seen, [self.loader_file], ("parameter",))
        else:
            found = find_setting(name, seen, self.files, ("attribute", "keyword", "field"))
        if found is None:
            return False
        self.changes.append((found, new))
        return True


class SetDefinitions(cst.CSTTransformer):
    """Rewrite the literal of each definition (by line and kind) to its new value."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, changes: dict[tuple[int, str, str], Any]):
        super().__init__()
        self.changes = changes  # (line, kind, name) -> new value
        self.done: set[tuple[int, str, str]] = set()

    def _new(self, node: cst.CSTNode, kind: str, name: str) -> Any:
        key = (self.get_metadata(PositionProvider, node).start.line, kind, name)
        if key in self.changes:
            self.done.add(key)
            return self.changes[key]
        return _KEEP

    def leave_AnnAssign(self, original_node: cst.AnnAssign, updated_node: cst.AnnAssign) -> cst.AnnAssign:
        if isinstance(original_node.target, cst.Name):
            new = self._new(original_node, "field", original_node.target.value)
            if new is not _KEEP:
                return updated_node.with_changes(value=literal_node(new))
        return updated_node

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        for target in original_node.targets:
            name = target.target.attr.value if isinstance(target.target, cst.Attribute) else (
                target.target.value if isinstance(target.target, cst.Name) else None)
            for kind in ("attribute", "field"):
                new = self._new(original_node, kind, name) if name else _KEEP
                if new is not _KEEP:
                    return updated_node.with_changes(value=literal_node(new))
        return updated_node

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if original_node.keyword is not None:
            new = self._new(original_node, "keyword", original_node.keyword.value)
            if new is not _KEEP:
                return updated_node.with_changes(value=literal_node(new))
        return updated_node

    def leave_Param(self, original_node: cst.Param, updated_node: cst.Param) -> cst.Param:
        new = self._new(original_node, "parameter", original_node.name.value)
        if new is not _KEEP:
            return updated_node.with_changes(default=literal_node(new))
        return updated_node


_KEEP = object()


def set_definitions(module: cst.Module, changes: list[tuple[Definition, Any]]) -> cst.Module:
    """The module with each definition's literal set to its new value."""
    if not changes:
        return module
    keyed = {(d.line, d.kind, d.name): new for d, new in changes}
    return MetadataWrapper(module, unsafe_skip_copy=True).visit(SetDefinitions(keyed))

"""`advisor doctor SCRIPT`: are the modules the script imports found by this interpreter? Every trial runs the
script under the interpreter the advisor runs in, so a module missing here fails the baseline at its import.

The imports are read from the script's syntax tree (nothing of it runs); each top-level module is looked up
with `importlib.util.find_spec`, the script's own folder first on the path as it is in a trial. An import
inside a `try` that catches ImportError is the script's own fallback: reported, never a failure.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from advisor.doctor.checks import FAILED, OK, Check
from advisor.errors import AdvisorError

CATCHES_IMPORT = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass(frozen=True)
class Import:
    """A top-level module the script imports, and the line of its first import."""

    module: str
    line: int
    optional: bool  # inside a try that catches ImportError


def script_imports(path: Path) -> list[Import]:
    """The top-level modules `path` imports (absolute imports only, `__future__` left out), first line each."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except OSError as exc:
        raise AdvisorError(f"{path}: {exc.strerror or exc}") from None
    except (SyntaxError, ValueError) as exc:
        raise AdvisorError(f"{path}: not Python this interpreter can parse: {exc}") from None
    found: dict[str, Import] = {}

    def visit(node: ast.AST, optional: bool) -> None:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top != "__future__" and (top not in found or (found[top].optional and not optional)):
                found[top] = Import(top, node.lineno, optional)
        if isinstance(node, ast.Try):
            guarded = optional or any(catches_import(handler.type) for handler in node.handlers)
            for child in node.body:
                visit(child, guarded)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, optional)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, optional)

    visit(tree, False)
    return sorted(found.values(), key=lambda i: i.line)


def catches_import(kind: ast.expr | None) -> bool:
    """Whether an `except` clause of this type catches an ImportError (a bare `except` does)."""
    if kind is None:
        return True
    if isinstance(kind, ast.Tuple):
        return any(catches_import(element) for element in kind.elts)
    name = kind.attr if isinstance(kind, ast.Attribute) else kind.id if isinstance(kind, ast.Name) else ""
    return name in CATCHES_IMPORT


def missing_modules(path: Path) -> tuple[list[Import], list[Import]]:
    """The script's imports, and those this interpreter cannot find (the script's folder first on the path)."""
    imports = script_imports(path)
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        missing = [i for i in imports if not found(i.module)]
    finally:
        sys.path.remove(folder)
    return imports, missing


def found(module: str) -> bool:
    """Whether `import module` would find it here (a top-level module: nothing of it runs)."""
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def imports_check(path: Path) -> Check:
    """The doctor's line for SCRIPT: each module it imports found by this interpreter, or which are not."""
    imports, missing = missing_modules(path)
    needed = [i for i in missing if not i.optional]
    fallbacks = [i for i in missing if i.optional]
    name, python = path.name, sys.executable
    details = {"script": str(path), "python": python, "imports": [i.module for i in imports],
               "missing": [i.module for i in needed], "missing_optional": [i.module for i in fallbacks]}
    note = (f"; not found, but imported inside a try that catches ImportError: "
            f"{', '.join(i.module for i in fallbacks)}") if fallbacks else ""
    if not needed:
        return Check("script_imports", OK, f"{name}: the {len(imports)} module(s) it imports are found by "
                     f"{python}{note}", needed=True, details=details)
    where = ", ".join(f"{i.module} (line {i.line})" for i in needed)
    return Check("script_imports", FAILED, f"{name} imports what {python} cannot find: {where}{note}",
                 needed=True, details=details,
                 breaks="the baseline: every trial runs the script under this interpreter, where its import fails",
                 fix="install the advisor where the script's dependencies are (in that environment: "
                     "pip install torch-advisor, or pip install -e . from a checkout), or install the missing "
                     "modules here")

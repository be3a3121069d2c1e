"""The step a trial profiles: a target named on the command line, found in the script's syntax tree and
wrapped where it is defined. Torch-free: the parent checks a target before starting a trial.

Forms: `script.py` (no target: each optimizer step ends a step), `script.py:train_step` or
`script.py:Class.method` (each call of a function of the script is one step), and `--step
pkg.module:name` or `--step path/to/module.py:name` (a function of a module the script imports).
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

from advisor.errors import AdvisorError

WRAP_NAME = "__advisor_wrap__"


class TargetNotFound(Exception):
    """The script has no definition of the target function or method."""


def parse_target(target: str) -> tuple[Path, str | None]:
    """`script.py`, `script.py:train_step` or `script.py:Class.method` -> (script path, name or None:
    no target, the steps are found where the optimizer steps); one-line errors."""
    script, sep, name = target.rpartition(":") if not target.endswith(".py") else ("", "", "")
    if not sep:
        script, name = target, None
    elif not script or not name:
        raise AdvisorError(f"{target}: expected script.py, script.py:function or script.py:Class.method")
    if name is not None:
        check_name(target, name)
    path = Path(script)
    if path.is_dir():
        raise AdvisorError(f"{script}: is a folder, not a script: name the training script in it "
                           f"({path / 'train.py'}, say)")
    if not path.is_file():
        raise AdvisorError(f"{script}: no such file")
    if path.suffix != ".py":
        raise AdvisorError(f"{script}: not a Python script (.py)")
    return path.resolve(), name


def absolute_target(target: str) -> str:
    """The target with its script's absolute path: a session resumed from another folder still finds it."""
    script, name = parse_target(target)
    return f"{script}:{name}" if name else str(script)


def absolute_step(step: str | None) -> str | None:
    """`--step path/module.py:name` with the path made absolute when it names a file from this folder."""
    where, sep, name = (step or "").rpartition(":")
    if sep and where.endswith(".py") and not Path(where).is_absolute() and Path(where).is_file():
        return f"{Path(where).resolve()}:{name}"
    return step


def calls_init_process_group(script: Path) -> bool:
    """Whether the script (its own source, read, never run) calls `init_process_group`: a data-parallel
    script that expects torchrun's RANK and WORLD_SIZE."""
    try:
        tree = ast.parse(script.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name == "init_process_group":
                return True
    return False


def check_name(text: str, name: str) -> None:
    """A function name or Class.method; a one-line error otherwise."""
    parts = name.split(".")
    if len(parts) > 2 or not all(p.isidentifier() for p in parts):
        raise AdvisorError(f"{text}: {name!r} is not a function name or Class.method")


def parse_step(step: str, script: Path) -> tuple[dict[str, str | None], Path, str]:
    """`--step pkg.module:Class.method` or `--step path/to/module.py:Class.method` (a step defined in a module
    the script imports) -> (where the harness finds the module, its file, the name); one-line errors."""
    where, sep, name = step.rpartition(":")
    if not sep or not where or not name:
        raise AdvisorError(f"--step {step}: expected pkg.module:function or path/to/module.py:Class.method")
    check_name(f"--step {step}", name)
    if where.endswith(".py"):
        path = Path(where) if Path(where).is_absolute() or Path(where).is_file() else script.parent / where
        if not path.is_file():
            raise AdvisorError(f"--step {step}: {where}: no such file")
        return {"module": None, "file": str(path.resolve())}, path.resolve(), name
    if not all(part.isidentifier() for part in where.split(".")):
        raise AdvisorError(f"--step {step}: {where!r} is not a module name or a .py file")
    found = module_file(where, script.parent)
    if found is None:
        raise AdvisorError(f"--step {step}: module {where} is not found beside {script.name} "
                           "(it is looked for from the script's folder, as the script imports it)")
    return {"module": where, "file": None}, found, name


def module_file(module: str, folder: Path) -> Path | None:
    """The .py file of a module as a script in `folder` would import it (a package's __init__ or a file)."""
    base = folder.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    return None


def _bodies(tree: ast.AST):
    """Every statement list in the tree, with the node that owns it."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield node, body
        for handler in getattr(node, "handlers", []) or []:
            yield handler, handler.body


def locate_target(tree: ast.Module, target: str) -> list[tuple[list[ast.stmt], int]]:
    """Where the target is defined: (statement list, index) of each definition; raises TargetNotFound.

    `name` is a function defined anywhere except directly in a class; `Class.method` is a method in
    the body of a class of that name.
    """
    parts = target.split(".")
    if len(parts) > 2 or not all(p.isidentifier() for p in parts):
        raise TargetNotFound(f"{target!r} is not a function name or Class.method")
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    found = []
    if len(parts) == 1:
        for owner, body in _bodies(tree):
            if isinstance(owner, ast.ClassDef):
                continue
            found += [(body, i) for i, s in enumerate(body) if isinstance(s, funcs) and s.name == target]
    else:
        cls_name, method = parts
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls_name:
                found += [(node.body, i) for i, s in enumerate(node.body) if isinstance(s, funcs) and s.name == method]
    if not found:
        raise TargetNotFound(_not_found_message(tree, target))
    return found


def _not_found_message(tree: ast.Module, target: str) -> str:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names += [f"{node.name}.{s.name}" for s in node.body if isinstance(s, ast.FunctionDef)]
    methods = {n.split(".")[1] for n in names}
    names += sorted(
        {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name not in methods}
    )
    available = ", ".join(names[:12]) or "none"
    return f"no function {target!r} is defined (functions found: {available})"


def rewrite_script(source: str, filename: str, target: str) -> types.CodeType:
    """Compile the script with `name = __advisor_wrap__(name, 'target')` after each target definition."""
    tree = ast.parse(source, filename=filename)
    sites = locate_target(tree, target)
    # Insert from the end of each body so earlier indexes stay valid.
    for body, index in sorted(sites, key=lambda site: (id(site[0]), -site[1])):
        definition = body[index]
        name = definition.name
        wrap = ast.parse(f"{name} = {WRAP_NAME}({name}, {target!r})").body[0]
        for node in ast.walk(wrap):
            node.lineno = node.end_lineno = definition.end_lineno or definition.lineno
            node.col_offset = node.end_col_offset = 0
        body.insert(index + 1, wrap)
    return compile(tree, filename, "exec", dont_inherit=True)

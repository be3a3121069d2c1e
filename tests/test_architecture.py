"""The layout holds: packages import only what the architecture allows, no private name crosses a module,
the analysis runs where torch cannot be imported, and the wheel ships every package.

The allowed imports (DESIGN.md gives each package's in its section):

    shared    advisor.errors, files, shapes, escape: each other only (what every stage uses)
    analysis  shared                                  (torch-free: recorded traces → Diagnosis)
    trials    shared                                  (one run of the step; torch inside the trial only)
    code      shared, trials.knobs                    (lint and patch the user's script)
    report    shared, analysis, trials.record         (formats figures, never recomputes them)
    search    shared, analysis, trials, code, report  (the session: it writes the patch and the report)
    doctor    shared, trials                          (what this machine gives the advisor: the trials' checks)
    cli, api  anything                                (the two front doors)
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import ROOT, SAMPLE_RUNS, TRACES

PACKAGE = ROOT / "advisor"
# The registry of knobs is shared like the records' shapes: every part reads what a knob is from it.
SHARED = {"advisor.errors", "advisor.files", "advisor.shapes", "advisor.escape", "advisor.knobs"}
# What each part of advisor may import of advisor, besides itself and the shared modules.
ALLOWED = {
    "shared": set(),
    "analysis": set(),
    "trials": set(),
    "code": {"advisor.trials.knobs"},
    "report": {"advisor.analysis", "advisor.trials.record"},
    "search": {"advisor.analysis", "advisor.trials", "advisor.code", "advisor.report"},
    "doctor": {"advisor.trials"},
    "cli": {"advisor"},
    "api": {"advisor"},
    "advisor": {"advisor"},  # advisor/__init__.py loads the notebook API on first use
}


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def part_of(module: str) -> str:
    """Which row of ALLOWED a module falls under: 'analysis', 'shared', 'cli', ..."""
    if within(module, SHARED):
        return "shared"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "advisor"


def advisor_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of advisor in a file, lazy ones inside functions included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "advisor":
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "advisor"]
    return found


def imported_module(module: str, name: str, known: dict[str, Path]) -> str:
    """The module an import reaches: `from advisor.analysis import intervals` reaches advisor.analysis.intervals."""
    return f"{module}.{name}" if f"{module}.{name}" in known else module


def within(module: str, prefixes: set[str]) -> bool:
    """Whether `module` is one of `prefixes` or inside one of them."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_each_part_imports_only_what_the_architecture_allows():
    known = modules()
    wrong = []
    for name, path in known.items():
        part = part_of(name)
        own = {"advisor"} if part == "advisor" else SHARED if part == "shared" else {f"advisor.{part}"}
        allowed = own | SHARED | ALLOWED[part]
        for line, module, names in advisor_imports(path):
            for reached in {imported_module(module, n, known) for n in names} or {module}:
                if not within(reached, allowed):
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {part} imports {reached}")
    assert not wrong, "\n".join(wrong)


def test_no_private_name_crosses_a_module():
    """`from advisor.x import _name` and `module._name` on an imported advisor module are both refused: a
    name another module needs is public."""
    known = modules()
    wrong = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        bound_modules = set()  # local names bound to advisor modules: `from advisor import files`, `... as iv`
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "advisor":
                for alias in node.names:
                    if alias.name.startswith("_"):
                        wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports {node.module}.{alias.name}")
                    if f"{node.module}.{alias.name}" in known:
                        bound_modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                bound_modules.update(a.asname for a in node.names if a.asname and a.name in known)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in bound_modules):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: uses {node.value.id}.{node.attr}")
    assert not wrong, "\n".join(wrong)


def test_the_analysis_runs_where_torch_cannot_be_imported():
    """Every module of advisor.analysis imports, and a recorded trial and a real GPU trace are analysed
    (as `advisor analyze --json` does, the linter of the trial's script included), with torch unimportable."""
    paths = [SAMPLE_RUNS / "image_classifier" / "trials" / "00-baseline",
             TRACES / "h100-image-classifier-workers0.pt.trace.json.gz"]
    code = """
import importlib, io, json, pkgutil, sys
sys.modules["torch"] = None  # `import torch` now raises ImportError
import advisor.analysis
for info in pkgutil.walk_packages(advisor.analysis.__path__, "advisor.analysis."):
    importlib.import_module(info.name)
from advisor.analysis.analyze import analysis_document, analyze_path, encode_json
from advisor.cli import main
out = []
for path in sys.argv[1:]:
    diagnoses = analyze_path(path)
    out.append(json.loads(encode_json(analysis_document(path, diagnoses)))["summary"]["traces"])
    sys.stdout = io.TextIOWrapper(io.BytesIO())  # the CLI's JSON, written and dropped
    assert main(["analyze", "--json", path]) == 0
    sys.stdout = sys.__stdout__
print(json.dumps({"traces": out, "torch": sys.modules["torch"] is None}))
"""
    done = subprocess.run([sys.executable, "-c", code, *map(str, paths)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"traces": [1] * len(paths), "torch": True}


def test_the_wheel_lists_every_package():
    """pyproject names each package explicitly (the templates are mapped into the wheel): a new package
    must be added there, or an installed advisor lacks it."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert packages <= listed, sorted(packages - listed)


# What the trials package holds, by role (DESIGN.md "trials/"): what runs in the advisor's process to run a
# trial (launch), what runs inside it (harness), each knob applied inside it (interposition), its record, and
# the recorded-surface runner (replay); only the Knobs value (the code stage reads it) and the TrialSpec (what a
# trial runs, which the launchers take) stand beside them.
# Each role imports of the others only what this says: the record is what the others share and reads none of
# them; nothing inside a trial reaches back to what launched it.
TRIALS_LAYOUT = {"launch", "harness", "interposition", "record", "replay"}
TRIALS_ROLES_MAY_IMPORT = {
    "knobs": set(),
    "spec": {"knobs"},
    "record": {"knobs"},
    "replay": {"knobs", "record"},
    "harness": {"knobs", "record", "interposition"},
    "interposition": {"knobs", "record", "harness"},
    "launch": {"knobs", "spec", "record", "harness", "interposition"},
}
MODULE_LINES = 450  # a module a reader takes in whole; a larger one has more than one job


def test_the_trials_package_is_grouped_by_what_each_module_is():
    trials = PACKAGE / "trials"
    folders = {p.name for p in trials.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    loose = sorted(p.name for p in trials.glob("*.py") if p.name not in ("__init__.py", "knobs.py", "spec.py"))
    assert folders == TRIALS_LAYOUT and not loose, (folders, loose)


def test_each_role_of_the_trials_package_imports_only_what_its_role_allows():
    known = modules()
    wrong = []
    for name, path in known.items():
        parts = name.split(".")
        if parts[:2] != ["advisor", "trials"] or len(parts) < 3:
            continue
        role = parts[2]
        for line, module, names in advisor_imports(path):
            for reached in {imported_module(module, n, known) for n in names} or {module}:
                other = reached.split(".")
                if other[:2] == ["advisor", "trials"] and len(other) > 2 and other[2] != role \
                        and other[2] not in TRIALS_ROLES_MAY_IMPORT[role]:
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {role} imports {reached}")
    assert not wrong, "\n".join(wrong)


# A module name is one module's, whatever its role: a reader who meets `memory_peaks.py` or `syntax.py` knows which
# one is meant. A knob's parts outside its own module are named by what they do there (`fused_attention.py`
# applies `sdpa` in a trial, `sdpa_calls.py` writes it into the script).


def test_a_module_name_means_one_thing():
    folders: dict[str, set[str]] = {}
    for path in modules().values():
        if path.name != "__init__.py":
            folders.setdefault(path.name, set()).add(str(path.parent.relative_to(PACKAGE)))
    reused = {name: sorted(where) for name, where in folders.items() if len(where) > 1}
    assert not reused, f"module names used in more than one folder: {reused}"


def test_no_module_is_over_its_length():
    long = {str(path.relative_to(ROOT)): n for path in modules().values()
            if (n := len(path.read_text().splitlines())) > MODULE_LINES}
    assert not long, long

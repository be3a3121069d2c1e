"""`suggested.patch`: a session's final `Knobs` as a change to the user's script, as a unified diff.

Trials apply knobs by interposition; this module writes the same changes into the user's source, with
libcst (a concrete syntax tree: formatting and comments survive), and diffs the result against the
original so that `patch -p1` or `git apply` applies it. Torch is never imported.

What the patched script looks like, per knob:

- DataLoader knobs: each `DataLoader(...)` call gets the knob's value. A literal argument is replaced;
  a missing one is added as a keyword; a positional `batch_size` is replaced in place. An argument that
  is a name is followed to where its value is written: a module-level constant (`BATCH = 32`) or an
  argparse default (`parser.add_argument("--batch-size", default=32)` for `args.batch_size`) is changed
  there, when that literal is the value the trial saw. Otherwise the argument becomes a literal and the
  statement ends with `# advisor: was <expression>`. `persistent_workers=True` and `prefetch_factor`
  need worker processes: with a literal worker count of 0 they are left out; with a worker count known
  only at run time they are written as `persistent_workers=args.num_workers > 0` and
  `prefetch_factor=4 if args.num_workers > 0 else None`.
- `amp`: the target's body (its docstring aside) goes under
  `with torch.autocast(device_type=..., dtype=torch.bfloat16):` (fp16: `device_type="cuda"`,
  `torch.float16`), from the first statement up to, not including, the first statement that calls
  `.backward(`: backward runs outside autocast, as the PyTorch AMP docs advise. A body without
  `.backward(` is wrapped whole. For fp16 a module-level `scaler = torch.amp.GradScaler("cuda")` is added
  after the imports, `loss.backward()` becomes `scaler.scale(loss).backward()` and `optimizer.step()`
  becomes `scaler.step(optimizer)` with `scaler.update()` after the last optimizer step.
- `non_blocking`: in the target, `.to(<device>)` and `.cuda()` calls on tensors get `non_blocking=True`
  (dtype-only `.to(torch.float16)` and model/module receivers are left alone).
- `accumulation_steps=N` (gradient accumulation that keeps the effective batch)::

      ACCUMULATION_STEPS = N            # module level, after the imports
      accumulation_micro_step = 0

      def train_step(...):
          global accumulation_micro_step
          first_micro_step = accumulation_micro_step % ACCUMULATION_STEPS == 0
          last_micro_step = accumulation_micro_step % ACCUMULATION_STEPS == ACCUMULATION_STEPS - 1
          accumulation_micro_step += 1
          ...
          if first_micro_step:          # a zero_grad before the backward (after it: last_micro_step)
              optimizer.zero_grad()
          (loss / ACCUMULATION_STEPS).backward()
          if last_micro_step:           # optimizer (and scheduler) steps
              optimizer.step()
          return loss.detach()

  The loss is divided inside the backward call rather than reassigned, so the loss the step returns
  (and the user logs) keeps its meaning. Without an optimizer step in the target, accumulation (and
  the fp16 GradScaler) is not written: it could not be done correctly there.

A target that runs its own loop over batches gets the autocast block and the accumulation counters
inside the loop that holds the backward, once per iteration.
"""

from __future__ import annotations

import dataclasses
import difflib
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst
from libcst.metadata import PositionProvider

from advisor.errors import AdvisorError
from advisor.trials.knobs import DATALOADER_KNOBS, Knobs
from advisor.code.settings import Elsewhere, search_files, set_definitions

PATCH_NAME = "suggested.patch"
DATALOADER_NAMES = ("DataLoader",)
# Positions in DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
# pin_memory, ...); prefetch_factor and persistent_workers are keyword-only.
DATALOADER_POSITIONS = {"batch_size": 1, "batch_sampler": 4, "num_workers": 5, "pin_memory": 7}
DTYPE_NAMES = {
    "float16", "half", "bfloat16", "float32", "float", "float64", "double", "int8", "uint8", "int16",
    "short", "int32", "int", "int64", "long", "bool", "complex64", "cfloat", "complex128", "cdouble",
    "float8_e4m3fn", "float8_e5m2",
}
ACCUMULATION_CONSTANT = "ACCUMULATION_STEPS"
ACCUMULATION_COUNTER = "accumulation_micro_step"
MAX_LINE = 100  # where added DataLoader arguments wrap onto a new line
NO_SPACE = cst.SimpleWhitespace("")
TIGHT_EQUAL = cst.AssignEqual(whitespace_before=NO_SPACE, whitespace_after=NO_SPACE)


# --------------------------------------------------------------------------------------------------
# Public API


@dataclass
class Patch:
    """A suggested change: the unified diff over one or more files of the repository, and notes on what
    it leaves to the user (a flag to pass, a change it could not write)."""

    diff: str
    notes: list[str] = field(default_factory=list)


def site_of(site: str | None) -> tuple[Path, int] | None:
    """`/path/file.py:LINE` -> (path, line)."""
    if not site or ":" not in site:
        return None
    path, _, line = site.rpartition(":")
    return (Path(path), int(line)) if line.isdigit() and Path(path).is_file() else None


def plan_patch(script: Path, target: str | None, knobs: Knobs, user_values: dict | None, *,
               root: Path | None = None, accumulation_steps: int | None = None, loader_site: str | None = None,
               step_file: Path | None = None) -> Patch:
    """The change that applies `knobs` where the script sets them.

    `target`: the step function in `step_file` (default: the script) that autocast, non_blocking and
    gradient accumulation are written into (None: none of those). `loader_site`: where the training
    loader is built (`file.py:LINE`; default: every DataLoader call of the script); its values are
    changed where they are set — in its call, a constant, a flag's default, a config in another module.
    The threads knob is `torch.set_num_threads(N)` after the script's imports.
    """
    script = Path(script).resolve()
    root = Path(root).resolve() if root is not None else script.parent
    user_values = user_values or {}
    sources: dict[Path, str] = {}
    encodings: dict[Path, str] = {}

    def module_of(path: Path) -> cst.Module:
        if path not in sources:
            sources[path], encodings[path] = read_source(path)
        return parse_source(sources[path], str(path))

    edited: dict[Path, cst.Module] = {}
    notes: list[str] = []
    found = site_of(loader_site)
    loader_file, line = (found[0].resolve(), found[1]) if found else (script, None)
    elsewhere = Elsewhere(search_files(script, loader_file, root), loader_file)
    module = module_of(loader_file)
    edited[loader_file] = rewrite_dataloaders(module, ScriptFacts.collect(module), knobs, user_values, line=line,
                                              elsewhere=elsewhere)
    notes += elsewhere.notes
    for path in {d.file for d, _ in elsewhere.changes}:
        base = edited.get(path) or module_of(path)
        edited[path] = set_definitions(base, [(d, v) for d, v in elsewhere.changes if d.file == path])
    step_path = Path(step_file).resolve() if step_file is not None else script
    if target is not None and (knobs.amp or knobs.non_blocking or (accumulation_steps or 1) > 1):
        base = edited.get(step_path) or module_of(step_path)
        edited[step_path] = rewrite_step(base, target, knobs, accumulation_steps, str(step_path))
    elif knobs.amp or knobs.non_blocking:
        notes.append("autocast and non_blocking copies are not written: the function that runs the step is not "
                     "known; put the forward under torch.autocast and pass non_blocking=True to .to(device)")
    if knobs.threads and knobs.threads != user_values.get("threads"):
        base = edited.get(script) or module_of(script)
        edited[script] = add_threads(base, knobs.threads)
    diffs = []
    for path, after in sorted(edited.items()):
        if path not in sources:
            continue
        try:
            rel = path.relative_to(root).as_posix()
        except ValueError:
            raise AdvisorError(f"{path}: cannot patch: the file is not inside {root}") from None
        text = after.code
        try:
            compile(text, str(path), "exec", dont_inherit=True)
        except SyntaxError as exc:  # a bug here, never the user's: their file parsed
            raise AdvisorError(f"{path}: cannot patch: the patched source does not compile ({exc.msg})") from None
        diffs.append(unified_diff(sources[path], text, rel))
    return Patch("".join(diffs), notes)


def suggest_patch(script: Path, target: str | None, knobs: Knobs, user_values: dict | None, *,
                  root: Path | None = None, accumulation_steps: int | None = None,
                  loader_site: str | None = None, step_file: Path | None = None) -> str:
    """The unified diff (`a/<rel>`, `b/<rel>` headers per file) that applies `knobs`; '' if none."""
    return plan_patch(script, target, knobs, user_values, root=root, accumulation_steps=accumulation_steps,
                      loader_site=loader_site, step_file=step_file).diff


def write_patch(script: Path, target: str | None, knobs: Knobs, user_values: dict | None, folder: Path, *,
                root: Path | None = None, accumulation_steps: int | None = None, loader_site: str | None = None,
                step_file: Path | None = None) -> tuple[Path | None, list[str]]:
    """Write `folder/suggested.patch`; return its path (None when nothing changes) and the patch's notes."""
    patch = plan_patch(script, target, knobs, user_values, root=root, accumulation_steps=accumulation_steps,
                       loader_site=loader_site, step_file=step_file)
    if not patch.diff:
        return None, patch.notes
    path = Path(folder) / PATCH_NAME
    _, encoding = read_source(Path(script))
    # The script's own encoding, untranslated newlines: the diff's context lines must match its bytes.
    with open(path, "w", encoding=encoding, newline="") as handle:
        handle.write(patch.diff)
    return path, patch.notes


def read_source(script: Path) -> tuple[str, str]:
    """The script's text exactly as on disk (newlines untranslated) and its encoding."""
    try:
        with open(script, "rb") as handle:
            encoding, _ = tokenize.detect_encoding(handle.readline)
        return script.read_bytes().decode(encoding), encoding
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise AdvisorError(f"{script}: cannot patch: {exc}") from None


def unified_diff(before: str, after: str, rel: str) -> str:
    """`diff -u` of two texts, headers `a/<rel>` and `b/<rel>`; '' when they are equal."""
    if before == after:
        return ""
    out = []
    for line in difflib.unified_diff(split_lines(before), split_lines(after), f"a/{rel}", f"b/{rel}"):
        if not line.endswith("\n"):  # a last line without a newline needs patch's marker
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out)


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split on "\\n" only (str.splitlines also splits on form feeds)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def parse_source(source: str, filename: str) -> cst.Module:
    """The syntax tree of a file to patch; a one-line error when it does not parse."""
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise AdvisorError(f"{filename}: cannot patch: the script does not parse (line {exc.raw_line})") from None


def rewrite_step(module: cst.Module, target: str, knobs: Knobs, accumulation_steps: int | None,
                 filename: str) -> cst.Module:
    """The module with autocast, the GradScaler, non_blocking copies and gradient accumulation written
    into the step function `target`."""
    if accumulation_steps is not None and (not isinstance(accumulation_steps, int) or accumulation_steps < 1):
        raise AdvisorError(f"{filename}: cannot patch: accumulation_steps must be a positive integer")
    facts = ScriptFacts.collect(module)
    if not facts.target_exists(target):
        raise AdvisorError(f"{filename}: cannot patch: {facts.not_found_message(target)}")
    accumulation = accumulation_steps if accumulation_steps and accumulation_steps > 1 else None
    step = StepPlan(
        amp=knobs.amp, non_blocking=bool(knobs.non_blocking), accumulation=accumulation,
        scaler_name=facts.free_name("scaler", "grad_scaler", "advisor_scaler"),
    )
    transformer = TargetRewrite(target, step, facts)
    module = module.visit(transformer)
    return add_module_statements(module, facts, step, transformer)


def add_threads(module: cst.Module, threads: int) -> cst.Module:
    """`torch.set_num_threads(N)` right after the imports (with `import torch` if the script has none)."""
    facts = ScriptFacts.collect(module)
    body = list(module.body)
    index = _after_imports(body)
    lines = [] if facts.torch_bound else [cst.parse_statement("import torch")]
    lines.append(cst.parse_statement(f"torch.set_num_threads({int(threads)})  # torch's intra-op threads"))
    return module.with_changes(body=[*body[:index], *lines, *body[index:]])


def patched_source(source: str, target: str, knobs: Knobs, user_values: dict, *,
                   accumulation_steps: int | None = None, filename: str = "<script>") -> str:
    """The script's source with the knobs written in (every DataLoader call, the step `target`); raises
    AdvisorError if that cannot be done."""
    module = parse_source(source, filename)
    facts = ScriptFacts.collect(module)
    if not facts.target_exists(target):
        raise AdvisorError(f"{filename}: cannot patch: {facts.not_found_message(target)}")
    module = rewrite_dataloaders(module, facts, knobs, user_values)
    module = rewrite_step(module, target, knobs, accumulation_steps, filename)
    after = module.code
    try:
        compile(after, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:  # a bug here, never the user's: their script parsed
        raise AdvisorError(f"{filename}: cannot patch: the patched source does not compile ({exc.msg})") from None
    return after


# --------------------------------------------------------------------------------------------------
# What the script defines: constants, argparse defaults, optimizers, devices, the target


def literal_value(node: cst.BaseExpression) -> tuple[bool, Any]:
    """(True, value) for an int / True / False / None literal, else (False, None)."""
    if isinstance(node, cst.Integer):
        return True, int(node.evaluated_value)
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return True, {"True": True, "False": False, "None": None}[node.value]
    if (isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus)
            and isinstance(node.expression, cst.Integer)):
        return True, -int(node.expression.evaluated_value)
    return False, None


def literal_node(value: Any) -> cst.BaseExpression:
    """A literal expression for an int, bool or None."""
    if value is None or isinstance(value, bool):
        return cst.Name(repr(value))
    return cst.Integer(str(int(value)))


def dotted(node: cst.CSTNode) -> str | None:
    """`a.b.c` for a chain of names and attributes only (None for anything else, e.g. `f().x`)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr.value}"
    return None


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


def keyword_arg(call: cst.Call, name: str) -> cst.Arg | None:
    """The `name=` argument of a call, if any."""
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


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
        self.constants.setdefault(name, []).append(literal if ok and single else _NOT_LITERAL)
        if isinstance(value, cst.Call) and dotted(value.func) in ("torch.device", "device"):
            self.module_devices[name] = "device"
        elif isinstance(value, (cst.SimpleString, cst.IfExp)):
            self.module_devices.setdefault(name, "str")

    def constant(self, name: str) -> tuple[bool, Any]:
        """(True, value) when `name` is assigned exactly once at module level, to a literal."""
        values = self.constants.get(name, [])
        if len(values) == 1 and values[0] is not _NOT_LITERAL:
            return True, values[0]
        return False, None

    def argparse_default(self, dest: str) -> tuple[bool, Any]:
        """(True, value) when every `add_argument` for `dest` has the same literal `default=`."""
        defaults = self.argparse_defaults.get(dest, [])
        if defaults and all(ok for ok, _ in defaults) and len({repr(v) for _, v in defaults}) == 1:
            return True, defaults[0][1]
        return False, None

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


_NOT_LITERAL = object()


class _FactsVisitor(cst.CSTVisitor):
    """Collects optimizers, schedulers, argparse defaults, devices and function definitions."""

    def __init__(self, facts: ScriptFacts):
        super().__init__()
        self.facts = facts
        self.owners: list[str | None] = []  # class name, or None for a function, innermost last
        self.optim_imports: set[str] = set()

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

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = node.evaluated_value
        if isinstance(value, str) and (value == "cuda" or value.startswith("cuda:")):
            self.facts.mentions_cuda = True


# --------------------------------------------------------------------------------------------------
# DataLoader arguments


def loader_changes(knobs: Knobs, user_values: dict) -> dict[str, Any]:
    """The DataLoader arguments to write: each knob that is set and differs from the user's value."""
    changes = {}
    for name in DATALOADER_KNOBS:
        value = getattr(knobs, name)
        if value is None or (name in user_values and user_values[name] == value):
            continue
        changes[name] = value
    return changes


def is_dataloader_call(call: cst.Call) -> bool:
    """`DataLoader(...)`, `data.DataLoader(...)`, `torch.utils.data.DataLoader(...)`."""
    name = dotted(call.func) or ""
    return name.rsplit(".", 1)[-1] in DATALOADER_NAMES


def rewrite_dataloaders(module: cst.Module, facts: ScriptFacts, knobs: Knobs, user_values: dict, *,
                        line: int | None = None, elsewhere: "Elsewhere | None" = None) -> cst.Module:
    """Write the DataLoader knobs into the DataLoader call at `line` (every DataLoader call when None), or
    where its named values are defined (in this file, or via `elsewhere` in another of the repository)."""
    changes = loader_changes(knobs, user_values)
    if not changes:
        return module
    rewrite = _LoaderRewrite(facts, changes, user_values, line=line, elsewhere=elsewhere)
    module = cst.MetadataWrapper(module, unsafe_skip_copy=True).visit(rewrite)
    if rewrite.constant_changes:
        module = module.with_changes(body=[_set_constants(s, rewrite.constant_changes) for s in module.body])
    if rewrite.argparse_changes:
        module = module.visit(_ArgparseRewrite(rewrite.argparse_changes))
    return module


def _set_constants(statement: cst.BaseStatement, changes: dict[str, Any]) -> cst.BaseStatement:
    """A module-level `NAME = literal` line with the new literal, when NAME is to change."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return statement
    body = []
    for small in statement.body:
        if (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name)
                and small.targets[0].target.value in changes):
            small = small.with_changes(value=literal_node(changes[small.targets[0].target.value]))
        elif (isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value is not None
              and small.target.value in changes):
            small = small.with_changes(value=literal_node(changes[small.target.value]))
        body.append(small)
    return statement.with_changes(body=body)


class _ArgparseRewrite(cst.CSTTransformer):
    """`add_argument(..., default=<old>)` → the new default, for the dests that change."""

    def __init__(self, changes: dict[str, Any]):
        super().__init__()
        self.changes = changes

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not (isinstance(updated_node.func, cst.Attribute) and updated_node.func.attr.value == "add_argument"):
            return updated_node
        dest = argparse_dest(updated_node)
        if dest not in self.changes:
            return updated_node
        args = [a.with_changes(value=literal_node(self.changes[dest]))
                if a.keyword is not None and a.keyword.value == "default" else a for a in updated_node.args]
        return updated_node.with_changes(args=args)


class _LoaderRewrite(cst.CSTTransformer):
    """Sets the DataLoader knobs in each DataLoader call; plans constant and argparse changes."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, facts: ScriptFacts, changes: dict[str, Any], user_values: dict, *, line: int | None = None,
                 elsewhere: "Elsewhere | None" = None):
        super().__init__()
        self.facts = facts
        self.changes = changes
        self.user_values = user_values
        self.line = line
        self.elsewhere = elsewhere
        self.constant_changes: dict[str, Any] = {}
        self.argparse_changes: dict[str, Any] = {}
        self.comment_frames: list[list[str]] = []  # per enclosing statement: "advisor: was ..." notes

    # The fallback comment goes at the end of the statement that holds the call.
    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self.comment_frames.append([])
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        result = super().on_leave(original_node, updated_node)
        if isinstance(original_node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            notes = self.comment_frames.pop()
            if notes:
                result = _with_trailing_comment(result, "advisor: " + "; ".join(notes))
        return result

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not is_dataloader_call(updated_node):
            return updated_node
        if self.line is not None:  # only the training loader: the call that spans the line that built it
            span = self.get_metadata(PositionProvider, original_node)
            if not span.start.line <= self.line <= span.end.line:
                return updated_node
        call = self._knobs_into(updated_node)
        # Added arguments are wrapped onto continuation lines aligned after the opening parenthesis.
        opening = self.get_metadata(PositionProvider, original_node.func).end
        start = self.get_metadata(PositionProvider, original_node).start.column
        return _wrap_added(call, updated_node, self.facts.module, paren_column=opening.column, start_column=start)

    def _knobs_into(self, call: cst.Call) -> cst.Call:
        """The call with the knobs' values (planning constant and argparse changes on the way)."""
        sampler = _find_arg(call, "batch_sampler")
        if "batch_size" in self.changes and (sampler is None or literal_value(sampler.value) == (True, None)):
            call = self._set(call, "batch_size", self.changes["batch_size"])
        if "num_workers" in self.changes:
            call = self._set(call, "num_workers", self.changes["num_workers"])
        workers_node = self._workers(call)
        workers = self._static_value(workers_node)  # None: known only at run time
        if "pin_memory" in self.changes:
            call = self._set(call, "pin_memory", self.changes["pin_memory"])
        if workers == 0:
            # DataLoader rejects these without worker processes (the user's values were valid for
            # their own worker count, so fewer workers means dropping them; False / None may stay).
            harmless = {"persistent_workers": (True, False), "prefetch_factor": (True, None)}
            return _drop_keywords(call, [a.keyword.value for a in call.args if a.keyword is not None
                                         and a.keyword.value in harmless
                                         and literal_value(a.value) != harmless[a.keyword.value]])
        if "persistent_workers" in self.changes:
            value = self.changes["persistent_workers"]
            if value and workers is None:
                call = _put_keyword(call, "persistent_workers", _workers_check(workers_node))
            else:
                call = self._set(call, "persistent_workers", value)
        if "prefetch_factor" in self.changes:
            value = self.changes["prefetch_factor"]
            if workers is None:
                expr = cst.IfExp(test=_workers_check(workers_node), body=literal_node(value),
                                 orelse=cst.Name("None"))
                call = _put_keyword(call, "prefetch_factor", expr)
            else:
                call = self._set(call, "prefetch_factor", value)
        return call

    def _workers(self, call: cst.Call) -> cst.BaseExpression:
        """The expression that gives the call's worker count."""
        found = _find_arg(call, "num_workers")
        if found is not None:
            return found.value
        mapping = _double_star(call)
        if mapping is None:
            return cst.Integer("0")
        if "num_workers" in self.changes:
            return literal_node(self.changes["num_workers"])
        # `DataLoader(..., **options)`: the count is in the user's mapping, or the default 0.
        options = mapping.value
        if isinstance(options, cst.Dict) and options.elements and isinstance(options.elements[0], cst.StarredDictElement):
            options = options.elements[0].value  # already merged into `{**options, ...}` above
        return cst.parse_expression('x.get("num_workers", 0)').with_changes(
            func=cst.Attribute(value=options, attr=cst.Name("get")))

    def _static_value(self, node: cst.BaseExpression) -> Any:
        """The value an argument has whatever the command line: a literal or a module constant."""
        ok, value = literal_value(node)
        if ok:
            return value
        if isinstance(node, cst.Name):
            if node.value in self.constant_changes:
                return self.constant_changes[node.value]
            ok, value = self.facts.constant(node.value)
            if ok:
                return value
        return None

    def _set(self, call: cst.Call, name: str, value: Any) -> cst.Call:
        """Give the DataLoader argument `name` the value: in place, at its definition, or added."""
        arg = _find_arg(call, name)
        if arg is None:
            return _put_keyword(call, name, literal_node(value))
        ok, current = literal_value(arg.value)
        if ok:
            if current == value and type(current) is type(value):
                return call
            return _replace_arg(call, arg, literal_node(value))
        user = self.user_values.get(name, _NOT_LITERAL)
        if isinstance(arg.value, cst.Name):
            ok, current = self.facts.constant(arg.value.value)
            if ok and (user is _NOT_LITERAL or current == user):
                self.constant_changes[arg.value.value] = value
                return call
        if isinstance(arg.value, cst.Attribute) and isinstance(arg.value.value, cst.Name):
            ok, current = self.facts.argparse_default(arg.value.attr.value)
            if ok and (user is _NOT_LITERAL or current == user):
                self.argparse_changes[arg.value.attr.value] = value
                return call
            if ok and self.elsewhere is not None:
                # A flag whose default is not what ran: the command line set it. Writing a literal over
                # it would silently disable the flag; the command is what to change.
                flag = arg.value.attr.value
                self.elsewhere.notes.append(f"{name} comes from the command line (--{flag} {user!r} overrode its "
                                            f"default): run with --{flag} {value!r}")
                return call
        if self.elsewhere is not None and isinstance(arg.value, (cst.Attribute, cst.Name)) and user is not _NOT_LITERAL:
            key = arg.value.attr.value if isinstance(arg.value, cst.Attribute) else arg.value.value
            if self.elsewhere.set(key, user, value, parameters=isinstance(arg.value, cst.Name)):
                return call
        self.comment_frames[-1].append(f"was {name}={self.facts.module.code_for_node(arg.value)}")
        return _replace_arg(call, arg, literal_node(value))


def _wrap_added(call: cst.Call, before: cst.Call, module: cst.Module, *, paren_column: int,
                start_column: int) -> cst.Call:
    """Break the line before each added argument that would take it past MAX_LINE characters."""
    had = {a.keyword.value for a in before.args if a.keyword is not None}
    args = list(call.args)
    first_new = len(args)
    while first_new > 0 and args[first_new - 1].keyword is not None and args[first_new - 1].keyword.value not in had:
        first_new -= 1
    if first_new == len(args) or first_new == 0 or isinstance(before.args[-1].comma, cst.Comma):
        return call  # nothing added, no argument to follow, or one-per-line style already
    head = module.code_for_node(call.with_changes(args=args[:first_new]))[:-1]  # without ")"
    lines = head.split("\n")
    width = len(lines[-1]) + (start_column if len(lines) == 1 else 0)
    indent = paren_column + 1
    for i in range(first_new, len(args)):
        text = module.code_for_node(args[i].with_changes(comma=cst.MaybeSentinel.DEFAULT))
        if width + 2 + len(text) + 1 > MAX_LINE:  # ", " before it, ")" or "," after it
            space: cst.BaseParenthesizableWhitespace = cst.ParenthesizedWhitespace(
                indent=False, last_line=cst.SimpleWhitespace(" " * indent))
            width = indent + len(text)
        else:
            space = cst.SimpleWhitespace(" ")
            width += 2 + len(text)
        args[i - 1] = args[i - 1].with_changes(comma=cst.Comma(whitespace_after=space))
    return call.with_changes(args=args)


def _find_arg(call: cst.Call, name: str) -> cst.Arg | None:
    """The argument for DataLoader parameter `name`: by keyword, or at its position."""
    found = keyword_arg(call, name)
    position = DATALOADER_POSITIONS.get(name)
    if found is not None or position is None:
        return found
    positional = [a for a in call.args if a.keyword is None]
    if any(a.star for a in positional):
        return None  # *args: positions unknown
    return positional[position] if len(positional) > position else None


def _workers_check(workers: cst.BaseExpression) -> cst.BaseExpression:
    """`<workers> > 0`, for arguments that are only valid with worker processes."""
    if not isinstance(workers, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not workers.lpar:
        workers = workers.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])  # keep precedence
    return cst.Comparison(left=workers, comparisons=[cst.ComparisonTarget(cst.GreaterThan(), cst.Integer("0"))])


def _replace_arg(call: cst.Call, arg: cst.Arg, value: cst.BaseExpression) -> cst.Call:
    """The call with one argument's value replaced (its keyword, comma and spacing kept)."""
    return call.with_changes(args=[a.with_changes(value=value) if a is arg else a for a in call.args])


def _drop_keywords(call: cst.Call, names: list[str]) -> cst.Call:
    """The call without the named keyword arguments (commas kept tidy)."""
    kept = [a for a in call.args if not (a.keyword is not None and a.keyword.value in names)]
    if len(kept) == len(call.args):
        return call
    if kept and kept[-1].comma is not cst.MaybeSentinel.DEFAULT:
        last_original = call.args[-1]
        kept[-1] = kept[-1].with_changes(comma=last_original.comma)
    return call.with_changes(args=kept)


def _double_star(call: cst.Call) -> cst.Arg | None:
    """The last `**mapping` argument of a call, if any."""
    return next((a for a in reversed(call.args) if a.star == "**"), None)


def _put_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """Set `name=value`: replace an existing keyword, or append it after the last argument."""
    existing = keyword_arg(call, name)
    if existing is not None:
        return _replace_arg(call, existing, value)
    mapping = _double_star(call)
    if mapping is not None:
        # The mapping may hold `name` already: a keyword beside it could be passed twice. Merging
        # (`**{**options, "name": value}`) is right either way.
        merged = cst.Dict([cst.StarredDictElement(mapping.value), cst.DictElement(cst.SimpleString(f'"{name}"'), value)])
        if isinstance(mapping.value, cst.Dict) and mapping.value.elements and isinstance(
                mapping.value.elements[0], cst.StarredDictElement):
            merged = mapping.value.with_changes(elements=[*mapping.value.elements, merged.elements[1]])
        return _replace_arg(call, mapping, merged)
    new = cst.Arg(value=value, keyword=cst.Name(name), equal=TIGHT_EQUAL)
    args = list(call.args)
    if args and isinstance(args[-1].comma, cst.Comma):
        # A trailing comma (often before a closing paren on its own line): the new argument takes
        # over that comma and its whitespace; the old last argument gets its neighbour's spacing.
        trailing = args[-1].comma
        between = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" "))
        args[-1] = args[-1].with_changes(comma=between)
        new = new.with_changes(comma=trailing)
    elif args:
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, new])


def _with_trailing_comment(statement: Any, text: str) -> Any:
    """The statement with `# text` at the end of its (first) line, after any comment already there."""
    def extend(trailing: cst.TrailingWhitespace) -> cst.TrailingWhitespace:
        if trailing.comment is not None:
            return trailing.with_changes(comment=cst.Comment(f"{trailing.comment.value}  # {text}"))
        return trailing.with_changes(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(f"# {text}"))

    if isinstance(statement, cst.SimpleStatementLine):
        return statement.with_changes(trailing_whitespace=extend(statement.trailing_whitespace))
    body = getattr(statement, "body", None)
    if isinstance(body, cst.IndentedBlock):
        return statement.with_changes(body=body.with_changes(header=extend(body.header)))
    if isinstance(body, cst.SimpleStatementSuite):
        return statement.with_changes(body=body.with_changes(trailing_whitespace=extend(body.trailing_whitespace)))
    return statement


# --------------------------------------------------------------------------------------------------
# Inside the target: autocast, GradScaler, non_blocking copies, gradient accumulation


@dataclass
class StepPlan:
    """What to change inside the target."""

    amp: str | None
    non_blocking: bool
    accumulation: int | None
    scaler_name: str

    @property
    def fp16(self) -> bool:
        """fp16 autocast, which needs a GradScaler."""
        return self.amp == "fp16"


def calls_backward(node: cst.CSTNode) -> bool:
    """Whether the node contains a `<x>.backward(...)` call."""
    found = []

    class Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
                found.append(call)

    node.visit(Finder())
    return bool(found)


def uses_autocast(node: cst.CSTNode) -> bool:
    """Whether the node already has a `with ...autocast(...)` block."""
    found = []

    class Finder(cst.CSTVisitor):
        def visit_WithItem(self, item: cst.WithItem) -> None:
            if isinstance(item.item, cst.Call) and (dotted(item.item.func) or "").endswith("autocast"):
                found.append(item)

    node.visit(Finder())
    return bool(found)


def statement_call(line: cst.BaseStatement) -> cst.Call | None:
    """The call of a line that is just `<call>` (one expression statement), else None."""
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Expr):
        value = line.body[0].value
        if isinstance(value, cst.Call):
            return value
    return None


def method_call(call: cst.Call | None, method: str) -> str | None:
    """The receiver's dotted name when `call` is `<receiver>.<method>(...)`."""
    if call is not None and isinstance(call.func, cst.Attribute) and call.func.attr.value == method:
        return dotted(call.func.value)
    return None


class TargetRewrite(cst.CSTTransformer):
    """Rewrites each definition of the target (`f` or `Class.method`) with the step plan."""

    def __init__(self, target: str, plan: StepPlan, facts: ScriptFacts):
        super().__init__()
        self.target = target
        self.plan = plan
        self.facts = facts
        self.owners: list[str | None] = []
        self.matches: list[bool] = []
        self.used_scaler = False
        self.used_accumulation = False

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.owners.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.owners.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        owner = self.owners[-1] if self.owners else None
        key = f"{owner}.{node.name.value}" if owner else node.name.value
        self.matches.append(key == self.target)
        self.owners.append(None)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self.owners.pop()
        if not self.matches.pop():
            return updated_node
        owner = self.owners[-1] if self.owners else None
        return self.rewrite(updated_node, owner)

    def rewrite(self, func: cst.FunctionDef, class_name: str | None) -> cst.FunctionDef:
        """One definition of the target with the plan applied."""
        block = func.body
        if isinstance(block, cst.SimpleStatementSuite):  # `def f(): return x` on one line
            block = cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[s]) for s in block.body])
        params = {p.name.value: (self.facts.module.code_for_node(p.annotation.annotation) if p.annotation else "")
                  for p in (*func.params.posonly_params, *func.params.params, *func.params.kwonly_params)}
        steps = _count_optimizer_steps(block, self.facts)
        plan = self.plan
        if not steps:
            # Without the optimizer step in the target, neither the GradScaler nor accumulation can be
            # written correctly here: autocast alone (and, for fp16, no loss scaling) is what remains.
            plan = dataclasses.replace(plan, accumulation=None)
        inner = _StepBodyRewrite(plan, self.facts, params)
        inner.optimizer_steps_total = steps
        # Loss scaling is right only when every backward is scaled and every step unscales.
        inner.use_scaler = plan.fp16 and steps > 0 and not _calls_autograd_backward(block)
        block = block.visit(inner)
        self.used_scaler |= inner.used_scaler
        self.used_accumulation |= bool(plan.accumulation)

        statements = list(block.body)
        head = statements[:1] if statements and _is_docstring(statements[0]) else []
        rest = statements[len(head):]
        if self.plan.amp and rest and not uses_autocast(block):
            rest = self._autocast(rest, params, class_name)
        if plan.accumulation:
            flags = [cst.parse_statement(code) for code in (
                f"first_micro_step = {ACCUMULATION_COUNTER} % {ACCUMULATION_CONSTANT} == 0",
                f"last_micro_step = {ACCUMULATION_COUNTER} % {ACCUMULATION_CONSTANT} == {ACCUMULATION_CONSTANT} - 1",
                f"{ACCUMULATION_COUNTER} += 1",
            )]
            rest = [cst.parse_statement(f"global {ACCUMULATION_COUNTER}"), *_with_prelude(rest, flags)]
            # The blank lines / comments above the first statement go above the global.
            rest[0], rest[1] = (rest[0].with_changes(leading_lines=rest[1].leading_lines),
                                rest[1].with_changes(leading_lines=[]))
        return func.with_changes(body=block.with_changes(body=[*head, *rest]))

    def _autocast(self, rest: list[cst.BaseStatement], params: dict[str, str],
                  class_name: str | None) -> list[cst.BaseStatement]:
        """The statements with the forward part under `with torch.autocast(...)`."""
        split = next((i for i, s in enumerate(rest) if calls_backward(s)), None)
        loop = rest[split] if split is not None else None
        if isinstance(loop, (cst.For, cst.While)) and isinstance(loop.body, cst.IndentedBlock):
            # A target that runs its own loop: the forward of each iteration is what autocast covers.
            body = loop.body.with_changes(body=self._autocast(list(loop.body.body), params, class_name))
            return [*rest[:split], loop.with_changes(body=body), *rest[split + 1:]]
        if not split:  # no backward, or backward first: wrap everything
            split = len(rest)
        inside, after = rest[:split], rest[split:]
        while len(inside) > 1 and _is_zero_grad(inside[-1]):  # not forward work: keep it out of the block
            after.insert(0, inside.pop())
        if self.plan.fp16:
            call = 'torch.autocast(device_type="cuda", dtype=torch.float16)'
        else:
            call = f"torch.autocast(device_type={self._device_type(params, class_name)}, dtype=torch.bfloat16)"
        with_statement = cst.With(
            items=[cst.WithItem(item=cst.parse_expression(call))],
            body=cst.IndentedBlock(body=[inside[0].with_changes(leading_lines=[]), *inside[1:]]),
            leading_lines=inside[0].leading_lines,
        )
        return [with_statement, *after]

    def _device_type(self, params: dict[str, str], class_name: str | None) -> str:
        """The autocast device_type: from the script's device variable if obvious, else a literal."""
        for name, annotation in params.items():
            if annotation in ("torch.device", "device"):
                return f"{name}.type"
        for name in params:
            if name in ("device", "dev"):
                return f"torch.device({name}).type"  # a str or a torch.device: both work
        if class_name is not None and params:
            self_name = next(iter(params))
            for attr in sorted(self.facts.class_devices.get(class_name, ())):
                if attr.startswith("self."):
                    return f"{self_name}.{attr[len('self.'):]}.type"
        for name, kind in sorted(self.facts.module_devices.items()):
            if name not in params and kind == "device":
                return f"{name}.type"
        for name, kind in sorted(self.facts.module_devices.items()):
            if name not in params and kind == "str" and "device" in name.lower():
                return f"torch.device({name}).type"
        # The script uses CUDA somewhere but its device is not one obvious name: decide at run time.
        return '"cuda" if torch.cuda.is_available() else "cpu"' if self.facts.mentions_cuda else '"cpu"'


def _with_prelude(statements: list[cst.BaseStatement], prelude: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """The prelude first, or first in the loop that holds the backward (one micro-step per iteration)."""
    split = next((i for i, s in enumerate(statements) if calls_backward(s)), None)
    loop = statements[split] if split is not None else None
    if isinstance(loop, (cst.For, cst.While)) and isinstance(loop.body, cst.IndentedBlock):
        body = loop.body.with_changes(body=_with_prelude(list(loop.body.body), prelude))
        return [*statements[:split], loop.with_changes(body=body), *statements[split + 1:]]
    if statements:
        prelude = [prelude[0].with_changes(leading_lines=statements[0].leading_lines), *prelude[1:]]
        statements = [statements[0].with_changes(leading_lines=[]), *statements[1:]]
    return [*prelude, *statements]


def _calls_autograd_backward(node: cst.CSTNode) -> bool:
    """Whether the node calls `torch.autograd.backward(...)`, which a GradScaler rewrite cannot scale."""
    found = []

    class Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if dotted(call.func) in ("torch.autograd.backward", "autograd.backward"):
                found.append(call)

    node.visit(Finder())
    return bool(found)


def _is_docstring(statement: cst.BaseStatement) -> bool:
    """A statement that is only a string (a module's or function's docstring when first)."""
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def _is_zero_grad(statement: cst.BaseStatement) -> bool:
    """`x.zero_grad(...)`, or that line alone under an `if` (as accumulation guards it)."""
    if isinstance(statement, cst.If) and statement.orelse is None and isinstance(statement.body, cst.IndentedBlock):
        return len(statement.body.body) == 1 and _is_zero_grad(statement.body.body[0])
    return method_call(statement_call(statement), "zero_grad") is not None


def _is_optimizer(name: str | None, facts: ScriptFacts) -> bool:
    """A receiver that is an optimizer: assigned from torch.optim, annotated, or named like one."""
    if name is None:
        return False
    last = name.rsplit(".", 1)[-1].lower()
    return name in facts.optimizers or "optim" in last or last == "opt"


def _is_scheduler(name: str | None, facts: ScriptFacts) -> bool:
    """A receiver that is a learning-rate scheduler: assigned from lr_scheduler, or named like one."""
    if name is None:
        return False
    return name in facts.schedulers or "sched" in name.rsplit(".", 1)[-1].lower()


def _count_optimizer_steps(block: cst.CSTNode, facts: ScriptFacts) -> int:
    """How many `optimizer.step()` statements the block has (scaler.update follows the last)."""
    count = []

    class Counter(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, line: cst.SimpleStatementLine) -> None:
            call = statement_call(line)
            if call is not None and not call.args and _is_optimizer(method_call(call, "step"), facts):
                count.append(line)

    block.visit(Counter())
    return len(count)


class _StepBodyRewrite(cst.CSTTransformer):
    """Inside one target body: non_blocking copies, GradScaler calls, accumulation guards."""

    def __init__(self, plan: StepPlan, facts: ScriptFacts, params: dict[str, str]):
        super().__init__()
        self.plan = plan
        self.facts = facts
        self.module_params = {n for n, a in params.items() if a.split(".")[-1] == "Module"}
        self.seen_backward = False
        self.optimizer_steps_total = 0
        self.optimizer_steps_seen = 0
        self.use_scaler = False
        self.used_scaler = False

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = updated_node.func
        if not isinstance(func, cst.Attribute):
            return updated_node
        method = func.attr.value
        if method == "backward":
            return self._backward(updated_node)
        if self.plan.non_blocking and method in ("to", "cuda") and self._copies_to_device(updated_node):
            return _put_keyword(updated_node, "non_blocking", cst.Name("True"))
        return updated_node

    def _backward(self, call: cst.Call) -> cst.BaseExpression:
        """`x.backward()` → `(x / ACCUMULATION_STEPS).backward()` and/or `scaler.scale(x).backward()`."""
        self.seen_backward = True
        func = call.func
        assert isinstance(func, cst.Attribute)
        receiver = func.value
        if isinstance(receiver, cst.Call) and method_call(receiver, "scale") is not None:
            return call  # already scaled by the user's own GradScaler
        if dotted(receiver) in ("torch.autograd", "autograd"):
            return call  # torch.autograd.backward(tensors): a function, not a tensor method
        if self.plan.accumulation:
            receiver = cst.BinaryOperation(
                left=receiver, operator=cst.Divide(), right=cst.Name(ACCUMULATION_CONSTANT),
                lpar=[] if self.use_scaler else [cst.LeftParen()],
                rpar=[] if self.use_scaler else [cst.RightParen()],
            )
        if self.use_scaler:
            receiver = cst.parse_expression(f"{self.plan.scaler_name}.scale(x)").with_changes(
                args=[cst.Arg(value=receiver)])
            self.used_scaler = True
        return call.with_changes(func=func.with_changes(value=receiver))

    def _copies_to_device(self, call: cst.Call) -> bool:
        """A `.to(<device>)` / `.cuda()` on a tensor that has no non_blocking yet."""
        func = call.func
        assert isinstance(func, cst.Attribute)
        receiver = dotted(func.value)
        if receiver is not None:
            last = receiver.rsplit(".", 1)[-1].lower()
            if receiver in self.module_params or last == "self" or any(w in last for w in ("model", "net", "module")):
                return False
        if keyword_arg(call, "non_blocking") is not None or any(a.star for a in call.args):
            return False
        positional = [a.value for a in call.args if a.keyword is None]
        if func.attr.value == "cuda":
            return len(positional) < 2
        if any(isinstance(v, cst.Name) and v.value in ("True", "False") for v in positional):
            return False  # non_blocking passed by position
        if not positional:
            return keyword_arg(call, "device") is not None
        first = dotted(positional[0]) or ""
        if first.startswith("torch.") and first.split(".", 1)[1] in DTYPE_NAMES:
            return False  # dtype-only conversion: no copy to a device
        return "dtype" not in first.rsplit(".", 1)[-1].lower()

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> Any:
        call = statement_call(updated_node)
        if call is None:
            return updated_node
        plan = self.plan
        optimizer = method_call(call, "step")
        if not call.args and _is_optimizer(optimizer, self.facts):
            self.optimizer_steps_seen += 1
            lines: list[cst.BaseStatement] = [updated_node]
            if self.use_scaler:
                lines = [updated_node.with_changes(body=[cst.Expr(cst.parse_expression(
                    f"{plan.scaler_name}.step({optimizer})"))])]
                if self.optimizer_steps_seen == self.optimizer_steps_total:
                    lines.append(cst.parse_statement(f"{plan.scaler_name}.update()"))
            return self._guard(lines, "last_micro_step") if plan.accumulation else _flatten(lines)
        if plan.accumulation and method_call(call, "zero_grad") is not None:
            # Before the backward it clears the previous cycle's gradients; after it, this one's.
            return self._guard([updated_node], "last_micro_step" if self.seen_backward else "first_micro_step")
        if plan.accumulation and not call.args and _is_scheduler(method_call(call, "step"), self.facts):
            return self._guard([updated_node], "last_micro_step")
        return updated_node

    def _guard(self, lines: list[cst.BaseStatement], flag: str) -> cst.If:
        """`if <flag>:` around the lines; comments above the first line stay above the `if`."""
        first = lines[0]
        return cst.If(test=cst.Name(flag),
                      body=cst.IndentedBlock(body=[first.with_changes(leading_lines=[]), *lines[1:]]),
                      leading_lines=first.leading_lines)


def _flatten(lines: list[cst.BaseStatement]) -> Any:
    """One statement, or several in place of one (what a transformer's leave_ may return)."""
    return lines[0] if len(lines) == 1 else cst.FlattenSentinel(lines)


# --------------------------------------------------------------------------------------------------
# Module level: the GradScaler, the accumulation counter, `import torch`


def add_module_statements(module: cst.Module, facts: ScriptFacts, plan: StepPlan,
                          rewrite: TargetRewrite) -> cst.Module:
    """Insert what the rewritten target needs at module level, right after the imports."""
    imports, lines = [], []
    needs_torch = rewrite.used_scaler or bool(plan.amp)
    if needs_torch and not facts.torch_bound:
        imports.append(cst.parse_statement("import torch"))
    if rewrite.used_scaler:
        lines.append(f'{plan.scaler_name} = torch.amp.GradScaler("cuda")')
    if rewrite.used_accumulation:
        lines.append(f"{ACCUMULATION_CONSTANT} = {plan.accumulation}  # gradient accumulation: one optimizer step "
                     f"every {plan.accumulation} calls of {rewrite.target}")
        lines.append(f"{ACCUMULATION_COUNTER} = 0")
    if not imports and not lines:
        return module
    body = list(module.body)
    index = _after_imports(body)
    following = body[index] if index < len(body) else None
    statements = [cst.parse_statement(code) for code in lines]
    if statements:
        # A block of its own: the blank lines that separated the imports from what follows, and again after.
        blank = [line for line in (following.leading_lines if following is not None else []) if line.comment is None]
        statements[0] = statements[0].with_changes(leading_lines=blank or [cst.EmptyLine()])
        if following is not None and not following.leading_lines:
            body[index] = following.with_changes(leading_lines=[cst.EmptyLine()])
    if imports and index > 0 and _is_docstring(body[index - 1]):  # no imports: a blank after the docstring
        imports[0] = imports[0].with_changes(leading_lines=[cst.EmptyLine()])
    return module.with_changes(body=[*body[:index], *imports, *statements, *body[index:]])


def _after_imports(body: list[cst.BaseStatement]) -> int:
    """The index just after the last top-level import that precedes the first def or class."""
    index = 0
    for i, statement in enumerate(body):
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            break
        if isinstance(statement, cst.SimpleStatementLine) and all(
                isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body):
            index = i + 1
        elif isinstance(statement, cst.Try) and all(
                isinstance(s, cst.SimpleStatementLine) and all(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)
                for s in statement.body.body):
            index = i + 1
    if index == 0 and body and _is_docstring(body[0]):
        index = 1
    return index

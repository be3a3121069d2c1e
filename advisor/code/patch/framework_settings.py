"""Kept settings written in a framework's own terms, where the script configures the framework.

A script that trains through a framework holds no DataLoader call, autocast block or optimizer
constructor of its own: the framework builds them from its settings. Where the script (or a module of the
repository it imports) builds the framework's settings object, the knobs go there, as keywords of that
call; a keyword whose value is a name is followed to the constant, flag default or config field that
sets it (the DataLoader rewrite's rules, `advisor.code.patch.loader_arguments`):

- transformers: `TrainingArguments(...)` (or a subclass's call): `bf16=True` / `fp16=True`,
  `per_device_train_batch_size` (micro-batches with `gradient_accumulation_steps` where the effective
  batch stays), `dataloader_num_workers`, `dataloader_pin_memory`, `dataloader_persistent_workers`,
  `dataloader_prefetch_factor`, `torch_compile=True`, `optim="adamw_torch_fused"`, `tf32=True`;
- accelerate: `Accelerator(mixed_precision="bf16" | "fp16")`;
- Lightning: `Trainer(precision="bf16-mixed" | "16-mixed")`; channels_last and `torch.compile` on the
  model right before `trainer.fit(model)`. Its DataLoader, optimizer and TF32 are the script's own
  code (`train_dataloader`, `configure_optimizers`, `torch.set_float32_matmul_precision`): the plain rules
  write them.

Each knob's keywords are declared in its module (`Written`: `trainer_for`, `trainer_keywords`,
`micro_batches_of`, `accelerator_argument`, `lightning_for`, `lightning_model`; `Knob.training_argument`).
`rewrite_frameworks` returns the knobs it wrote; the plain rules write the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import libcst as cst

from advisor.code.patch.facts import ScriptFacts
from advisor.code.patch.loader_arguments import ArgparseRewrite, LoaderRewrite, set_constants
from advisor.code.patch.written import to_write
from advisor.code.settings import Elsewhere
from advisor.code.syntax import BlockRewrite, after_imports, dotted, keyword_arg, literal_node, put_keyword, replace_arg
from advisor.knobs import BY_NAME, KNOBS, TRAINING_ARGUMENTS
from advisor.knobs.knob import Code
from advisor.trials.knobs import Knobs

LIGHTNING_MODULES = ("lightning", "pytorch_lightning")


def trainer_keywords(knobs: Knobs, user: dict) -> dict[str, Any]:
    """The TrainingArguments keywords for the knobs, by knob: {knob: {keyword: value}} (each knob's `Written`)."""
    out: dict[str, dict[str, Any]] = {}
    for knob in KNOBS:  # a keyword for each of its values (`bf16=True`)
        value = getattr(knobs, knob.name)
        if value and knob.written and knob.written.trainer_for:
            out[knob.name] = dict(knob.written.trainer_for[value])
    for name, keyword in TRAINING_ARGUMENTS.items():
        value = getattr(knobs, name)
        if value is not None and value != user.get(name):
            out[name] = {keyword: value}
    for knob in KNOBS:  # micro-batches of the batch, with the Trainer's own accumulation
        of = knob.written.micro_batches_of if knob.written else None
        if of is None:
            continue
        k, batch = getattr(knobs, knob.name) or 1, getattr(knobs, of) or user.get(of)
        if k > 1 and batch and batch % k == 0:
            out[knob.name] = {TRAINING_ARGUMENTS[of]: batch // k, knob.written.trainer_count: k}
            if getattr(knobs, of) is not None:
                out[of] = {}  # the micro-batch above is the batch knob's too
    for name in to_write(knobs, user):  # the Trainer's own way to compile, fuse the optimizer, use TF32
        if BY_NAME[name].written.trainer_keywords:
            out[name] = dict(BY_NAME[name].written.trainer_keywords)
    return out


def accelerator_keywords(knobs: Knobs) -> dict[str, Any]:
    """`Accelerator(...)` keywords, by knob."""
    return {k.name: {k.written.accelerator_argument: getattr(knobs, k.name)} for k in KNOBS
            if k.written and k.written.accelerator_argument and getattr(knobs, k.name)}


def lightning_keywords(knobs: Knobs) -> dict[str, Any]:
    """Lightning `Trainer(...)` keywords, by knob."""
    return {k.name: dict(k.written.lightning_for[getattr(knobs, k.name)]) for k in KNOBS
            if k.written and k.written.lightning_for and getattr(knobs, k.name)}


@dataclass
class FrameworkCalls:
    """Which framework calls one file makes: the callee names it uses for each."""

    lightning_names: set[str] = field(default_factory=set)  # names bound to lightning modules or its Trainer
    found: dict[str, int] = field(default_factory=dict)  # kind -> calls

    def kind(self, call: cst.Call) -> str | None:
        """"transformers", "accelerate", "lightning" or None for a call."""
        name = dotted(call.func) or ""
        last = name.rsplit(".", 1)[-1]
        if last.endswith("TrainingArguments"):
            return "transformers"
        if last == "Accelerator":
            return "accelerate"
        if last == "Trainer" and (name.split(".")[0] in self.lightning_names):
            return "lightning"
        return None


def framework_calls(module: cst.Module) -> FrameworkCalls:
    """The framework calls of a module (Lightning's Trainer known by its import)."""
    calls = FrameworkCalls()

    class Visitor(cst.CSTVisitor):
        def visit_Import(self, node: cst.Import) -> None:
            for alias in node.names:
                name = dotted(alias.name) or ""
                if name.split(".")[0] in LIGHTNING_MODULES:
                    calls.lightning_names.add(alias.evaluated_alias or name.split(".")[0])

        def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
            source = dotted(node.module) if node.module is not None else ""
            if (source or "").split(".")[0] in LIGHTNING_MODULES and not isinstance(node.names, cst.ImportStar):
                calls.lightning_names.update(a.evaluated_alias or a.evaluated_name for a in node.names)

        def visit_Call(self, node: cst.Call) -> None:
            kind = calls.kind(node)
            if kind is not None:
                calls.found[kind] = calls.found.get(kind, 0) + 1

    module.visit(Visitor())
    return calls


class KeywordRewrite(LoaderRewrite):
    """Sets keywords of the framework calls of one kind, with the DataLoader rewrite's rules for values
    that come from a constant, a flag's default or a config elsewhere."""

    def __init__(self, facts: ScriptFacts, calls: FrameworkCalls, kind: str, keywords: dict[str, Any],
                 user_values: dict, elsewhere: Elsewhere):
        super().__init__(facts, {}, user_values, elsewhere=elsewhere)
        self.calls, self.kind_, self.keywords = calls, kind, keywords
        self.rewritten = 0
        self.needs_torch = False  # an added expression names torch

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if self.calls.kind(updated_node) != self.kind_:
            return updated_node
        call = updated_node
        for keyword, value in self.keywords.items():
            arg = keyword_arg(call, keyword)
            if isinstance(value, Code):
                if arg is None:
                    call = put_keyword(call, keyword, cst.parse_expression(value.text))
                    self.needs_torch = self.needs_torch or "torch." in value.text
            elif arg is not None and isinstance(arg.value, cst.SimpleString):  # optim="adamw_torch", precision="32"
                call = replace_arg(call, arg, literal_node(value))
            else:
                call = self._set(call, keyword, value)
        self.rewritten += 1
        return self._wrapped(original_node, updated_node, call)


def rewrite_calls(module: cst.Module, calls: FrameworkCalls, kind: str, keywords: dict[str, Any],
                  user_values: dict, elsewhere: Elsewhere) -> tuple[cst.Module, bool]:
    """The module with the keywords set in its calls of `kind`; whether there was one."""
    facts = ScriptFacts.collect(module)
    rewrite = KeywordRewrite(facts, calls, kind, keywords, user_values, elsewhere)
    module = cst.MetadataWrapper(module, unsafe_skip_copy=True).visit(rewrite)
    if rewrite.constant_changes:
        module = module.with_changes(body=[set_constants(s, rewrite.constant_changes) for s in module.body])
    if rewrite.argparse_changes:
        module = module.visit(ArgparseRewrite(rewrite.argparse_changes))
    if rewrite.needs_torch:
        module = with_torch_import(module)
    return module, rewrite.rewritten > 0


def with_torch_import(module: cst.Module) -> cst.Module:
    """The module with `import torch` after its imports, unless it binds torch already."""
    if ScriptFacts.collect(module).torch_bound:
        return module
    body = list(module.body)
    index = after_imports(body)
    return module.with_changes(body=[*body[:index], cst.parse_statement("import torch"), *body[index:]])


class BeforeFit(BlockRewrite):
    """Lines on the model (channels_last, torch.compile) right before the first `<trainer>.fit(model, ...)`."""

    def __init__(self, lines: list[str]):
        super().__init__()
        self.lines = lines
        self.placed = False

    def statements(self, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """The block with the model lines before its first fit call."""
        out: list[cst.BaseStatement] = []
        for statement in body:
            model = None if self.placed else fit_model(statement)
            if model is not None:
                out += [cst.parse_statement(line.format(model=model)) for line in self.lines]
                self.placed = True
            out.append(statement)
        return out


def fit_model(statement: cst.BaseStatement) -> str | None:
    """The model's name in a statement `x.fit(model, ...)` or `x.fit(model=model, ...)`."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    call = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "fit"):
        return None
    arg = next((a for a in call.args if a.keyword is None or a.keyword.value == "model"), None)
    return arg.value.value if arg is not None and isinstance(arg.value, cst.Name) else None


@dataclass
class FrameworkPatch:
    """What the framework rules wrote: the knobs, and notes for the user."""

    written: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)


def rewrite_frameworks(edited: dict[Path, cst.Module], module_of: Callable[[Path], cst.Module], files: list[Path],
                       knobs: Knobs, user_values: dict, elsewhere: Elsewhere) -> FrameworkPatch:
    """Write the knobs a framework owns into the first file (of `files`) that configures that framework."""
    done = FrameworkPatch()
    plans: dict[str, dict[str, Any]] = {
        "transformers": trainer_keywords(knobs, user_values),
        "accelerate": accelerator_keywords(knobs),
        "lightning": lightning_keywords(knobs),
    }
    users = {TRAINING_ARGUMENTS[k]: v for k, v in user_values.items() if k in TRAINING_ARGUMENTS}
    read: dict[Path, tuple[cst.Module, FrameworkCalls]] = {}  # each file's calls, read again once it is rewritten
    for kind, by_knob in plans.items():
        by_knob = {k: v for k, v in by_knob.items() if k not in done.written}
        for path in files:
            module = edited.get(path) or module_of(path)
            if path not in read or read[path][0] is not module:
                read[path] = (module, framework_calls(module))
            calls = read[path][1]
            if kind not in calls.found:
                continue
            if by_knob:
                keywords = {kw: v for change in by_knob.values() for kw, v in change.items()}
                edited[path], _ = rewrite_calls(module, calls, kind, keywords, users, elsewhere)
                done.written.update(by_knob)
            if kind == "lightning":
                module = edited.get(path) or module
                done.written |= lightning_model(edited, path, module, knobs, user_values, done.notes)
            break
    return done


def lightning_model(edited: dict[Path, cst.Module], path: Path, module: cst.Module, knobs: Knobs,
                    user_values: dict, notes: list[str]) -> set[str]:
    """Each knob's line on the model (`Written.lightning_model`) before `trainer.fit(model)`; the knobs written."""
    lines = {name: BY_NAME[name].written.lightning_model for name in to_write(knobs, user_values)
             if BY_NAME[name].written.lightning_model}
    if not lines:
        return set()
    rewrite = BeforeFit(list(lines.values()))
    changed = module.visit(rewrite)
    if not rewrite.placed:
        notes.append("no trainer.fit(model) call with a plain name was found: "
                     + "; ".join(f"{k}: {line.format(model='model')}" for k, line in lines.items()))
        return set()
    edited[path] = with_torch_import(changed)
    return set(lines)

"""The model knobs written where the script sets those things up (each knob's `Written` says which and how): the
lines on the model after it is built (just before the optimizer is made from its parameters: channels_last,
torch.compile), `fused=True` (or `foreach=True`) where the optimizer is constructed, and the keyword the step's move
of the batch takes (channels_last), as a user would write them by hand. TF32 and cudnn.benchmark, lines after the
imports, are `advisor.code.patch.written`'s."""

from __future__ import annotations

import libcst as cst

from advisor.code.patch.facts import ScriptFacts, is_optimizer_constructor
from advisor.code.syntax import BlockRewrite, dotted, keyword_arg, literal_value, put_keyword
from advisor.knobs import BY_NAME
from advisor.knobs.knob import IN_OPTIMIZER, ON_MODEL

# torch.optim classes with a fused implementation (CUDA and CPU); the others take foreach=True.
FUSED_CLASSES = ("Adam", "AdamW", "SGD", "Adagrad")


def rewrite_model(module: cst.Module, changes: dict[str, object]) -> tuple[cst.Module, list[str]]:
    """The module with the model knobs of `changes` (written ON_MODEL or IN_OPTIMIZER, by name) written in; notes
    say what could not be placed."""
    notes: list[str] = []
    knobs = [BY_NAME[name] for name in changes]
    if not knobs:
        return module, notes
    rewrite = ModelSetup(knobs, ScriptFacts.collect(module))
    module = module.visit(rewrite)
    if not rewrite.optimizers:
        notes.append("no torch.optim optimizer is built in this file: "
                     + "; ".join(knob.written.manual for knob in knobs))
    elif rewrite.on_model and not rewrite.model_placed:
        notes.append("the model the optimizer is built from is not a plain name: "
                     + "; ".join(knob.written.manual for knob in rewrite.on_model))
    return module, notes


class ModelSetup(BlockRewrite):
    """Before the first optimizer built from each model's `<model>.parameters()`: that model's lines (a GAN's
    generator and discriminator each, as the trial applies them to each model it calls); in every optimizer
    constructor: fused=True (foreach=True for classes without a fused kernel)."""

    def __init__(self, knobs: list, facts: ScriptFacts):
        super().__init__()
        self.on_model = [knob for knob in knobs if knob.written.at == ON_MODEL]  # their lines, in order
        self.fused = any(knob.written.at == IN_OPTIMIZER for knob in knobs)
        self.facts = facts
        self.optimizers = 0
        self.placed: set[str] = set()  # the models (by their first name: `model` covers `model.decoder`) written

    @property
    def model_placed(self) -> bool:
        """Whether the model lines were written for at least one model."""
        return bool(self.placed)

    def _optimizer_call(self, statement: cst.BaseStatement) -> cst.Call | None:
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return None
        small = statement.body[0]
        # `return torch.optim.Adam(...)`: a LightningModule's configure_optimizers.
        value = small.value if isinstance(small, (cst.Assign, cst.AnnAssign, cst.Expr, cst.Return)) else None
        if isinstance(value, cst.Call) and is_optimizer_constructor(value, self.facts.optim_imports):
            return value
        return None

    def _model_name(self, call: cst.Call) -> str | None:
        first = call.args[0].value if call.args and call.args[0].keyword is None else None
        if isinstance(first, cst.Call) and isinstance(first.func, cst.Attribute) \
                and first.func.attr.value in ("parameters", "named_parameters"):
            name = dotted(first.func.value)
            # `self.parameters()` (a LightningModule's configure_optimizers): the model is built elsewhere.
            return None if name is None or name.split(".")[0] == "self" else name
        return None

    def statements(self, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """The block with each model's lines before its first optimizer, fused in each optimizer's call."""
        out: list[cst.BaseStatement] = []
        for statement in body:
            call = self._optimizer_call(statement)
            if call is None:
                out.append(statement)
                continue
            self.optimizers += 1
            model = self._model_name(call)
            if model is not None and model.split(".")[0] not in self.placed and self.on_model:
                out += [cst.parse_statement(line.format(model=model))
                        for knob in self.on_model for line in knob.written.lines]
                self.placed.add(model.split(".")[0])
            if self.fused:
                statement = statement.visit(_Fused(call, self.facts))
            out.append(statement)
        return out



class _Fused(cst.CSTTransformer):
    """fused=True (or foreach=True) in one optimizer constructor call."""

    def __init__(self, call: cst.Call, facts: ScriptFacts):
        super().__init__()
        self.target = call
        self.facts = facts

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not original_node.deep_equals(self.target):
            return updated_node
        name = (dotted(original_node.func) or "").rsplit(".", 1)[-1]
        option = "fused" if name in FUSED_CLASSES else "foreach"
        if option == "fused" and keyword_arg(updated_node, "foreach") is not None:
            known, value = literal_value(keyword_arg(updated_node, "foreach").value)
            if known and value:  # fused and foreach=True together are refused
                updated_node = put_keyword(updated_node, "foreach", cst.Name("None"))
        return put_keyword(updated_node, option, cst.Name("True"))


def rewrite_inputs(module: cst.Module, target: str, keyword: tuple[str, str],
                   positions: list[int] | None = None) -> tuple[cst.Module, bool]:
    """In the step function `target`: the keyword (its name, its code) in the move of the batch the model is called
    with to the device (`x = x.to(device)` → `x = x.to(device, memory_format=torch.channels_last)`): each input at
    `positions` of the model's call (what the trial found 4-D there: a siamese model's two images), else the first.
    Returns the module and whether it found those lines."""
    rewrite = MovedInput(target.rsplit(".", 1)[-1], keyword, tuple(positions) if positions else (0,))
    module = module.visit(rewrite)
    return module, rewrite.done


class MovedInput(cst.CSTTransformer):
    """The names both moved with `.to(...)` in the function and called into at `positions` of the model's call (the
    first call that takes a moved name first)."""

    def __init__(self, function: str, keyword: tuple[str, str] | None = None, positions: tuple[int, ...] = (0,)):
        super().__init__()
        self.function = function
        self.keyword = keyword
        self.positions = positions
        self.depth = 0
        self.moved: set[str] = set()
        self.fed: str | None = None  # the model's first input
        self.inputs: set[str] = set()  # those at `positions`, not moved yet
        self.done = False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if node.name.value != self.function or self.done:
            return self.depth > 0
        self.depth += 1
        self.moved, self.fed, self.inputs = set(), None, set()
        node.visit(_Collect(self))  # which names are moved, and fed to the model
        return True

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if original_node.name.value == self.function and self.depth:
            self.depth -= 1
        return updated_node

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if not self.depth or self.fed is None or self.done:
            return updated_node
        targets = [t.target for t in updated_node.targets]
        value = updated_node.value
        pairs = []
        if len(targets) == 1 and isinstance(targets[0], cst.Tuple) and isinstance(value, cst.Tuple):
            pairs = list(zip([e.value for e in targets[0].elements], [e.value for e in value.elements]))
        elif len(targets) == 1:
            pairs = [(targets[0], value)]
        found = {id(moved): self.rewritten(moved) for name, moved in pairs
                 if isinstance(name, cst.Name) and name.value in self.inputs and is_move(moved, name.value)}
        if not found:
            return updated_node
        self.inputs -= {name.value for name, moved in pairs if id(moved) in found}
        self.done = not self.inputs
        if isinstance(value, cst.Tuple):
            elements = [e.with_changes(value=found.get(id(e.value), e.value)) for e in value.elements]
            return updated_node.with_changes(value=value.with_changes(elements=elements))
        return updated_node.with_changes(value=found[id(value)])


    def rewritten(self, moved: cst.Call) -> cst.BaseExpression:
        """What the batch's `x.to(device)` becomes: with the keyword."""
        return put_keyword(moved, self.keyword[0], cst.parse_expression(self.keyword[1]))


def is_move(node: cst.BaseExpression, name: str) -> bool:
    """Whether `node` is `<name>.to(...)`."""
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "to" \
        and dotted(node.func.value) == name


class _Collect(cst.CSTVisitor):
    def __init__(self, owner: MovedInput):
        super().__init__()
        self.owner = owner

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        for target in node.targets:
            t = target.target
            pairs = list(zip([e.value for e in t.elements], [e.value for e in value.elements])) \
                if isinstance(t, cst.Tuple) and isinstance(value, cst.Tuple) else [(t, value)]
            for name, moved in pairs:
                if isinstance(name, cst.Name) and is_move(moved, name.value):
                    self.owner.moved.add(name.value)

    def visit_Call(self, node: cst.Call) -> None:
        if self.owner.fed is not None or not node.args or node.args[0].keyword is not None:
            return
        first = node.args[0].value
        callee = dotted(node.func) or ""
        if isinstance(first, cst.Name) and first.value in self.owner.moved and \
                (isinstance(node.func, cst.Name) or callee.startswith("self.")):
            self.owner.fed = first.value
            given = [a.value for a in node.args if a.keyword is None and not a.star]
            self.owner.inputs = {given[i].value for i in self.owner.positions if i < len(given)
                                 and isinstance(given[i], cst.Name) and given[i].value in self.owner.moved}

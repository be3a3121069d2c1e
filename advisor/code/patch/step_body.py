"""Inside the step function's body: non_blocking copies, GradScaler calls, accumulation guards."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libcst as cst

from advisor.code.patch.facts import ScriptFacts
from advisor.knobs import written_at
from advisor.knobs.knob import ACCUMULATION, AUTOCAST, COPIES, IN_STEP
from advisor.code.syntax import dotted, keyword_arg, method_call, put_keyword, statement_call

# How a user writes each part of the step's rewrite by hand, for the note where the advisor cannot.
BY_HAND = {AUTOCAST: "put the forward under torch.autocast", COPIES: "pass non_blocking=True to .to(device)",
           ACCUMULATION: "step the optimizer (and zero its gradients) once every N batches"}
ACCUMULATION_CONSTANT = "ACCUMULATION_STEPS"
ACCUMULATION_COUNTER = "accumulation_micro_step"


@dataclass
class StepPlan:
    """What to change inside the target: each part of the step's rewrite as the knobs written there ask
    (`Written.step_part`): autocast, non_blocking copies, `accumulation` micro-steps (None: one a step)."""

    autocast: str | None  # the dtype the forward is autocast to
    copies: str | None  # the keyword the step's copies to the device take as True (the knob's `Written.argument`)
    accumulation: int | None
    scaler_name: str
    asked: tuple[tuple[str, Any], ...] = ()  # (knob, value) of each part asked for, for the note where none is written
    how: tuple[str, ...] = ()  # how a user writes each of those parts by hand

    @classmethod
    def of(cls, knobs: Any, scaler_name: str = "scaler") -> StepPlan:
        """The plan for the knobs written in the step (`IN_STEP`) of a `Knobs`."""
        parts = {k.written.step_part: k for k in written_at(IN_STEP) if k.written.step_part}
        # A knob's value where it asks for its part: one micro-step a step is no accumulation.
        on = {part: value for part, k in parts.items()
              if (value := getattr(knobs, k.name)) and not (part == ACCUMULATION and value == 1)}
        asked = tuple((parts[part].name, value) for part, value in on.items())
        copies = parts[COPIES].written.argument if on.get(COPIES) else None
        return cls(autocast=on.get(AUTOCAST), copies=copies, accumulation=on.get(ACCUMULATION),
                   scaler_name=scaler_name, asked=asked, how=tuple(BY_HAND[part] for part in on))

    @property
    def fp16(self) -> bool:
        """fp16 autocast, which needs a GradScaler."""
        return self.autocast == "fp16"

    def turned(self) -> bool:
        """Whether autocast, non_blocking copies or accumulation are to be written."""
        return bool(self.autocast or self.copies or self.accumulation)

    def unwritten(self) -> str:
        """The note where no step function is known to write them in."""
        kept = ", ".join(f"{name}={value}" for name, value in self.asked)
        return (f"{kept} is not written: the step's loop was found neither in a function nor once at the script's top "
                f"level (a framework's loop runs it, or it needs a step function's bounds); "
                f"{' and '.join(self.how)}, or set the framework's own option")


DTYPE_NAMES = {
    "float16", "half", "bfloat16", "float32", "float", "float64", "double", "int8", "uint8", "int16",
    "short", "int32", "int", "int64", "long", "bool", "complex64", "cfloat", "complex128", "cdouble",
    "float8_e4m3fn", "float8_e5m2",
}


def is_optimizer(name: str | None, facts: ScriptFacts) -> bool:
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


class StepBodyRewrite(cst.CSTTransformer):
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
        if self.plan.copies and method in ("to", "cuda") and self._copies_to_device(updated_node):
            return put_keyword(updated_node, self.plan.copies, cst.Name("True"))
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
        """A `.to(<device>)` / `.cuda()` on a tensor that has no keyword of the copies' yet (non_blocking)."""
        func = call.func
        assert isinstance(func, cst.Attribute)
        receiver = dotted(func.value)
        if receiver is not None:
            last = receiver.rsplit(".", 1)[-1].lower()
            if receiver in self.module_params or last == "self" or any(w in last for w in ("model", "net", "module")):
                return False
        if keyword_arg(call, self.plan.copies) is not None or any(a.star for a in call.args):
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
        if not call.args and is_optimizer(optimizer, self.facts):
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

"""Where a module's `forward` computes attention by hand, read from its source, and the statements that replace
it once the trial has read the numbers. Pure and torch-free (stdlib `ast`): the source says only *where* a
candidate is; whether `F.scaled_dot_product_attention` computes the same is decided on the real batch
(`advisor.trials.interposition.attention_check`), and the patch writes the same statements
(`advisor.code.patch.sdpa_calls`, from trial.json).

A candidate is a run of consecutive statements of the forward's body:

    s = <a product of two tensors>          # q @ k.transpose(...), torch.matmul(q, k), q @ k, torch.einsum(...)
    ...                                     # anything (a scale, a mask, a bias, a cap: the numbers will say)
    w = <softmax of s over a dimension>     # F.softmax, torch.softmax, s.softmax, possibly cast after
    [w = <dropout of w>]                    # self.drop(w), F.dropout(w, p, training)
    ... w @ v ...                           # or torch.matmul(w, v), torch.einsum(...), inside any expression

What the fused call cannot reproduce by construction is refused here, with the line: the weights or scores
read elsewhere (returned, kept), the weights used otherwise than multiplied with the values. The statements
between the product and the softmax are sorted by what they do to the scores (a scale, a mask by
`masked_fill`, `+`, `torch.where`, under an `if` or not) so that the replacement can be written from what the
trial reads; what they compute is measured, not assumed from their spelling.
"""

from __future__ import annotations

import ast
import copy
import re
from dataclasses import dataclass, field

MATMUL_CALLS = ("torch.matmul", "torch.bmm")
DROPOUT_CALLS = ("F.dropout", "nn.functional.dropout", "torch.nn.functional.dropout", "torch.dropout",
                 "functional.dropout")
CASTS = ("float", "to", "type_as", "contiguous", "half", "bfloat16", "type")


@dataclass(frozen=True)
class Step:
    """One statement between the product and the softmax: a `scale` (op, factor), a `mask` (the code of the
    positions that take part, or an additive mask, and the `if` guard over it), `keep` (does not touch the
    scores: stays before the call), or `other` (changes the scores some other way: the numbers decide)."""

    kind: str
    line: int
    text: str
    code: str = ""  # scale: the factor; mask: the attn_mask expression
    op: str = ""  # scale: "*" or "/"; mask: "bool" or "add"
    guard: str | None = None
    hoist: str = ""  # a guarded mask's other statements (an `if` of them), kept before the call


@dataclass(frozen=True)
class Candidate:
    """A hand-written attention found in a forward: its lines (of the source given), its operands as SDPA
    takes them, the statements between the product and the softmax, the dropout and the product's statement."""

    first_line: int
    last_line: int
    q: str
    k: str  # as SDPA takes the keys: (..., keys, width)
    v: str
    scores: str  # the scores as the softmax takes them (the probe reads this expression)
    scale: tuple[str, str] | None  # (op, factor) in the product's own statement
    steps: tuple[Step, ...]
    softmax_line: int  # the softmax's statement (the probe reads the scores just before it)
    dropout: tuple[str, str | None] | None  # (dropout_p expression, the `self.<module>` name)
    product: str  # the product's statement with the placeholder CALL where `w @ v` was
    softmax_text: str = ""
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Refusal:
    """Attention written by hand that the fused call cannot replace whatever the numbers say: why, and where."""

    reason: str
    line: int


CALL = "__advisor_sdpa_call__"


def text(node: ast.AST) -> str:
    """The expression as source text."""
    return ast.unparse(node)


def is_name(node: ast.AST, name: str) -> bool:
    """Whether `node` is a load of the plain name `name`."""
    return isinstance(node, ast.Name) and node.id == name


def einsum_of(node: ast.AST) -> tuple[str, ast.AST, ast.AST] | None:
    """(the equation without spaces, a, b) of `torch.einsum("...", a, b)`; else None."""
    if isinstance(node, ast.Call) and text(node.func).endswith("einsum") and len(node.args) == 3 \
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value.replace(" ", ""), node.args[1], node.args[2]
    return None


def matmul_of(node: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """The operands of `a @ b` or `torch.matmul(a, b)`; else None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return node.left, node.right
    if isinstance(node, ast.Call) and text(node.func) in MATMUL_CALLS and len(node.args) == 2 and not node.keywords:
        return node.args[0], node.args[1]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("matmul", "bmm") \
            and len(node.args) == 1 and not node.keywords and text(node.func.value) not in ("torch",):
        return node.func.value, node.args[0]
    return None


def split_equation(equation: str) -> tuple[str, str, str] | None:
    """The three terms of `a,b->out` (letters and `...`)."""
    match = re.fullmatch(r"([\w.]+),([\w.]+)->([\w.]+)", equation)
    return match.groups() if match else None


def einsum_scores(node: ast.AST) -> tuple[str, str] | None:
    """(q, k) of `einsum("...id,...jd->...ij", q, k)`, the keys as SDPA takes them; else None."""
    found = einsum_of(node)
    terms = found and split_equation(found[0])
    if not terms:
        return None
    a, b, out = terms
    if len(a) >= 2 and a[:-2] == b[:-2] == out[:-2] and a[-1] == b[-1] and out[-2:] == a[-2] + b[-2] \
            and len({a[-2], b[-2], a[-1]}) == 3:
        return text(found[1]), text(found[2])
    return None


def einsum_product(node: ast.AST, weights: str) -> str | None:
    """v of `einsum("...ij,...jd->...id", w, v)`; else None."""
    found = einsum_of(node)
    terms = found and split_equation(found[0])
    if not terms or not is_name(found[1], weights):
        return None
    a, b, out = terms
    if len(a) >= 2 and a[:-2] == b[:-2] == out[:-2] and a[-1] == b[-2] and out[-2:] == a[-2] + b[-1]:
        return text(found[2])
    return None


def keys_of(node: ast.AST) -> str:
    """The keys as SDPA takes them from the product's right operand: `k` of `k.transpose(-2, -1)`, `k.mT`,
    `k.transpose(2, 3)`; else the operand transposed back (`(k).transpose(-2, -1)`; the numbers check it)."""
    if isinstance(node, ast.Attribute) and node.attr == "mT":
        return text(node.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "transpose" \
            and len(node.args) == 2 and not node.keywords and {text(a) for a in node.args} in (
                {"-2", "-1"}, {"2", "3"}, {"1", "2"}):
        return text(node.func.value)
    return f"({text(node)}).transpose(-2, -1)"


def scores_of(node: ast.AST) -> tuple[str, str, tuple[str, str] | None] | None:
    """(q, k, (op, factor)) of a product of two tensors, optionally `/ x` or `* x` (either side); else None."""
    scale = None
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.Mult)):
        if matmul_of(node.left) or einsum_scores(node.left):
            scale, node = ("/" if isinstance(node.op, ast.Div) else "*", text(node.right)), node.left
        elif isinstance(node.op, ast.Mult) and (matmul_of(node.right) or einsum_scores(node.right)):
            scale, node = ("*", text(node.left)), node.right
    if (pair := einsum_scores(node)) is not None:
        return pair[0], pair[1], scale
    pair = matmul_of(node)
    if pair is None:
        return None
    return text(pair[0]), keys_of(pair[1]), scale


def assigned(stmt: ast.stmt) -> str | None:
    """The single plain name an assignment stores to."""
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and isinstance(getattr(stmt, "value", None), ast.AST):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if len(targets) == 1 and isinstance(targets[0], ast.Name):
            return targets[0].id
    return None


def reads(node: ast.AST, names: set[str]) -> bool:
    """Whether `node` loads any of `names`."""
    return any(isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load) for n in ast.walk(node))


def softmax_argument(node: ast.AST, scores: str) -> ast.AST | None:
    """The argument of a softmax of `scores` (`scores`, or `scores` scaled: `s / x`, `s * x`) over a dimension
    (F.softmax(s, ...), torch.softmax, s.softmax(...)), possibly cast after; else None."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CASTS:
        node = node.func.value
    if not isinstance(node, ast.Call):
        return None
    name = text(node.func)
    if isinstance(node.func, ast.Attribute) and is_name(node.func.value, "self") and len(node.args) == 1 \
            and not node.keywords and is_name(node.args[0], scores):
        return node.args[0]  # a module of its own (`self.softmax = nn.Softmax(dim=-1)`): the numbers say if it is one
    if not name.endswith("softmax") or name.endswith("log_softmax"):
        return None
    if isinstance(node.func, ast.Attribute) and is_name(node.func.value, scores):
        return node.func.value
    argument = node.args[0] if node.args else None
    if argument is not None and is_name(uncast(argument), scores):
        return argument  # softmax(s.float()): the probe reads it so
    if argument is None or not (is_name(argument, scores) or (
            isinstance(argument, ast.BinOp) and isinstance(argument.op, (ast.Div, ast.Mult))
            and is_name(argument.left, scores) and not reads(argument.right, {scores}))):
        return None
    return argument


def softmax_of(node: ast.AST, scores: str) -> bool:
    """Whether `node` is a softmax of `scores` (see `softmax_argument`)."""
    return softmax_argument(node, scores) is not None


def uncast(node: ast.AST) -> ast.AST:
    """`s` of `s.to(...)`, `s.float()`, `s.type_as(...)`."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CASTS:
        node = node.func.value
    return node


def step_of(stmt: ast.stmt, scores: str) -> Step:
    """What a statement between the product and the softmax does to the scores."""
    line, source = stmt.lineno, text(stmt).splitlines()[0]
    if isinstance(stmt, ast.If) and not stmt.orelse:
        inner = [step_of(s, scores) for s in stmt.body]
        masks = [s for s in inner if s.kind == "mask"]
        if len(masks) == 1 and not masks[0].guard and all(s.kind in ("mask", "keep") for s in inner):
            kept = [s for s, k in zip(stmt.body, inner) if k.kind == "keep"]
            hoist = text(ast.If(stmt.test, kept, [])) if kept else ""  # names the mask reads, made as before
            return Step("mask", line, source, masks[0].code, masks[0].op, text(stmt.test), hoist)
        return Step("other", line, source)
    if not reads(stmt, {scores}) and not (isinstance(stmt, ast.Expr) or assigned(stmt) == scores):
        return Step("keep", line, text(stmt))
    value = stmt.value if isinstance(stmt, (ast.Assign, ast.Expr, ast.AugAssign)) else None
    target = assigned(stmt)
    if isinstance(stmt, ast.AugAssign) and is_name(stmt.target, scores) and not reads(value, {scores}):
        if isinstance(stmt.op, (ast.Mult, ast.Div)):
            return Step("scale", line, source, text(value), "*" if isinstance(stmt.op, ast.Mult) else "/")
        if isinstance(stmt.op, ast.Add):
            return Step("mask", line, source, text(value), "add")
    if target == scores and isinstance(value, ast.BinOp):
        left, right = value.left, value.right
        if isinstance(value.op, (ast.Mult, ast.Div)) and is_name(left, scores) and not reads(right, {scores}):
            return Step("scale", line, source, text(right), "*" if isinstance(value.op, ast.Mult) else "/")
        if isinstance(value.op, ast.Mult) and is_name(right, scores) and not reads(left, {scores}):
            return Step("scale", line, source, text(left), "*")
        if isinstance(value.op, ast.Add) and (is_name(left, scores) or is_name(right, scores)):
            other = right if is_name(left, scores) else left
            if not reads(other, {scores}):
                return Step("mask", line, source, text(other), "add")
    if target == scores and isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and is_name(value.func.value, scores) and len(value.args) == 1 and not value.keywords \
            and not reads(value.args[0], {scores}) and value.func.attr in ("div", "mul", "add"):
        kind = {"div": ("scale", "/"), "mul": ("scale", "*"), "add": ("mask", "add")}[value.func.attr]
        return Step(kind[0], line, source, text(value.args[0]), kind[1])
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and is_name(value.func.value, scores) \
            and len(value.args) == 2 and not reads(value.args[0], {scores}) and (
                (value.func.attr == "masked_fill" and target == scores)
                or (value.func.attr == "masked_fill_" and isinstance(stmt, ast.Expr))):
        return Step("mask", line, source, f"({text(value.args[0])}).logical_not()", "bool")
    if target == scores and isinstance(value, ast.Call) and text(value.func).endswith("where") \
            and len(value.args) == 3 and not reads(value.args[0], {scores}):
        if is_name(uncast(value.args[1]), scores):
            return Step("mask", line, source, f"({text(value.args[0])}).bool()", "bool")
        if is_name(uncast(value.args[2]), scores):
            return Step("mask", line, source, f"({text(value.args[0])}).logical_not()", "bool")
    if target == scores and isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr in CASTS and is_name(value.func.value, scores):
        return Step("cast", line, source)
    return Step("other", line, source)


def find_attention(source: str) -> Candidate | Refusal | None:
    """The first hand-written attention in the body of the function `source` defines (lines numbered from 1),
    a Refusal where one is there but cannot be replaced whatever it computes, None where there is none."""
    function = ast.parse(source).body[0]
    body = function.body if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    for i, stmt in enumerate(body):
        found = assigned(stmt) and scores_of(stmt.value)
        if found:
            chain = attention_chain(body, i, found)
            if chain is not None:
                return chain
    return None


def attention_chain(body: list[ast.stmt], i: int, scores: tuple) -> Candidate | Refusal | None:
    """The attention that starts with the product at `body[i]`, if a softmax of it follows."""
    q, k, scale = scores
    name = assigned(body[i])
    current, names, steps, j = name, {name}, [], None
    for at in range(i + 1, len(body)):
        stmt = body[at]
        if inline_product(stmt, current) or (assigned(stmt) and softmax_of(stmt.value, current)):
            j = at
            break
        target = assigned(stmt)
        if target and target != current and reads(stmt.value, {current}):  # the scores, changed, under a new name
            renamed = ast.Assign([ast.Name(current, ast.Store())], stmt.value, lineno=stmt.lineno)
            steps.append(step_of(ast.fix_missing_locations(renamed), current))
            current = target
            names.add(target)
        else:
            steps.append(step_of(stmt, current))
    if j is None:
        return None
    inline = inline_product(body[j], current)
    argument = softmax_argument(matmul_of(inline[0][0])[0] if inline else body[j].value, current)
    if isinstance(argument, ast.BinOp):  # softmax(s / x): a scale of its own
        steps.append(Step("scale", body[j].lineno, text(argument), text(argument.right),
                          "/" if isinstance(argument.op, ast.Div) else "*"))
    steps = tuple(steps)
    if any(s.kind == "keep" and reads(ast.parse(s.text), names) for s in steps):
        bad = next(s for s in steps if s.kind == "keep" and reads(ast.parse(s.text), names))
        return Refusal(f"the scores ({name}) are read on line {bad.line} besides the softmax: the fused call "
                       "never materialises them", bad.line)
    name = current
    dropout = None
    if inline_product(body[j], name):  # F.softmax(s, dim=-1) @ v in one expression
        at, product = j, inline_product(body[j], name)
    else:
        weights, at = assigned(body[j]), j + 1
        names.add(weights)
        while at < len(body) and assigned(body[at]) and is_name(uncast(body[at].value), weights) \
                and uncast(body[at].value) is not body[at].value:  # w = w.type(v.dtype): a cast of the weights
            weights, at = assigned(body[at]), at + 1
            names.add(weights)
        if at < len(body) and assigned(body[at]) and isinstance(body[at].value, ast.Call) and \
                (drop := dropout_of(body[at].value, weights)) is not None:
            dropout, weights = drop, assigned(body[at])
            names.add(weights)
            at += 1
        if at == len(body):
            return Refusal("the attention weights are computed but never multiplied with the values", body[j].lineno)
        product = [n for n in ast.walk(body[at]) if ((pair := matmul_of(n)) is not None and is_name(pair[0], weights))
                   or einsum_product(n, weights) is not None]
        if not product:
            return Refusal(f"the attention weights ({weights}) are used otherwise than multiplied with the values "
                           f"(line {body[at].lineno})", body[at].lineno)
        product = [(product[0], values_of(product[0], weights))]
    node, values = product[0]
    rest = ReplaceNode(node, ast.Name(CALL, ast.Load())).visit(copy.deepcopy(body[at]))
    later = [s for s in body[at + 1:] if reads(s, names)]
    if later or reads(rest, names):
        where = later[0].lineno if later else body[at].lineno
        return Refusal(f"the attention weights or scores are read after the softmax (line {where}): the fused call "
                       "never materialises them", where)
    return Candidate(body[i].lineno, body[at].end_lineno or body[at].lineno, q, k, values, text(argument), scale,
                     steps, body[j].lineno, dropout, text(rest), text(body[j]))


def values_of(node: ast.AST, weights: str | None) -> str:
    """v of the product `w @ v` (or its einsum)."""
    pair = matmul_of(node)
    return text(pair[1]) if pair else einsum_product(node, weights)


def inline_product(stmt: ast.stmt, scores: str) -> list[tuple[ast.AST, str]]:
    """[(the product, v)] where `stmt` multiplies the softmax of `scores` with the values in one expression."""
    for node in ast.walk(stmt):
        pair = matmul_of(node)
        if pair is not None and softmax_of(pair[0], scores):
            return [(node, text(pair[1]))]
    return []


def dropout_of(call: ast.Call, weights: str) -> tuple[str, str | None] | None:
    """(the dropout_p expression, the `self.<module>` name or None) of `self.drop(w)` or `F.dropout(w, p, ...)`."""
    if not (call.args and is_name(call.args[0], weights)):
        return None
    if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) \
            and call.func.value.id == "self" and len(call.args) == 1 and not call.keywords:
        module = call.func.attr
        return f"self.{module}.p if self.training else 0.0", module
    if text(call.func) in DROPOUT_CALLS:
        given = dict(zip(("p", "training"), (text(a) for a in call.args[1:3])))
        given.update({kw.arg: text(kw.value) for kw in call.keywords if kw.arg in ("p", "training")})
        p, training = given.get("p", "0.5"), given.get("training", "True")
        return (p if training == "True" else f"{p} if {training} else 0.0"), None
    return None


def statements(candidate: Candidate, functional: str, scale: str | None, causal: bool) -> list[str]:
    """The statements that replace the candidate's lines: the statements it keeps (names the rest reads), then
    the product's statement with the fused call in place of `w @ v`. `scale`: the `scale=` expression (None:
    SDPA's default); `causal`: the mask read as causal (`is_causal=True` in place of the mask)."""
    kept = [s.text if s.kind == "keep" else s.hoist for s in candidate.steps if s.kind == "keep" or s.hoist]
    keywords: dict[str, str] = {}
    masks = [s for s in candidate.steps if s.kind == "mask"]
    if causal:
        keywords["is_causal"] = "True"
    elif masks:
        parts = [s.code if not s.guard or s.guard == f"{s.code} is not None" else f"({s.code} if {s.guard} else None)"
                 for s in masks]  # `mask if mask is not None else None` is the mask
        keywords["attn_mask"] = parts[0] if len(parts) == 1 else " & ".join(parts)
    if candidate.dropout is not None:
        keywords["dropout_p"] = candidate.dropout[0]
    if scale is not None:
        keywords["scale"] = scale
    call = f"{functional}.scaled_dot_product_attention({candidate.q}, {candidate.k}, {candidate.v}" + \
        "".join(f", {key}={value}" for key, value in keywords.items()) + ")"
    return kept + [text(ast.parse(candidate.product.replace(CALL, call)))]  # as ast writes it: no extra ()


def scale_code(candidate: Candidate) -> str | None:
    """The scale the source writes (the product's own and any statements'), as one expression; None if none."""
    factors = ([candidate.scale] if candidate.scale else []) + \
        [(s.op, s.code) for s in candidate.steps if s.kind == "scale"]
    if not factors:
        return None
    return " * ".join(code if op == "*" else f"1 / ({code})" for op, code in factors)


class ReplaceNode(ast.NodeTransformer):
    """Puts `new` where `old` was, in a copy of the statement that holds it (found by its position)."""

    def __init__(self, old: ast.AST, new: ast.AST):
        self.key = (old.lineno, old.col_offset, old.end_lineno, old.end_col_offset)
        self.new = new

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if getattr(node, "lineno", None) is not None and \
                (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset) == self.key:
            return self.new
        return super().generic_visit(node)

"""Attention written by hand, found in a module's `forward` source, and the one call that replaces it.
Pure and torch-free (stdlib `ast`): the trial runs the rewrite (`advisor.trials.interposition.attention`),
the patch writes the same statement where the lines were (`advisor.code.patch.attention`, from trial.json).

The form recognised is a run of consecutive statements of the forward's body:

    s = q @ k.transpose(-2, -1) [/ sqrt(d) | * scale]    # or torch.matmul(q, k.transpose(-1, -2)), k.mT
    [s = s / x | s = s * x]                              # the scale on a line of its own
    [s = s.masked_fill(cond, -inf) | s.masked_fill_(cond, -inf)]
    w = softmax(s, dim=-1)                               # F.softmax, torch.softmax, s.softmax(-1)
    [w = self.drop(w) | w = F.dropout(w, p, training)]
    ... w @ v ...                                        # or torch.matmul(w, v), inside any expression

and becomes `... F.scaled_dot_product_attention(q, k, v, ...) ...`: `is_causal=True` where the mask is
causal (a `tril` of ones `== 0`, its negation, a `triu(..., diagonal=1)`, or a registered buffer that the
caller checks holds one), `attn_mask=(cond).logical_not()` for another boolean mask, `dropout_p` from the
dropout (`self.drop.p if self.training else 0.0`), `scale=` where the scale is not 1/sqrt(d) of q or k (1.0
where there is none). A form that reads the weights or scores elsewhere (returns them, keeps them) is refused
with the reason: the fused call never materialises them.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from typing import Callable

MATMUL_CALLS = ("torch.matmul", "torch.bmm")
SOFTMAX_CALLS = ("F.softmax", "torch.softmax", "nn.functional.softmax", "torch.nn.functional.softmax",
                 "functional.softmax")
SQRT_CALLS = ("math.sqrt", "np.sqrt", "numpy.sqrt", "torch.sqrt")
DROPOUT_CALLS = ("F.dropout", "nn.functional.dropout", "torch.nn.functional.dropout", "torch.dropout")


@dataclass(frozen=True)
class Rewrite:
    """The statements `first_line`..`last_line` (of the source given) and the one statement replacing them."""

    first_line: int
    last_line: int
    statement: str
    form: str  # what was recognised, for the trial's record: "causal mask (buffer mask), dropout, 1/sqrt(d)"
    dropout: str | None  # the `self.<name>` dropout module the caller checks is an nn.Dropout


@dataclass(frozen=True)
class Refusal:
    """Attention written by hand that the fused call cannot be proven to compute: why, and where."""

    reason: str
    line: int


def text(node: ast.AST) -> str:
    """The expression as source text."""
    return ast.unparse(node)


def is_name(node: ast.AST, name: str) -> bool:
    """Whether `node` is a load of the plain name `name`."""
    return isinstance(node, ast.Name) and node.id == name


def transposed(node: ast.AST) -> ast.AST | None:
    """`k` of `k.transpose(-2, -1)`, `k.transpose(-1, -2)` or `k.mT`; else None."""
    if isinstance(node, ast.Attribute) and node.attr == "mT":
        return node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "transpose" \
            and len(node.args) == 2 and not node.keywords:
        dims = {text(a) for a in node.args}
        if dims == {"-2", "-1"}:
            return node.func.value
    return None


def matmul_of(node: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """The operands of `a @ b` or `torch.matmul(a, b)`; else None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return node.left, node.right
    if isinstance(node, ast.Call) and text(node.func) in MATMUL_CALLS and len(node.args) == 2 and not node.keywords:
        return node.args[0], node.args[1]
    return None


def scores_of(node: ast.AST) -> tuple[ast.AST, ast.AST, tuple[str, ast.AST] | None] | None:
    """(q, k, (op, factor)) of `q @ k.transpose(-2, -1)`, optionally `/ x` or `* x`; else None."""
    scale = None
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.Mult)) and matmul_of(node.left):
        scale, node = ("/" if isinstance(node.op, ast.Div) else "*", node.right), node.left
    pair = matmul_of(node)
    if pair is None or transposed(pair[1]) is None:
        return None
    return pair[0], transposed(pair[1]), scale


def size_of_last_dim(node: ast.AST, q: ast.AST, k: ast.AST) -> bool:
    """`k.size(-1)`, `q.shape[-1]` (d, the head's width), of q or k."""
    own = {text(q), text(k)}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "size":
        return text(node.func.value) in own and [text(a) for a in node.args] == ["-1"]
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
        return text(node.value.value) in own and text(node.slice) == "-1"
    return False


def is_sqrt_d(node: ast.AST, q: ast.AST, k: ast.AST) -> bool:
    """`math.sqrt(d)` or `d ** 0.5`, d the last dimension of q or k."""
    if isinstance(node, ast.Call) and text(node.func) in SQRT_CALLS and len(node.args) == 1:
        return size_of_last_dim(node.args[0], q, k)
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and text(node.right) == "0.5" \
        and size_of_last_dim(node.left, q, k)


def scale_keyword(scale: tuple[str, ast.AST] | None, q: ast.AST, k: ast.AST) -> str | None:
    """The `scale=` the call needs, None where it is SDPA's default 1/sqrt(d)."""
    if scale is None:
        return "1.0"
    op, factor = scale
    if op == "/" and is_sqrt_d(factor, q, k):
        return None
    if op == "*" and isinstance(factor, ast.BinOp) and isinstance(factor.op, ast.Div) and \
            text(factor.left) in ("1", "1.0") and is_sqrt_d(factor.right, q, k):
        return None
    if op == "*" and isinstance(factor, ast.BinOp) and isinstance(factor.op, ast.Pow) and \
            text(factor.right) == "-0.5" and size_of_last_dim(factor.left, q, k):
        return None
    return text(factor) if op == "*" else f"1 / ({text(factor)})"


def is_minus_infinity(node: ast.AST) -> bool:
    """-inf as people write it (`float('-inf')`, `-math.inf`, `-1e9`, `torch.finfo(x.dtype).min`)."""
    source = text(node).replace('"', "'")
    if source in ("float('-inf')", "-float('inf')", "-math.inf", "-torch.inf", "-np.inf", "-numpy.inf"):
        return True
    if source.startswith("torch.finfo(") and source.endswith(").min"):
        return True
    try:
        return float(ast.literal_eval(node)) <= -1e4
    except (ValueError, TypeError, SyntaxError):
        return False


def buffer_name(node: ast.AST) -> str | None:
    """`name` of `self.name` or `self.name[...]` (a slice of a registered buffer)."""
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute) and is_name(node.value, "self"):
        return node.attr
    return None


def ones_triangle(node: ast.AST, which: str, diagonal: str) -> bool:
    """`torch.tril(torch.ones(...))` (which "tril", diagonal "0") or `torch.triu(torch.ones(...), diagonal=1)`,
    with `.bool()` / `.to(torch.bool)` allowed after it."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("bool", "to") \
            and text(node).endswith((".bool()", ".to(torch.bool)")):
        node = node.func.value
    if not (isinstance(node, ast.Call) and text(node.func) == f"torch.{which}" and node.args):
        return False
    given = [text(a) for a in node.args[1:]] + [text(kw.value) for kw in node.keywords if kw.arg == "diagonal"]
    return text(node.args[0]).startswith("torch.ones(") and (given or ["0"]) == [diagonal]


def mask_keywords(cond: ast.AST, buffer_kind: Callable[[str], str | None]) -> tuple[dict[str, str], str]:
    """The keywords that stand for `masked_fill(cond, -inf)`, and the form's name. `buffer_kind(name)`: "tril"
    where the module's buffer `name` is a lower triangle of ones, "triu" for a strictly upper one, else None."""
    def lower(node: ast.AST) -> bool:  # the positions that take part: causal
        name = buffer_name(node)
        return ones_triangle(node, "tril", "0") or (name is not None and buffer_kind(name) == "tril")

    def upper(node: ast.AST) -> bool:  # the positions masked out: causal
        name = buffer_name(node)
        return ones_triangle(node, "triu", "1") or (name is not None and buffer_kind(name) == "triu")

    name = buffer_name(cond.left if isinstance(cond, ast.Compare) else cond.operand if isinstance(
        cond, ast.UnaryOp) else cond)
    where = f" (buffer {name})" if name else ""
    if isinstance(cond, ast.Compare) and len(cond.ops) == 1 and isinstance(cond.ops[0], ast.Eq) \
            and text(cond.comparators[0]) in ("0", "0.0", "False") and lower(cond.left):
        return {"is_causal": "True"}, f"causal mask{where}"
    if isinstance(cond, ast.UnaryOp) and isinstance(cond.op, (ast.Invert, ast.Not)) and lower(cond.operand):
        return {"is_causal": "True"}, f"causal mask{where}"
    if upper(cond):
        return {"is_causal": "True"}, f"causal mask{where}"
    return {"attn_mask": f"({text(cond)}).logical_not()"}, "boolean mask"


def assigned(stmt: ast.stmt) -> str | None:
    """The single plain name an assignment stores to."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    return None


def reads(node: ast.AST, names: set[str]) -> bool:
    """Whether `node` loads any of `names`."""
    return any(isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load) for n in ast.walk(node))


def find_attention(source: str, buffer_kind: Callable[[str], str | None],
                   functional: str = "F") -> Rewrite | Refusal | None:
    """The rewrite of the first attention written by hand in the body of the function `source` defines (its
    lines numbered from 1), a Refusal where one is there but cannot be replaced, None where there is none.
    `functional`: the name the call is reached by (`F`, `torch.nn.functional`)."""
    function = ast.parse(source).body[0]
    body = function.body if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    for i, stmt in enumerate(body):
        found = assigned(stmt) and scores_of(stmt.value)
        if found:
            chain = attention_chain(body, i, found, buffer_kind, functional)
            if chain is not None:
                return chain
    return None


def attention_chain(body: list[ast.stmt], i: int, scores: tuple, buffer_kind: Callable[[str], str | None],
                    functional: str) -> Rewrite | Refusal | None:
    """The attention that starts with the scores at `body[i]`, if the statements after it complete one."""
    q, k, scale = scores
    current = assigned(body[i])  # the name the chain's latest value is in: the scores, then the weights
    names = {current}
    keywords: dict[str, str] = {}
    form: list[str] = []
    dropout, softmaxed, j = None, False, i + 1
    while j < len(body):
        stmt = body[j]
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.Expr)) else None
        target = assigned(stmt)
        if not softmaxed and target == current and scale is None and isinstance(value, ast.BinOp) \
                and isinstance(value.op, (ast.Div, ast.Mult)) and is_name(value.left, current) \
                and not reads(value.right, names):
            scale = ("/" if isinstance(value.op, ast.Div) else "*", value.right)
        elif not softmaxed and not keywords and isinstance(value, ast.Call) and is_masked_fill(stmt, value, current) \
                and is_minus_infinity(value.args[1]) and not reads(value.args[0], names):
            keywords, kind = mask_keywords(value.args[0], buffer_kind)
            form.append(kind)
        elif not softmaxed and target and isinstance(value, ast.Call) and is_softmax(value, current):
            softmaxed, current = True, target
            names.add(target)
        elif softmaxed and dropout is None and target and isinstance(value, ast.Call) and \
                (drop := dropout_of(value, current)) is not None:
            dropout, current = drop, target
            names.add(target)
        else:
            break
        j += 1
    if not softmaxed and j < len(body) and reads(body[j], names) and \
            any("softmax" in text(later) for later in body[j:]):
        return Refusal(f"line {body[j].lineno} changes the scores otherwise than a scale or a masked_fill with -inf "
                       "before the softmax: the fused call is not proven the same", body[j].lineno)
    if not softmaxed:
        return None
    if j == len(body):
        return Refusal("the attention weights are computed but never multiplied with the values", body[i].lineno)
    weights = current
    product = [n for n in ast.walk(body[j]) if (pair := matmul_of(n)) is not None and is_name(pair[0], weights)]
    if not product:
        return Refusal(f"the attention weights ({weights}) are used otherwise than multiplied with the values "
                       f"(line {body[j].lineno})", body[j].lineno)
    values = matmul_of(product[0])[1]
    later = [s for s in body[j + 1:] if reads(s, names)]
    call_keywords = dict(keywords)
    if dropout is not None:
        call_keywords["dropout_p"] = dropout[0]
        form.append("dropout")
    if (scale_text := scale_keyword(scale, q, k)) is not None:
        call_keywords["scale"] = scale_text
    form.append("1/sqrt(d)" if scale_text is None else f"scale {scale_text}")
    call = ast.parse(f"{functional}.scaled_dot_product_attention({text(q)}, {text(k)}, {text(values)}"
                     + "".join(f", {key}={value}" for key, value in call_keywords.items()) + ")", mode="eval").body
    rest = ReplaceNode(product[0], call).visit(copy.deepcopy(body[j]))
    if later or reads(rest, names):
        where = later[0].lineno if later else body[j].lineno
        return Refusal(f"the attention weights or scores are read after the softmax (line {where}): the fused call "
                       "never materialises them", where)
    return Rewrite(body[i].lineno, body[j].end_lineno or body[j].lineno, text(rest), ", ".join(form),
                   dropout[1] if dropout is not None else None)


def is_softmax(call: ast.Call, scores: str) -> bool:
    """`F.softmax(scores, dim=-1)`, `torch.softmax(scores, -1)` or `scores.softmax(dim=-1)`."""
    if text(call.func) in SOFTMAX_CALLS and call.args and is_name(call.args[0], scores):
        positional = call.args[1:]
    elif isinstance(call.func, ast.Attribute) and call.func.attr == "softmax" and is_name(call.func.value, scores):
        positional = call.args
    else:
        return False
    dims = [text(a) for a in positional] + [text(kw.value) for kw in call.keywords if kw.arg == "dim"]
    return dims == ["-1"] and all(kw.arg == "dim" for kw in call.keywords)  # no dtype: the weights' own


def is_masked_fill(stmt: ast.stmt, call: ast.Call, scores: str) -> bool:
    """`s = s.masked_fill(cond, x)` or `s.masked_fill_(cond, x)` on the scores `s`."""
    if not (isinstance(call.func, ast.Attribute) and is_name(call.func.value, scores) and len(call.args) == 2
            and not call.keywords):
        return False
    if call.func.attr == "masked_fill":
        return assigned(stmt) == scores
    return call.func.attr == "masked_fill_" and isinstance(stmt, ast.Expr)


def dropout_of(call: ast.Call, weights: str) -> tuple[str, str | None] | None:
    """(the dropout_p expression, the `self.<module>` name or None) of `self.drop(w)` or `F.dropout(w, p, ...)`."""
    if not (call.args and is_name(call.args[0], weights)):
        return None
    if isinstance(call.func, ast.Attribute) and is_name(call.func.value, "self") and len(call.args) == 1 \
            and not call.keywords:
        module = call.func.attr
        return f"self.{module}.p if self.training else 0.0", module
    if text(call.func) in DROPOUT_CALLS:
        given = dict(zip(("p", "training"), (text(a) for a in call.args[1:3])))
        given.update({kw.arg: text(kw.value) for kw in call.keywords if kw.arg in ("p", "training")})
        p, training = given.get("p", "0.5"), given.get("training", "True")
        return (p if training == "True" else f"{p} if {training} else 0.0"), None
    return None


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

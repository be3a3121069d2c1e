"""Small questions and edits on libcst nodes: literals, dotted names, a call's arguments, where the imports
end. Every edit keeps the user's formatting: commas, spacing and comments survive."""

from __future__ import annotations

import json
from typing import Any

import libcst as cst

NO_SPACE = cst.SimpleWhitespace("")
TIGHT_EQUAL = cst.AssignEqual(whitespace_before=NO_SPACE, whitespace_after=NO_SPACE)


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
    """A literal expression for an int, bool, None or str (a framework's option: "bf16-mixed")."""
    if value is None or isinstance(value, bool):
        return cst.Name(repr(value))
    if isinstance(value, str):
        return cst.SimpleString(json.dumps(value))
    return cst.Integer(str(int(value)))


def dotted(node: cst.CSTNode) -> str | None:
    """`a.b.c` for a chain of names and attributes only (None for anything else, e.g. `f().x`)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr.value}"
    return None


def keyword_arg(call: cst.Call, name: str) -> cst.Arg | None:
    """The `name=` argument of a call, if any."""
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def replace_arg(call: cst.Call, arg: cst.Arg, value: cst.BaseExpression) -> cst.Call:
    """The call with one argument's value replaced (its keyword, comma and spacing kept)."""
    return call.with_changes(args=[a.with_changes(value=value) if a is arg else a for a in call.args])


def drop_keywords(call: cst.Call, names: list[str]) -> cst.Call:
    """The call without the named keyword arguments (commas kept tidy)."""
    kept = [a for a in call.args if not (a.keyword is not None and a.keyword.value in names)]
    if len(kept) == len(call.args):
        return call
    if kept and kept[-1].comma is not cst.MaybeSentinel.DEFAULT:
        last_original = call.args[-1]
        kept[-1] = kept[-1].with_changes(comma=last_original.comma)
    return call.with_changes(args=kept)


def double_star(call: cst.Call) -> cst.Arg | None:
    """The last `**mapping` argument of a call, if any."""
    return next((a for a in reversed(call.args) if a.star == "**"), None)


def put_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """Set `name=value`: replace an existing keyword, or append it after the last argument."""
    existing = keyword_arg(call, name)
    if existing is not None:
        return replace_arg(call, existing, value)
    mapping = double_star(call)
    if mapping is not None:
        # The mapping may hold `name` already: a keyword beside it could be passed twice. Merging
        # (`**{**options, "name": value}`) is right either way.
        merged = cst.Dict([cst.StarredDictElement(mapping.value), cst.DictElement(cst.SimpleString(f'"{name}"'), value)])
        if isinstance(mapping.value, cst.Dict) and mapping.value.elements and isinstance(
                mapping.value.elements[0], cst.StarredDictElement):
            merged = mapping.value.with_changes(elements=[*mapping.value.elements, merged.elements[1]])
        return replace_arg(call, mapping, merged)
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


def is_docstring(statement: cst.BaseStatement) -> bool:
    """A statement that is only a string (a module's or function's docstring when first)."""
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def after_imports(body: list[cst.BaseStatement]) -> int:
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
    if index == 0 and body and is_docstring(body[0]):
        index = 1
    return index


class BlockRewrite(cst.CSTTransformer):
    """Rewrites the statement list of every block (the module's body, each indented block) with `statements`."""

    def statements(self, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """The block's new statements."""
        raise NotImplementedError

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self.statements(list(updated_node.body)))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self.statements(list(updated_node.body)))

"""The DataLoader knobs written where their values are set: in the call, a module constant, an argparse
default, or (through `advisor.code.settings`) a config in another file of the repository."""

from __future__ import annotations

from typing import Any

import libcst as cst
from libcst.metadata import PositionProvider

from advisor.code.patch.facts import NOT_LITERAL, ScriptFacts, argparse_dest
from advisor.code.syntax import double_star, dotted, drop_keywords, keyword_arg, literal_node, literal_value, \
    put_keyword, replace_arg
from advisor.code.settings import Elsewhere
from advisor.knobs import DATALOADER_KNOBS, NEEDS_WORKERS, WORKER_COUNT, written_at
from advisor.knobs.knob import IN_LOADER
from advisor.trials.knobs import Knobs

DATALOADER_NAMES = ("DataLoader",)
# Positions in DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
# pin_memory, ...): each knob's (`Written.position`; prefetch_factor and persistent_workers are keyword-only), and
# batch_sampler's, which leaves the batch size out.
DATALOADER_POSITIONS = {**{k.name: k.written.position for k in written_at(IN_LOADER) if k.written.position is not None},
                        "batch_sampler": 4}
MAX_LINE = 100  # where added DataLoader arguments wrap onto a new line


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
    rewrite = LoaderRewrite(facts, changes, user_values, line=line, elsewhere=elsewhere)
    module = cst.MetadataWrapper(module, unsafe_skip_copy=True).visit(rewrite)
    if rewrite.constant_changes:
        module = module.with_changes(body=[set_constants(s, rewrite.constant_changes) for s in module.body])
    if rewrite.argparse_changes:
        module = module.visit(ArgparseRewrite(rewrite.argparse_changes))
    return module


def set_constants(statement: cst.BaseStatement, changes: dict[str, Any]) -> cst.BaseStatement:
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


class ArgparseRewrite(cst.CSTTransformer):
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
        new = self.changes[dest]
        keywords = {a.keyword.value: a for a in updated_node.args if a.keyword is not None}
        old = literal_value(keywords["default"].value) if "default" in keywords else (False, None)
        written = {"default": literal_node(new)}
        if "help" in keywords:
            written["help"] = _help_with_default(keywords["help"].value, old, new)
        args = [a.with_changes(value=written[a.keyword.value]) if a.keyword is not None and a.keyword.value in written
                else a for a in updated_node.args]
        return updated_node.with_changes(args=args)


def _help_with_default(help_text: cst.BaseExpression, old: tuple[bool, Any], new: Any) -> cst.BaseExpression:
    """A flag's help string that states its default in words (MNIST's "input batch size for training (default:
    64)") with the new one; as it was where it states none, or builds it (`%(default)s` follows by itself)."""
    if not old[0] or not isinstance(help_text, cst.SimpleString):
        return help_text
    text = help_text.value
    for said in (f"default: {old[1]!s}", f"default {old[1]!s}", f"default={old[1]!s}"):
        at = text.find(said)
        end = at + len(said)
        if at >= 0 and not (end < len(text) and (text[end].isalnum() or text[end] == ".")):  # 64, not 640
            return help_text.with_changes(value=text[:at] + said.replace(str(old[1]), str(new)) + text[end:])
    return help_text


class LoaderRewrite(cst.CSTTransformer):
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
        return self._wrapped(original_node, updated_node, self._knobs_into(updated_node))

    def _wrapped(self, original_node: cst.Call, updated_node: cst.Call, call: cst.Call) -> cst.Call:
        """`call` (the rewrite of `updated_node`) with added arguments wrapped onto continuation lines
        aligned after the opening parenthesis."""
        opening = self.get_metadata(PositionProvider, original_node.func).end
        start = self.get_metadata(PositionProvider, original_node).start.column
        return _wrap_added(call, updated_node, self.facts.module, paren_column=opening.column, start_column=start)

    def _knobs_into(self, call: cst.Call) -> cst.Call:
        """The call with the knobs' values (planning constant and argparse changes on the way)."""
        for knob in written_at(IN_LOADER):  # those DataLoader takes with or without workers, in the registry's order
            excluded = _find_arg(call, knob.written.excluded_by) if knob.written.excluded_by else None
            if knob.name in self.changes and not knob.needs_workers and \
                    (excluded is None or literal_value(excluded.value) == (True, None)):  # not with a batch_sampler
                call = self._set(call, knob.name, self.changes[knob.name])
        workers_node = self._workers(call)
        workers = self._static_value(workers_node)  # None: known only at run time
        if workers == 0:
            # DataLoader rejects these without worker processes (the user's values were valid for
            # their own worker count, so fewer workers means dropping them; False / None may stay).
            harmless = {knob.name: (True, knob.without_workers) for knob in NEEDS_WORKERS}
            return drop_keywords(call, [a.keyword.value for a in call.args if a.keyword is not None
                                         and a.keyword.value in harmless
                                         and literal_value(a.value) != harmless[a.keyword.value]])
        for knob in NEEDS_WORKERS:  # persistent_workers, prefetch_factor
            if knob.name not in self.changes:
                continue
            value = self.changes[knob.name]
            if workers is None and value != knob.without_workers:
                # Workers known only at run time: `persistent_workers=args.num_workers > 0`,
                # `prefetch_factor=4 if args.num_workers > 0 else None`.
                expr = _workers_check(workers_node) if value is True and knob.without_workers is False else \
                    cst.IfExp(test=_workers_check(workers_node), body=literal_node(value),
                              orelse=literal_node(knob.without_workers))
                call = put_keyword(call, knob.name, expr)
            else:
                call = self._set(call, knob.name, value)
        return call

    def _workers(self, call: cst.Call) -> cst.BaseExpression:
        """The expression that gives the call's worker count."""
        found = _find_arg(call, WORKER_COUNT)
        if found is not None:
            return found.value
        mapping = double_star(call)
        if mapping is None:
            return cst.Integer("0")
        if WORKER_COUNT in self.changes:
            return literal_node(self.changes[WORKER_COUNT])
        # `DataLoader(..., **options)`: the count is in the user's mapping, or the default 0.
        options = mapping.value
        if isinstance(options, cst.Dict) and options.elements and isinstance(options.elements[0], cst.StarredDictElement):
            options = options.elements[0].value  # already merged into `{**options, ...}` above
        return cst.parse_expression(f'x.get("{WORKER_COUNT}", 0)').with_changes(
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
            # `DataLoader(data, **kwargs)` with `kwargs = {"batch_size": args.batch_size, ...}`: where the entry's
            # value is set (an argparse default, a constant), as if it were the call's own argument.
            mapping = double_star(call)
            entry = (self.facts.mapping_entry(mapping.value.value, name)
                     if mapping is not None and isinstance(mapping.value, cst.Name) else None)
            if entry is not None and self._at_definition(name, entry, value):
                return call
            return put_keyword(call, name, literal_node(value))
        ok, current = literal_value(arg.value)
        if ok:
            if current == value and type(current) is type(value):
                return call
            return replace_arg(call, arg, literal_node(value))
        if self._at_definition(name, arg.value, value):
            return call
        user = self.user_values.get(name, NOT_LITERAL)
        if self.elsewhere is not None and isinstance(arg.value, (cst.Attribute, cst.Name)) and user is not NOT_LITERAL:
            key = arg.value.attr.value if isinstance(arg.value, cst.Attribute) else arg.value.value
            if self.elsewhere.set(key, user, value, parameters=isinstance(arg.value, cst.Name)):
                return call
        self.comment_frames[-1].append(f"was {name}={self.facts.module.code_for_node(arg.value)}")
        return replace_arg(call, arg, literal_node(value))

    def _at_definition(self, name: str, expression: cst.BaseExpression, value: Any) -> bool:
        """Plan `value` where `expression` (the argument's) is defined, if this file defines it: a module constant or
        an argparse default that is what ran; or, for a flag the command line set, a note to change the command.
        Whether it did."""
        user = self.user_values.get(name, NOT_LITERAL)
        if isinstance(expression, cst.Name):
            ok, current = self.facts.constant(expression.value)
            if ok and (user is NOT_LITERAL or current == user):
                self.constant_changes[expression.value] = value
                return True
        if isinstance(expression, cst.Attribute) and isinstance(expression.value, cst.Name):
            ok, current = self.facts.argparse_default(expression.attr.value)
            if ok and (user is NOT_LITERAL or current == user):
                self.argparse_changes[expression.attr.value] = value
                return True
            if ok and self.elsewhere is not None:
                # A flag whose default is not what ran: the command line set it. Writing a literal over
                # it would silently disable the flag; the command is what to change.
                flag = expression.attr.value
                self.elsewhere.notes.append(f"{name} comes from the command line (--{flag} {user!r} overrode its "
                                            f"default): run with --{flag} {value!r}")
                return True
        return False


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

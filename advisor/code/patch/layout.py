"""The patched lines within the file's own width, shaped as its formatter would leave them: the width is the
project's `line-length` (ruff's or black's in pyproject.toml, ruff.toml, flake8's `max-line-length` in
setup.cfg), the formatters' 88 where one is configured without it, else 100. A line the patch made too long
has its trailing comment moved above it, then its call (or the tuple it assigns) split one element a line
with a trailing comma, the form black and ruff's formatter keep as it is; a statement put right after the
imports gets the blank line black wants there. The user's own lines are left alone, however long. Where the
project configures black and black is installed, black then formats the changed lines (`--line-ranges`)."""

from __future__ import annotations

import configparser
import difflib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

DEFAULT_WIDTH = 100  # no configured width: the issue's choice, a little over the formatters' 88
FORMATTER_WIDTH = 88  # black's and ruff's default


def line_width(path: Path, root: Path) -> int:
    """The line length configured for `path`: the nearest folder from its own up to `root` that configures one."""
    return next((w for w in map(_configured, _folders(path, root)) if w is not None), DEFAULT_WIDTH)


def _folders(path: Path, root: Path) -> list[Path]:
    """`path`'s folder and those above it, up to `root` (only its own when it is not inside `root`)."""
    folder, root = Path(path).resolve().parent, Path(root).resolve()
    return [folder, *[f for f in folder.parents if f == root or root in f.parents]]


def _configured(folder: Path) -> int | None:
    """The line length the folder's own configuration sets, if it has one."""
    for name in ("ruff.toml", ".ruff.toml"):
        if (folder / name).is_file():
            return _length(_toml(folder / name), FORMATTER_WIDTH)
    tool = _toml(folder / "pyproject.toml").get("tool", {})
    if tool:
        for section in ("ruff", "black"):
            if section in tool:
                return _length(tool[section], FORMATTER_WIDTH)
    if (folder / "setup.cfg").is_file():
        parser = configparser.ConfigParser()
        try:
            parser.read(folder / "setup.cfg")
        except configparser.Error:
            return None
        for section in ("flake8", "pycodestyle", "pep8"):
            value = parser.get(section, "max-line-length", fallback=None) or parser.get(
                section, "max_line_length", fallback=None)
            if value is not None and value.strip().isdigit():
                return int(value)
    return None


def _toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10: no TOML reader in the standard library; the default width stands
        return {}
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}


def _length(section: dict, default: int) -> int:
    value = section.get("line-length", section.get("line_length"))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def formatted(text: str, original: str, path: Path, root: Path) -> str:
    """The patched text with its changed lines formatted by black where the project configures black (its
    `[tool.black]`) and black is installed: black's own layout of a statement the patch changed (a shorter
    expression in a statement black had split) is black's alone to know. Else, or if black fails, `text`."""
    config = next((f / "pyproject.toml" for f in _folders(path, root)
                   if "black" in _toml(f / "pyproject.toml").get("tool", {})), None)
    black = shutil.which("black", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if config is None or black is None:
        return text
    changed = [f"--line-ranges={j1 + 1}-{j2}" for op, _, _, j1, j2 in difflib.SequenceMatcher(
        None, original.splitlines(), text.splitlines(), autojunk=False).get_opcodes() if op in ("replace", "insert")]
    if not changed:
        return text
    try:
        done = subprocess.run([black, "-q", "--config", str(config), *changed, "-"], input=text, text=True,
                              capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return text
    return done.stdout if done.returncode == 0 and done.stdout else text


def fit(module: cst.Module, original: str, width: int) -> cst.Module:
    """`module` with each statement the patch made longer than `width` reshaped (see the module's text), and
    a blank line between the imports and a statement the patch put right after them."""
    module = _blank_after_imports(module, original)
    kept = {_bare(line) for line in original.split("\n")}
    lines = [line.rstrip("\r") for line in module.code.split("\n")]
    long = {n for n, line in enumerate(lines, 1) if len(line) > width and _bare(line) not in kept}
    if not long:
        return module
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    return wrapper.visit(_Fit(wrapper.resolve(PositionProvider), long, width, module.default_indent))


def _bare(line: str) -> str:
    """A line as the user wrote it, less the comma or parenthesis a patch may add after its last argument
    (a keyword of its own on the next line): that user's line is left as it was, however long."""
    return line.rstrip().rstrip(",)").rstrip()


def _blank_after_imports(module: cst.Module, original: str) -> cst.Module:
    body = list(module.body)
    for i in range(1, len(body)):
        statement = body[i]
        if _is_import(body[i - 1]) and not _is_import(statement) and not statement.leading_lines \
                and module.code_for_node(statement).strip() not in original:
            body[i] = statement.with_changes(leading_lines=[cst.EmptyLine()])
    return module.with_changes(body=body)


def _is_import(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body)


class _Fit(cst.CSTTransformer):
    def __init__(self, positions, long: set[int], width: int, indent: str):
        super().__init__()
        self.positions, self.long, self.width, self.unit = positions, long, width, indent
        self.depth = 0

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.depth += 1

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock):
        self.depth -= 1
        return updated_node

    def _too_long(self, node: cst.CSTNode, header_only: bool = False) -> bool:
        where = self.positions.get(node)
        if where is None:
            return False
        last = where.start.line if header_only else where.end.line
        return any(n in self.long for n in range(where.start.line, last + 1))

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        if not self._too_long(original_node):
            return updated_node
        node = self._comment_above(updated_node, updated_node.trailing_whitespace)
        if len(node.body) == 1 and self._still_long(original_node, node):
            node = node.with_changes(body=[_split(node.body[0], self.depth, self.unit)])
        return node

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        """A compound statement's header (`if ...:  # comment`): its comment above it."""
        if isinstance(updated_node, cst.BaseCompoundStatement) and isinstance(updated_node.body, cst.IndentedBlock) \
                and updated_node.body.header.comment is not None and self._too_long(original_node, header_only=True):
            header = updated_node.body.header
            moved = self._comment_above(updated_node, header)
            return moved.with_changes(body=moved.body.with_changes(header=cst.TrailingWhitespace()))
        return super().on_leave(original_node, updated_node)

    def _comment_above(self, node, trailing: cst.TrailingWhitespace):
        """The statement with its trailing comment as comment lines above it (wrapped to the width)."""
        if trailing.comment is None:
            return node
        indent = self.unit * self.depth
        text = trailing.comment.value.lstrip("#").strip()
        above = [cst.EmptyLine(comment=cst.Comment(f"# {part}"))
                 for part in textwrap.wrap(text, max(self.width - len(indent) - 2, 20))]
        node = node.with_changes(leading_lines=[*node.leading_lines, *above])
        if isinstance(node, cst.SimpleStatementLine):
            node = node.with_changes(trailing_whitespace=cst.TrailingWhitespace())
        return node

    def _still_long(self, original: cst.SimpleStatementLine, node: cst.SimpleStatementLine) -> bool:
        code = cst.Module([]).code_for_node(node.with_changes(leading_lines=[]))
        indent = len(self.unit) * self.depth
        return any(indent + len(line) > self.width for line in code.splitlines()) or (
            "\n" in code.strip() and self._too_long(original))


def _split(statement: cst.BaseSmallStatement, depth: int, unit: str) -> cst.BaseSmallStatement:
    """The statement's value split one element a line: a tuple it assigns (in parentheses), else its
    outermost call with the longest arguments, else the whole value in parentheses on a line of its own."""
    value = getattr(statement, "value", None)
    if value is None:
        return statement
    inner = cst.ParenthesizedWhitespace(cst.TrailingWhitespace(), indent=True, last_line=cst.SimpleWhitespace(unit))
    outer = cst.ParenthesizedWhitespace(cst.TrailingWhitespace(), indent=True, last_line=cst.SimpleWhitespace(""))
    if isinstance(value, cst.Tuple) and not value.lpar and value.elements:
        elements = [e.with_changes(comma=cst.Comma(whitespace_after=inner if i < len(value.elements) - 1 else
                                                   cst.SimpleWhitespace("")))
                    for i, e in enumerate(value.elements)]
        return statement.with_changes(value=value.with_changes(
            elements=elements, lpar=[cst.LeftParen(whitespace_after=inner)],
            rpar=[cst.RightParen(whitespace_before=outer)]))
    call = _widest_call(value)
    if call is None:  # an expression without a call to split: in parentheses, on a line of its own
        return statement.with_changes(value=value.with_changes(lpar=[cst.LeftParen(whitespace_after=inner)],
                                                               rpar=[cst.RightParen(whitespace_before=outer)]))
    args = [a.with_changes(comma=cst.Comma(whitespace_after=inner if i < len(call.args) - 1 else outer),
                           whitespace_after_arg=cst.SimpleWhitespace(""))
            for i, a in enumerate(call.args)]
    new = call.with_changes(args=args, whitespace_before_args=inner)
    return statement.with_changes(value=value.deep_replace(call, new))


def _widest_call(value: cst.BaseExpression) -> cst.Call | None:
    """Of the calls along the expression's spine (`a.f(...).g(...)`, not those inside arguments), the one
    whose arguments are longest; None without arguments to split."""
    calls, node = [], value
    while isinstance(node, (cst.Call, cst.Attribute, cst.Subscript)):
        if isinstance(node, cst.Call):
            calls.append(node)
            node = node.func
        else:
            node = node.value
    calls = [c for c in calls if c.args]
    code = cst.Module([]).code_for_node
    return max(calls, key=lambda c: sum(len(code(a)) for a in c.args), default=None)

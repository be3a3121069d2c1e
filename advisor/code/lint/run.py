"""Running the rules: on source text, a file (read as Python reads it), or the files under folders; and the
`# advisor: ignore[...]` comments that silence a finding."""

from __future__ import annotations

import ast
import copy
import io
import os
import re
import stat
import tokenize
from functools import lru_cache
from pathlib import Path

from advisor.code.lint.lint_findings import LintError, LintFinding
from advisor.code.lint.rules import RULES
from advisor.code.lint.script import Script
from advisor.files import NotARegularFile, describe_os_error, file_stamps, is_regular, read_regular

_IGNORE = re.compile(r"#\s*advisor:\s*ignore(?:\[([^\]]*)\])?")


def _ignored_lines(source: str) -> dict[int, set[str] | None]:
    """Lines with `# advisor: ignore[...]` comments: line → rule ids (None means every rule)."""
    ignored: dict[int, set[str] | None] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT and (match := _IGNORE.search(token.string)):
                rules = match.group(1)
                ignored[token.start[0]] = (
                    None if rules is None else {r.strip() for r in rules.split(",") if r.strip()}
                )
    except (tokenize.TokenError, SyntaxError):
        pass
    return ignored


def lint_tree(tree: ast.Module, source: str, filename: str) -> list[LintFinding]:
    """Run every rule on an already parsed script; LintError if it is too deeply nested to walk."""
    try:
        return _lint_tree(tree, source, filename)
    except RecursionError:  # a tree Python could parse but not walk back recursively (a very long expression)
        raise LintError(filename, "an expression is nested too deeply (or is too long) to check") from None


def _lint_tree(tree: ast.Module, source: str, filename: str) -> list[LintFinding]:
    script = Script(tree, source, filename)
    ignored = _ignored_lines(source)
    findings: set[LintFinding] = set()
    for rule in RULES.values():
        for node, what, fix in rule.check(script):
            line = getattr(node, "lineno", 1)
            skip = ignored.get(line, set())
            if skip is None or rule.id in skip:
                continue
            findings.add(
                LintFinding(
                    file=filename,
                    line=line,
                    col=getattr(node, "col_offset", 0) + 1,
                    rule=rule.id,
                    title=rule.title,
                    what=what,
                    why=rule.why,
                    fix=fix,
                )
            )
    return sorted(findings, key=lambda f: (f.file, f.line, f.col, f.rule))


def parse_source(source: str, filename: str) -> ast.Module:
    """The syntax tree of a script; LintError (`file:line:col: syntax error: ...`) if it is not Python."""
    try:
        return ast.parse(source, filename=filename)
    except SyntaxError as exc:
        where = filename
        if exc.lineno is not None:
            where = f"{filename}:{exc.lineno}" + (f":{exc.offset}" if exc.offset else "")
        raise LintError(where, f"syntax error: {exc.msg}") from None
    except ValueError as exc:  # null bytes, on Pythons that report them this way
        raise LintError(filename, f"not Python source: {exc}") from None
    except (RecursionError, MemoryError):  # Python's own parser gives up on very deeply nested expressions
        raise LintError(filename, "an expression is nested too deeply (or is too long) to check") from None


def lint_source(source: str, filename: str = "<string>") -> list[LintFinding]:
    """Lint Python source text; raises LintError if it is not valid Python."""
    return lint_tree(parse_source(source, filename), source, filename)


def read_source(path: str | Path) -> str:
    """The text of a Python file, decoded as Python does (PEP 263 coding line); LintError if unreadable.
    Only a regular file is read: a FIFO or a device is refused, not waited on."""
    path = Path(path)
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            raise LintError(path, "is a directory, not a Python file")
        data = read_regular(path)
    except FileNotFoundError:
        raise LintError(path, "no such file") from None
    except NotARegularFile:
        raise LintError(path, "not a regular file (a FIFO, socket or device)") from None
    except OSError as exc:
        raise LintError(path, f"cannot read: {describe_os_error(exc)}") from None
    except ValueError as exc:  # a NUL in the name
        raise LintError(path, f"not a usable path ({exc})") from None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        raise LintError(path, "cannot decode: not UTF-8 and no valid `# coding:` line") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as Python reads source


def lint_file(path: str | Path) -> list[LintFinding]:
    """Lint one Python file; raises LintError if it is missing, unreadable or not valid Python."""
    return lint_source(read_source(path), str(path))


def script_findings(script: Path) -> list[dict] | None:
    """Findings on the script a trial names, as JSON-ready dicts (they can name the line behind a leak);
    None if it is not a regular .py file or cannot be linted (the path comes from trial.json: nothing else
    is opened)."""
    if not script.name.endswith(".py") or not is_regular(script):
        return None
    found = _script_findings(Path(os.path.abspath(script)), file_stamps([script]))
    return None if found is None else copy.deepcopy(found)


# A session diagnoses every trial's trace, and each trace's record names the same script: it is linted once
# while the file stays as it was (its stamp: a script edited meanwhile is linted again).
@lru_cache(maxsize=16)
def _script_findings(script: Path, _stamps: tuple) -> list[dict] | None:
    try:
        return [f.to_dict() for f in lint_file(script)]
    except LintError:
        return None


SKIPPED_FOLDERS = {"venv", "site-packages", "__pycache__", "node_modules", "build", "dist"}


def expand_paths(paths: list[str]) -> list[Path]:
    """Files to lint: each file as given, each folder as its `*.py` files (sorted, recursive; hidden
    folders, virtual environments and build output left out)."""
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*.py")
                if not any(part.startswith(".") or part in SKIPPED_FOLDERS for part in p.relative_to(path).parts)
            )
            if not found:
                raise LintError(path, "folder has no .py files")
            files.extend(found)
        else:
            files.append(path)
    return files

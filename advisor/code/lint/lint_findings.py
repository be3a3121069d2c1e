"""What linting finds (`LintFinding`), and the error for a file it cannot read."""

from __future__ import annotations

import dataclasses

from advisor.errors import AdvisorError


class LintError(AdvisorError):
    """A file that cannot be linted: missing, unreadable, not Python."""

    def __init__(self, path: object, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


@dataclasses.dataclass(frozen=True)
class LintFinding:
    """One mistake found in a script: where, which rule, what, why, and the fix."""

    file: str
    line: int
    col: int
    rule: str
    title: str
    what: str
    why: str
    fix: str

    def to_dict(self) -> dict[str, object]:
        """The finding as a JSON-ready dict (the documented `--json` shape)."""
        return dataclasses.asdict(self)

    def location(self) -> str:
        """`file:line:col`, the form editors and terminals make clickable."""
        return f"{self.file}:{self.line}:{self.col}"

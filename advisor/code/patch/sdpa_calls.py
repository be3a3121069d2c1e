"""The `sdpa` knob written where the attention is: in each module class's `forward`, the statements the trial
replaced (trial.json `attention_plan`: file, class, first and last line, the statement) become that one
`F.scaled_dot_product_attention` call (after the statements it keeps, that make names the call reads). The
trial located the attention in the source and checked the call by numbers on the real batch
(`advisor.trials.interposition.attention_check`); here the statements are found again by their lines, and
only where they still span exactly those lines (a file edited since is left alone, with a note)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider


class AttentionLines(cst.CSTTransformer):
    """In `class_name.forward`, the statements on lines first..last replaced by `statement`."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, class_name: str, first: int, last: int, statement: str):
        super().__init__()
        self.class_name, self.first, self.last = class_name, first, last
        self.statements = list(cst.parse_module(statement + "\n").body)  # the names it keeps, then the call
        self.classes: list[str] = []
        self.replaced = False

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node.name.value)

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.classes.pop()
        return updated

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if original.name.value != "forward" or self.classes[-1:] != [self.class_name] or self.replaced:
            return updated
        body = list(updated.body.body)
        lines = [self.get_metadata(PositionProvider, s) for s in original.body.body]
        inside = [i for i, p in enumerate(lines) if p.start.line >= self.first and p.end.line <= self.last]
        if not inside or lines[inside[0]].start.line != self.first or lines[inside[-1]].end.line != self.last \
                or inside != list(range(inside[0], inside[-1] + 1)):
            return updated
        leading = body[inside[0]].leading_lines  # the comments and blank lines above the first line stay
        body[inside[0]: inside[-1] + 1] = [self.statements[0].with_changes(leading_lines=leading),
                                           *self.statements[1:]]
        self.replaced = True
        return updated.with_changes(body=updated.body.with_changes(body=body))


def write_attention(edited: dict, module_of: Callable[[Path], cst.Module], plans: list[dict]) -> list[str]:
    """Each planned attention replaced in `edited` (path → module); notes for those not found as recorded."""
    notes = []
    for plan in plans:
        path = Path(plan["file"]).resolve()
        if not path.is_file():
            notes.append(f"sdpa is not written: {path} is not there; in {plan['class']}.forward write "
                         f"{plan['statement']}")
            continue
        rewrite = AttentionLines(plan["class"], int(plan["first_line"]), int(plan["last_line"]), plan["statement"])
        module = MetadataWrapper(edited.get(path) or module_of(path)).visit(rewrite)
        if not rewrite.replaced:
            notes.append(f"sdpa is not written: {path.name} lines {plan['first_line']}-{plan['last_line']} are no "
                         f"longer the attention of {plan['class']}.forward; write {plan['statement']} there")
            continue
        edited[path] = module
    return notes

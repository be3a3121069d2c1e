"""What the patch writes of each knob, read from the registry: each knob's `Written` (`advisor.knobs.knob`) says
where; this module picks the knobs a patch changes and writes the lines a knob declares after the imports."""

from __future__ import annotations

from typing import Any

import libcst as cst

from advisor.code.patch.facts import ScriptFacts
from advisor.code.syntax import after_imports
from advisor.knobs import BY_NAME, FLAG, KNOBS, written_at
from advisor.trials.knobs import Knobs


def to_write(knobs: Knobs, user_values: dict, *places: str) -> dict[str, Any]:
    """The knobs written at these places (all, where none is named), by name, in the registry's order: turned, and
    not to what the script holds already; a flag the script turns on in its own way (a precision it names) is on."""
    out = {}
    for knob in written_at(*places) if places else KNOBS:
        value, own = getattr(knobs, knob.name), user_values.get(knob.name)
        if value and ((not own) if knob.kind == FLAG else value != own):
            out[knob.name] = value
    return out


def add_after_imports(module: cst.Module, values: dict[str, Any]) -> cst.Module:
    """The lines each knob of `values` declares (`Written.lines`, its value in them) right after the imports,
    with `import torch` where the script has none."""
    text = "".join(line.format(value=value) + "\n" for name, value in values.items()
                   for line in BY_NAME[name].written.lines)
    if not text:
        return module
    body = list(module.body)
    index = after_imports(body)
    lines = [] if ScriptFacts.collect(module).torch_bound else [cst.parse_statement("import torch")]
    lines += cst.parse_module(text).body
    return module.with_changes(body=[*body[:index], *lines, *body[index:]])

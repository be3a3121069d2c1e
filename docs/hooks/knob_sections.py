"""mkdocs hook: the knobs' sections, one per module of the registry (advisor/knobs/), in its order.

A page holding the line `<!-- advisor-knobs -->` gets, in its place, a `::: advisor.knobs.NAME` directive for
each knob, which mkdocstrings renders from the knob module's docstring. A new knob's module is on the page
without the page being edited.
"""

from __future__ import annotations

MARKER = "<!-- advisor-knobs -->"
OPTIONS = ("    options:", "      show_root_full_path: false", "      members: false")


def knob_directives() -> str:
    """The mkdocstrings directives of every registered knob, as markdown."""
    from advisor.knobs import NAMES

    return "\n".join(line for name in NAMES for line in (f"::: advisor.knobs.{name}", *OPTIONS, ""))


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Put the knobs' sections where a page asks for them."""
    return markdown.replace(MARKER, knob_directives()) if MARKER in markdown else markdown

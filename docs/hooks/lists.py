"""mkdocs hook: a list written right after a paragraph line, with no blank line between, fails the build.

Python-Markdown (which mkdocs uses) does not let a list interrupt a paragraph: the items render as one
paragraph that starts "- ". GitHub's renderer shows them as a list, so nothing looks wrong in a review. The
build warns (and --strict fails) naming the page and the line; tests/test_docs.py checks every page too.
"""

from __future__ import annotations

import logging
import re

ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+\S")
FENCE = re.compile(r"^\s*(```|~~~)")
NOT_PARAGRAPH = re.compile(r"^\s*(?:#|\||<|!!!|\?\?\?|>|\[\^|-{3,}\s*$|={3,}\s*$)")

log = logging.getLogger("mkdocs.hooks.lists")


def lists_after_paragraphs(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each list item that starts a list right after a paragraph line."""
    found: list[tuple[int, str]] = []
    fenced, directive, in_list, previous = False, False, False, ""
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced, previous = not fenced, ""
            continue
        if fenced:
            continue
        if line.startswith(":::"):  # mkdocstrings' directive: its indented options are YAML, not Markdown
            directive = True
            continue
        if directive and (not line.strip() or line.startswith((" ", "\t"))):
            continue
        directive = False
        blank = not line.strip()
        if ITEM.match(line):
            if not in_list and previous.strip() and not NOT_PARAGRAPH.match(previous):
                found.append((number, line.strip()))
            in_list = True
        elif not blank and (NOT_PARAGRAPH.match(line) or (not previous.strip() and not line.startswith((" ", "\t")))):
            in_list = False  # a heading, a table, or a paragraph after a blank line ends the list
        previous = line
    return found


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    """Warn (a failure under --strict) for each list that would render as a paragraph."""
    for number, line in lists_after_paragraphs(markdown):
        log.warning(f"{page.file.src_path}:{number}: a list right after a paragraph line renders as a paragraph "
                    f"(put a blank line before it): {line[:60]}")
    return markdown

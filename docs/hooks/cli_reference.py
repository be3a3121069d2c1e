"""mkdocs hook: the command-line reference, made from advisor's own argparse parser (advisor/cli.py).

A page holding the line `<!-- advisor-cli -->` gets, in its place, one section per sub-command: its usage
and a table of its arguments with their help. The options are thus written once, in the parser.
"""

from __future__ import annotations

import argparse

MARKER = "<!-- advisor-cli -->"


def subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """The parser's sub-commands by name, in the order they were added, each with its one-line help."""
    # argparse has no public accessor for its sub-parsers: the action that holds them is the way in.
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    return {name: (sub, helps.get(name, "")) for name, sub in action.choices.items()}


def usage(parser: argparse.ArgumentParser) -> str:
    """The usage line as argparse writes it, wrapped at 100 columns whatever the terminal."""
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100)
    return parser.format_usage().removeprefix("usage: ").rstrip()


def cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    text = " ".join(text.split()).replace("|", "\\|")
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    """One table row per argument: how it is written, and its help with argparse's %-escapes resolved."""
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = "" if action.nargs == 0 else " " + (action.metavar or action.dest.upper())
            name = ", ".join(f"{flag}{metavar}" for flag in action.option_strings)
        else:
            name = action.metavar or action.dest
        choices = f" (one of {', '.join(map(str, action.choices))})" if action.choices else ""
        help_text = (action.help or "") % {"default": action.default, "prog": parser.prog}
        rows.append(f"| `{cell(name)}` | {cell(help_text + choices)} |")
    return rows


def cli_markdown() -> str:
    """The reference of every sub-command of `advisor`, as markdown."""
    from advisor.cli import build_parser

    parser = build_parser()
    parts = ["```", usage(parser), "```", "", "| argument | meaning |", "|---|---|", *argument_rows(parser)]
    for name, (sub, summary) in subcommands(parser).items():
        parts += ["", f"## `advisor {name}`", "", summary[:1].upper() + summary[1:] + ".", "", "```", usage(sub), "```"]
        parts += ["", "| argument | meaning |", "|---|---|", *argument_rows(sub)]
        if sub.epilog:
            parts += ["", sub.epilog]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Put the generated reference where a page asks for it."""
    return markdown.replace(MARKER, cli_markdown()) if MARKER in markdown else markdown

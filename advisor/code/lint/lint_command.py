"""`advisor lint`: its arguments, the command, and the findings printed with rich."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from advisor.code.lint.lint_findings import LintFinding
from advisor.code.lint.run import expand_paths, lint_tree, parse_source, read_source
from advisor.escape import for_terminal, output_stream

if TYPE_CHECKING:  # rich is imported when findings are printed, not when they are computed
    from rich.console import Console


def add_lint_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `advisor lint`."""
    parser.add_argument("paths", nargs="+", metavar="script.py", help="Python files (or folders) to check")
    parser.add_argument("--json", action="store_true", help="print the findings as a JSON list")


def lint_command(args: argparse.Namespace) -> int:
    """`advisor lint`: exit 1 if anything is found, 0 if clean, 2 (LintError) for bad input."""
    files = expand_paths(args.paths)
    # Read and parse everything first so that a bad file fails the command before any output.
    parsed = []
    for path in files:
        source = read_source(path)
        parsed.append((parse_source(source, str(path)), source, str(path)))
    findings = [finding for tree, source, name in parsed for finding in lint_tree(tree, source, name)]
    if args.json:
        json.dump([f.to_dict() for f in findings], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_findings(findings, len(files))
    return 1 if findings else 0


def print_findings(findings: list[LintFinding], file_count: int, console: Console | None = None) -> None:
    """Print findings as a readable list with rich: location and rule, then what, why, fix.

    The why of a rule is printed at its first finding only: it is the same text every time."""
    from rich.console import Console
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    console = console or Console(highlight=False, file=output_stream())
    explained: set[str] = set()
    for finding in findings:
        header = Text()
        header.append(for_terminal(finding.location()), style="bold")
        header.append("  ")
        header.append(finding.rule, style="bold yellow")
        header.append(f"  {finding.title}")
        console.print(header)
        # A two-column grid keeps wrapped lines aligned under their text, not under the label.
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="cyan", no_wrap=True)
        grid.add_column()
        # What and fix quote the script's code: a control character in a string literal is shown escaped.
        grid.add_row("what", Text(for_terminal(finding.what)))
        if finding.rule not in explained:
            grid.add_row("why", Text(finding.why, style="dim"))
            explained.add(finding.rule)
        grid.add_row("fix", Text("\n".join(for_terminal(line) for line in finding.fix.split("\n")), style="green"))
        console.print(Padding(grid, (0, 0, 1, 4)))
    files = "file" if file_count == 1 else "files"
    if findings:
        noun = "finding" if len(findings) == 1 else "findings"
        console.print(Text(f"{len(findings)} {noun} in {file_count} {files}", style="bold"))
    else:
        console.print(Text(f"No findings in {file_count} {files}", style="bold green"))

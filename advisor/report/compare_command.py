"""`advisor compare A B` on the command line: its arguments, and the verdict and what moved printed, written as a
page or as the advisor.compare/1 document, with the --fail-if-slower gate's exit code."""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

from advisor.errors import AdvisorError
from advisor.escape import for_terminal


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `advisor compare`."""
    run = "a session folder (its best trial), a trial folder, a .json/.json.gz trace or a folder of ranks' traces"
    parser.add_argument("a", help=f"the run compared against: {run}")
    parser.add_argument("b", help="the run compared with A, of the same kinds")
    parser.add_argument("--json", action="store_true", help="print the versioned JSON document (advisor.compare/1)")
    parser.add_argument("--html", metavar="OUT", help="also write the comparison as an HTML page to OUT")
    parser.add_argument("--fail-if-slower", type=float, metavar="PCT",
                        help="exit 1 when B is slower than A beyond the noise by more than PCT %% of A's rate "
                             "(a CI gate)")
    parser.add_argument("--steps", help="which ProfilerStep numbers of each trace to use, e.g. 3-5 or 2,4")


GATE_WORDS = {"same": "within the noise", "unknown": "no noise estimate: the gate does not fail on it"}


def compare_command(args: argparse.Namespace) -> int:
    """`advisor compare A B`: the verdict and what moved; exit 1 when the --fail-if-slower gate fails."""
    gate = args.fail_if_slower
    if gate is not None and not (math.isfinite(gate) and gate >= 0):
        raise AdvisorError(f"--fail-if-slower: a percentage of 0 or more, not {gate}")
    from advisor.analysis.compare import compare, comparison_to_dict

    comparison = compare(args.a, args.b, args.steps, parallel=True)
    failed = gate is not None and comparison.slower_than(gate)
    if args.html:
        from advisor.report.compare_view import render_comparison_page
        from advisor.report.html import write_page

        words = ["advisor", "compare", args.a, args.b] + (["--fail-if-slower", f"{gate:g}"] if gate is not None else [])
        write_page(render_comparison_page(comparison, " ".join(shlex.quote(w) for w in words)), Path(args.html))
    if args.json:
        from advisor.analysis.analyze import encode_json

        document = comparison_to_dict(comparison)
        document["gate"] = None if gate is None else {"fail_if_slower": gate, "failed": failed}
        sys.stdout.buffer.write(encode_json(document) + b"\n")
        return 1 if failed else 0
    from advisor.report.compare_view import print_comparison

    print_comparison(comparison)
    if gate is not None:
        change = comparison.verdict.change
        slower = f"{-100 * change:.1f}% slower" if change is not None and change < 0 else "not slower"
        print(f"gate --fail-if-slower {gate:g}: {'FAILED' if failed else 'passed'} (B is {slower}; "
              f"{GATE_WORDS.get(comparison.verdict.word, comparison.verdict.word)})")
    if args.html:
        print(f"page: {for_terminal(args.html)}")
    return 1 if failed else 0

"""Command line: `advisor analyze | profile | lint | report`. Heavy modules are imported per command."""

from __future__ import annotations

import argparse
import sys

from advisor.errors import AdvisorError
from advisor.escape import for_terminal


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with one sub-command per job.

    Only the invoked sub-command's module is imported to describe its arguments, so `advisor analyze`
    does not pay for importing the trial or lint code.
    """
    parser = argparse.ArgumentParser(prog="advisor", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True)

    analyze = sub.add_parser("analyze", help="diagnose a recorded torch.profiler trace (no torch needed)")
    analyze.add_argument("path", help="a .json/.json.gz trace, a folder of them, or a trial/session folder")
    analyze.add_argument("--json", action="store_true", help="print the versioned JSON document instead")
    analyze.add_argument("--steps", help="which ProfilerStep numbers to use, e.g. 3-5 or 2,4")

    profile = sub.add_parser("profile", help="run script.py:train_step under the profiler, apply fixes")
    if command in (None, "profile"):
        from advisor import trial  # light: the harness that imports torch runs in the subprocess only

        from advisor import session

        trial.add_profile_arguments(profile)
        session.add_session_arguments(profile)

    lint = sub.add_parser("lint", help="static check of a training script for memory and speed mistakes")
    if command in (None, "lint"):
        from advisor import lint as lint_module

        lint_module.add_lint_arguments(lint)

    report = sub.add_parser("report", help="HTML report (and TensorBoard runs) of a session or trace(s)")
    if command in (None, "report"):
        from advisor import report as report_module

        report_module.add_report_arguments(report)
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The sub-command named on the command line (first word that is not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `advisor` console script."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    try:
        if args.command == "analyze":
            from advisor.trace import prefetch

            prefetch(args.path)  # decompress while the analysis modules import
            from advisor.commands import analyze_command

            return analyze_command(args)
        if args.command == "profile":
            from advisor import session

            return session.profile_command(args)
        if args.command == "lint":
            from advisor import lint as lint_module

            return lint_module.lint_command(args)
        if args.command == "report":
            from advisor import report as report_module

            return report_module.report_command(args)
    except AdvisorError as exc:
        if args.debug:
            raise
        print(f"advisor: error: {for_terminal(exc)}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        # A file the command was given, or found, that the system refuses (a folder that cannot be searched):
        # one line naming it. An OSError without a file name is a bug, and keeps its traceback.
        if args.debug or exc.filename is None:
            raise
        from advisor.files import describe_os_error

        print(f"advisor: error: {for_terminal(exc.filename)}: {describe_os_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("advisor: interrupted", file=sys.stderr)
        return 130
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())

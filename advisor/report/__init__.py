"""Reports people want to look at: the HTML page (`html`) and TensorBoard runs (`tensorboard`).

`advisor report DIR|TRACE -o report.html [--tensorboard]`. The session calls `write_report` and
`write_tensorboard` at its end. Heavy modules (jinja2, matplotlib, torch) are imported when used.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def write_report(target: Path, out: Path) -> Path:
    """Write the HTML report of a session folder or of recorded trace(s) to `out`."""
    from advisor.report.html import write_report as write

    return write(target, out)


def render_session_report(session_dir: Path) -> str:
    """The HTML report of a session folder, as a string."""
    from advisor.report.html import render_session_report as render

    return render(session_dir)


def render_trace_report(path: Path) -> str:
    """The HTML report of a trace file or a folder of traces, as a string."""
    from advisor.report.html import render_trace_report as render

    return render(path)


def write_tensorboard(session_dir: Path) -> list[Path]:
    """Write a session's TensorBoard run (DIR/trials/session, replacing the earlier one); return it and the
    trial folders with traces (the profiler plugin's runs)."""
    from advisor.report.tensorboard import write_tensorboard as write

    return write(session_dir)


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `advisor report`."""
    parser.add_argument("path", help="a session folder (with session.json), a trace file or a folder of traces")
    parser.add_argument("-o", "--out", help="where to write the HTML report (default: DIR/report.html for a "
                                            "session, report.html otherwise)")
    parser.add_argument("--tensorboard", action="store_true",
                        help="also write TensorBoard runs for a session (tensorboard --logdir DIR/trials)")


def report_command(args: argparse.Namespace) -> int:
    """`advisor report PATH [-o OUT] [--tensorboard]`."""
    from advisor.errors import AdvisorError
    from advisor.escape import for_terminal

    target = Path(args.path)
    if not target.exists():
        raise AdvisorError(f"{target}: no such file or folder")
    is_session = target.is_dir() and os.path.lexists(target / "session.json")
    out = Path(args.out) if args.out else (target / "report.html" if is_session else Path("report.html"))
    if args.tensorboard and not is_session:
        raise AdvisorError(f"{target}: --tensorboard needs a session folder (one with session.json)")
    written = write_report(target, out)
    print(f"report: {for_terminal(written)}")  # a name that is not UTF-8 (or holds escapes) shown escaped
    if args.tensorboard:
        traces = len(write_tensorboard(target)) - 1
        print(f"tensorboard: the session run and {traces} trial(s) with traces; "
              f"view with: tensorboard --logdir {for_terminal(target / 'trials')}")
    return 0

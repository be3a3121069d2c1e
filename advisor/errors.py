"""Errors that the CLI turns into one line and a non-zero exit code."""

from __future__ import annotations


def first_line(exc: BaseException, width: int = 300) -> str:
    """`Type: first line of the message`, the message cut to `width` characters."""
    text = (str(exc).strip().splitlines() or [""])[0][:width]
    return f"{type(exc).__name__}: {text}".rstrip(": ")


class AdvisorError(Exception):
    """A user-facing error: one line that names the file or argument and the problem."""

    exit_code = 2


class TraceError(AdvisorError):
    """A trace file that cannot be read: missing, empty, not JSON, truncated, wrong shape."""

    def __init__(self, path: object, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class NotATrace(TraceError):
    """A file that is not a torch.profiler trace at all (not JSON, or JSON of another shape): in a folder of
    traces it is skipped, not an error."""

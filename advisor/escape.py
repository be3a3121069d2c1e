"""Text from traces, records and file names, made safe to show.

Kernel and operator names, trial names and file names come from input. On a terminal, a control character
in them (an escape sequence) could move the cursor, recolour or clear the screen, so `for_terminal` shows
each as a visible escape (`\\x1b`). A file name that is not UTF-8 reaches Python as lone surrogates, which
no UTF-8 writer (JSON, HTML, the terminal) accepts; `without_surrogates` shows those bytes as `\\xff`.
"""

from __future__ import annotations

import re
import sys

# C0 and C1 controls (DEL included), line and paragraph separators, bidirectional overrides and isolates
# (they reorder what is shown), and lone surrogates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, as os.fsdecode keeps it (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def for_terminal(text: object) -> str:
    """`str(text)` with control characters, bidirectional controls and undecodable bytes as visible escapes."""
    text = str(text)
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def without_surrogates(text: str) -> str:
    """`text` with lone surrogates (bytes of a file name that are not UTF-8) as visible escapes."""
    return _SURROGATE.sub(_escape, text) if _SURROGATE.search(text) else text


def strings_without_surrogates(value):
    """A JSON-ready value (dicts, lists, strings, numbers) with `without_surrogates` applied to every string."""
    if isinstance(value, str):
        return without_surrogates(value)
    if isinstance(value, dict):
        return {strings_without_surrogates(k): strings_without_surrogates(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strings_without_surrogates(v) for v in value]
    return value


# What Python-Markdown (TensorBoard's Text tab) takes a backslash before; any other backslash stays visible.
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|])")


def for_markdown(text: object) -> str:
    """`str(text)` shown literally by Markdown: `DataLoader.__next__` stays as written, not a bold "next"; HTML
    (`<b>`) is shown as text."""
    text = without_surrogates(str(text)).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN.sub(r"\\\1", text)


class TrimmedLines:
    """A text stream that writes each line without the spaces at its end: rich pads table cells and wrapped
    text to the width, which on a terminal nobody sees and in a file or a pipe is noise."""

    def __init__(self, stream):
        self.stream, self.pending = stream, ""

    def write(self, text: str) -> int:
        """Write the lines `text` completes, each trimmed; keep the unfinished one."""
        *lines, self.pending = (self.pending + text).split("\n")
        if lines:
            self.stream.write("".join(line.rstrip(" ") + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        """Write the unfinished line as it is (what follows may continue it), and flush the stream."""
        if self.pending:
            self.stream.write(self.pending)
            self.pending = ""
        self.stream.flush()

    def __getattr__(self, name: str):  # isatty, fileno, encoding: the stream's own
        return getattr(self.stream, name)


def output_stream(stream=None):
    """Standard output (or `stream`) for rich: as it is on a terminal, its lines trimmed anywhere else."""
    stream = sys.stdout if stream is None else stream
    return stream if stream.isatty() else TrimmedLines(stream)


"""Reading files the user did not write by hand as untrusted: regular files only, paths kept inside a folder.

A session folder can be copied from anywhere, so a path named inside `session.json` or `trial.json` is
data, not an instruction: it is followed only when it resolves (symbolic links included) inside the
session folder. And only regular files are opened: a FIFO or a device in a trial folder would block or
never end, so it is refused without being opened for reading in a way that could wait.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class NotARegularFile(OSError):
    """The path names a FIFO, socket, device or folder where a regular file was expected."""

    def __init__(self, path: object):
        super().__init__(errno.EINVAL, "not a regular file (a FIFO, socket, device or folder)", str(path))


def read_regular(path: Path | str) -> bytes:
    """The bytes of a regular file; NotARegularFile (an OSError) for anything else, without waiting on it.

    O_NONBLOCK makes opening a FIFO return at once instead of waiting for a writer; fstat on the open file
    then says what it is, with no window for the path to be swapped in between.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(path)
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            return f.read()
    finally:
        if fd >= 0:
            os.close(fd)


def is_regular(path: Path | str) -> bool:
    """True for a regular file (following links); False for anything else, or a path that cannot be seen."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def inside(root: Path | str, relative: object) -> Path | None:
    """`root / relative`, resolved, when it stays inside `root` (links followed); None when it leaves it,
    is absolute, or is not a path at all (a number or a list in a hand-edited record)."""
    if not isinstance(relative, str) or not relative or "\x00" in relative or os.path.isabs(relative):
        return None
    try:
        base = Path(root).resolve()
        path = (base / relative).resolve()
    except (OSError, RuntimeError, ValueError):  # a link loop, or a name the system refuses
        return None
    return path if path == base or path.is_relative_to(base) else None


def describe_os_error(exc: OSError) -> str:
    """'permission denied', 'no such file', ... : the problem of an OSError, in a few words."""
    if isinstance(exc, NotARegularFile):
        return exc.strerror
    return {errno.ENOENT: "no such file or folder", errno.EACCES: "permission denied",
            errno.EPERM: "permission denied", errno.EISDIR: "is a folder, expected a file",
            errno.ENOTDIR: "a part of the path is not a folder",
            errno.ELOOP: "too many levels of symbolic links"}.get(exc.errno, (exc.strerror or str(exc)).lower())


def file_stamps(paths: list[Path]) -> tuple[tuple[str, int, int], ...]:
    """(name, mtime in ns, size) of each of `paths` that is a file: the key of a cache of what was read from
    them, so that a file written again, added or removed is read again."""
    stamps = []
    for path in paths:
        try:
            found = path.stat()
        except OSError:
            continue
        if not stat.S_ISDIR(found.st_mode):
            stamps.append((path.name, found.st_mtime_ns, found.st_size))
    return tuple(stamps)


def regular_traces_in(folder: Path | str) -> list[Path]:
    """The `*.pt.trace.json*` files directly in a trial folder that are regular files inside it (a link that
    leads out of the folder, or a FIFO, is left out), sorted by name."""
    folder = Path(folder)
    found = []
    for path in sorted(folder.glob("*.pt.trace.json*")):
        resolved = inside(folder, path.name)
        if resolved is not None and is_regular(resolved):
            found.append(resolved)
    return found

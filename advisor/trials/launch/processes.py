"""The processes a trial started, found and ended from outside it: its process group, its descendants, and
any process that carries its token (one that left the group with setsid); the advisor's own signals while
a trial runs. Torch-free."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from advisor.trials.record import TRIAL_NODE, TRIAL_TOKEN


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in a process group: what a finished trial must not leave behind."""
    import psutil

    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


# The folder that holds the advisor package (a checkout's top, or site-packages), not the package's own folder:
# on PYTHONPATH that would put its subpackages (`code`, `analysis`, ...) before the standard library's and the
# user's modules of the same names.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])


def advisor_importable(environ: dict[str, str]) -> str:
    """The PYTHONPATH of a process the advisor starts with `environ`: this advisor first, so that a checkout
    run without installing is the one its trials import."""
    return os.pathsep.join(filter(None, [PACKAGE_ROOT, environ.get("PYTHONPATH")]))




def trial_processes(pgid: int, token: str | None = None, node: str | None = None) -> list[Any]:
    """The live processes of a trial: its process group, the descendants of its first process, and any
    process whose environment carries the trial's token (a daemon that double-forked out of both). With
    a token, only processes that carry it: a recycled process id is never taken for the trial's. With a
    `node`, of those found by the token alone only the ones that carry the node too: not another node's ranks
    (nor those of a rank forked from a zygote, whose /proc environment is the zygote's: its node's host ends
    them, `advisor.trials.launch.ray_hosts`)."""
    import psutil

    found: dict[int, Any] = {}
    for pid in group_members(pgid):
        found[pid] = None
    try:
        for child in psutil.Process(pgid).children(recursive=True):
            found[child.pid] = child
    except psutil.Error:
        pass
    related = set(found)  # the group and its first process's descendants: this node's by where they are
    for proc in psutil.process_iter() if token else ():
        found.setdefault(proc.pid, proc)
    processes = []
    for pid, proc in found.items():
        try:
            proc = proc or psutil.Process(pid)
            if pid == os.getpid() or not _alive(proc):
                continue
            if token and proc.environ().get(TRIAL_TOKEN) != token:
                continue
            if node is not None and pid not in related and proc.environ().get(TRIAL_NODE) != node:
                continue
            processes.append(proc)
        except psutil.Error:
            continue
    return processes


def end_trial_processes(pgid: int, token: str | None = None, node: str | None = None) -> None:
    """End a trial (or its `node`'s part): SIGTERM to all its processes (`trial_processes`), a moment to exit,
    then SIGKILL."""
    import psutil

    processes = trial_processes(pgid, token, node)
    if not processes:
        return
    for send in (signal.SIGTERM, signal.SIGKILL):
        for proc in processes:
            try:
                proc.send_signal(send)
            except psutil.Error:
                pass
        # A moment to exit on SIGTERM; after SIGKILL, until the kernel has ended them.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(_alive(p) for p in processes):
            time.sleep(0.05)


def _alive(process: Any) -> bool:
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@contextlib.contextmanager
def interrupts_held():
    """Ctrl-C (and SIGTERM) are ignored while a trial's record is finished (main thread only)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def sigterm_as_interrupt():
    """While a trial runs, SIGTERM to the advisor is handled like Ctrl-C (main thread only)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)

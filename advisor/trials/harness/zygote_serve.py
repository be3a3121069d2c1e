"""The zygote's own side (`advisor.trials.launch.zygote` is the advisor's): import torch and the harness once, then
fork a trial per request, while other children run, and report each child's pid as it is forked and its exit code
as it is reaped. In a forked child, `serve` returns into the trial (the harness, a module run as `python -m`, or a
call) made to be what a fresh `python -c` trial process would be.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import sys
import time
from typing import Any, Callable, NoReturn

from advisor.trials.record import TRIAL_TOKEN

PLACEHOLDER = "0" * 32  # the token the zygote starts with; a trial's is uuid4().hex: 32 characters
READY = "ready"  # what the zygote says once torch and the harness are imported

def serve(argv: list[str]) -> None:
    """The zygote: import torch and the harness, say ready, then fork a trial per request and report its
    exit code, until the request pipe closes. In a child this returns into the harness's run instead."""
    requests, replies, parent = int(argv[0]), int(argv[1]), int(argv[2])
    from advisor.trials.harness.entry import die_with_parent

    die_with_parent(parent)  # a zygote outlives no advisor (its children then follow it)
    from advisor.trials.harness.entry import import_torch_and_freeze

    import_torch_and_freeze()  # the point of this process

    slot = _token_slot()
    os.write(replies, ((READY if slot else "no token slot") + "\n").encode())
    if not slot:
        return
    buffer, children, told_to_go = b"", set(), False
    while True:
        if children:  # a child's end is reported as soon as it is reaped, requests or not
            _report_ended(children, replies)
        if b"\n" not in buffer:
            if told_to_go:  # the request pipe ended: go once the children in flight have ended (ends reported)
                if not children:  # at once, without Python's finalisation of torch and dynamo (1.5 s of CPU)
                    os._exit(0)
                time.sleep(REAP_S)
                continue
            if not select.select([requests], [], [], REAP_S if children else None)[0]:
                continue
            chunk = os.read(requests, 65536)
            told_to_go = not chunk
            buffer += chunk
            continue
        line, buffer = buffer.split(b"\n", 1)
        line = line.decode()
        request = json.loads(line)
        started_r, started_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(started_r)
            for fd in (requests, replies):
                os.close(fd)
            _become_trial(request, slot, started_w)
            if request["module"]:
                end_as_python(lambda: _run_as_main(request["module"]))
            if request["call"]:
                module, function, args = request["call"]
                end_as_python(lambda: getattr(importlib.import_module(module), function)(*args))
            from advisor.trials.harness.entry import main

            main(sys.argv[1:])  # ends the process itself (os._exit); an exception ends it as `python -c` would
            return
        os.close(started_w)
        os.read(started_r, 1)  # the child has its own group and token before anyone is told its pid
        os.close(started_r)
        os.write(replies, f"{pid}\n".encode())
        children.add(pid)


REAP_S = 0.02  # how often a zygote with children in flight looks for one that ended


def _report_ended(children: set[int], replies: int) -> None:
    """In the zygote: reap the children that have ended, and report each one's exit code."""
    for pid in list(children):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 1 << 8
        if done:
            children.discard(pid)
            try:
                os.write(replies, f"{pid} {os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:  # the advisor has let go of this zygote
                pass


def _run_as_main(argv: list[str]) -> None:
    """In the forked child: `python -m NAME ARGS` (argv)."""
    import runpy

    sys.argv = list(argv)  # runpy makes argv[0] the module's file, as -m does
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)


def end_as_python(run: Callable[[], object]) -> NoReturn:
    """In a forked child: `run()`, then end the process as Python would (exit code 0, SystemExit's code or
    message, an exception's traceback and 1), but at once: Python's own finalisation of a process that holds
    torch and dynamo took torchrun's launcher 1.5 s of CPU after its ranks had ended."""
    import traceback

    code = 0
    try:
        run()
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
        if not isinstance(exit.code, (int, type(None))):
            print(exit.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _become_trial(request: dict[str, Any], slot: int, started: int) -> None:
    """In the forked child: what a fresh `python -c HARNESS_ENTRY CONFIG` started by the runner would be."""
    import ctypes

    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # as the runner's open(log, "wb")
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.chdir(request["cwd"])
    for name, value in request["env"].items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    signal.signal(signal.SIGINT, signal.SIG_IGN if request.get("sigint_ignored") else signal.default_int_handler)
    token = request["env"][TRIAL_TOKEN].encode()
    ctypes.memmove(slot, token, len(token))
    sys.argv = ["-c", *request["argv"]]
    reseed()
    os.write(started, b"1")
    os.close(started)


def reseed() -> None:
    """In a forked child: numpy's global random state seeded anew, as a fresh process's is, not the parent's."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _token_slot() -> int:
    """The address of the token's value in the environment block this process was started with (what
    /proc/<pid>/environ reads), checked by writing to it; 0 where that does not hold."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_void_p
    libc.getenv.argtypes = [ctypes.c_char_p]
    address = libc.getenv(TRIAL_TOKEN.encode())
    if not address or ctypes.string_at(address, len(PLACEHOLDER) + 1) != PLACEHOLDER.encode() + b"\0":
        return 0
    probe = "1" * len(PLACEHOLDER)
    ctypes.memmove(address, probe.encode(), len(probe))
    try:
        with open("/proc/self/environ", "rb") as f:
            shown = f"{TRIAL_TOKEN}={probe}".encode() in f.read().split(b"\0")
    except OSError:
        shown = False
    ctypes.memmove(address, PLACEHOLDER.encode(), len(PLACEHOLDER))
    return address if shown else 0

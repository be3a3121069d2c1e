"""Trials forked from a process that has imported torch once (a zygote), instead of each starting Python
and importing torch afresh: about 2 s sooner per trial on a CPU machine (torch, and the `torch._dynamo` that
torch.optim's optimizers import), more with CUDA's libraries.

The parent side (`start_trial`, this module) is torch-free; the zygote's own side is
`advisor.trials.harness.zygote_serve`. A zygote is started as the trial itself would be (the same
interpreter, environment and `-c` entry), imports torch, dynamo and the harness, moves what they made to the
garbage collector's permanent generation (`gc.freeze`: a trial's collections and object scans skip it), and
then forks one child per trial. A zygote serves one environment; the last two environments' zygotes are kept
(`MAX_ZYGOTES`).
The child makes itself what a fresh trial process is: a process group and session of its own, its output
into the trial's log, the folder the trial runs in, the trial's token, the harness's argv, Ctrl-C ignored or
handled as the advisor's is at that moment (a fresh process inherits it then); and then runs the
harness exactly as `python -c HARNESS_ENTRY CONFIG` would, exit code and all.

A data-parallel trial forks torchrun itself (`module`: `python -m advisor.trials.launch.forked_ranks ...`
as the child runs it), which spares the launcher's own import of torch; torchrun then forks each rank from
its own process (`advisor.trials.launch.forked_ranks`).

A trial in another environment than a zygote's is forked from a zygote of its own (torch and its libraries
read some variables at import). A zygote forks a trial while another of its children runs: the two trials of a
pair (their windows in turns) are both forked, neither pays a fresh start (about 2.4 s on this 2-core machine).
Ray's ranks are forked on their own nodes, from a zygote kept there by this module in an actor of the driver's
(`advisor.trials.launch.ray_hosts`), with torch.distributed's variables among a rank's own.
What a fork cannot give is served by a fresh process instead (`start_trial` returns None): a trial in another
environment while some zygote has a trial in flight (letting a busy zygote go would end its trial), a zygote
that could not start, a platform other than Linux, and `ADVISOR_FRESH_TRIALS=1` (the user's way to turn it off).

The token: /proc/<pid>/environ shows the environment a process was *exec*'d with, so a forked child would
show the zygote's and could not be found by the trial's token (`advisor.trials.launch.processes`). The
zygote therefore starts with a placeholder of the token's length, and each child writes its token over it
in place, where /proc reads it (and its own exec'd children inherit it as any variable).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from advisor.trials.harness.zygote_serve import PLACEHOLDER, READY
from advisor.trials.record import TRIAL_TOKEN

ZYGOTE_ENTRY = "import sys; from advisor.trials.harness.zygote_serve import serve; serve(sys.argv[1:])"
FRESH_VARIABLE = "ADVISOR_FRESH_TRIALS"  # "1": every trial in a fresh process
# Variables that change from one trial (or one test under pytest) to the next and that nothing reads at import:
# a zygote serves trials whose environments differ in these alone, each child taking its own values. The
# terminal's size is read where a console is made; a trial's own console is made after the fork.
PER_TRIAL = (TRIAL_TOKEN, "PYTEST_CURRENT_TEST", "COLUMNS", "LINES")


class ForkedTrial:
    """A trial process forked by the zygote, waited for as a subprocess.Popen is (pid, wait, returncode)."""

    def __init__(self, zygote: "Zygote", pid: int):
        self.zygote, self.pid = zygote, pid
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code (negative: the signal that ended it); subprocess.TimeoutExpired after `timeout` s."""
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, timeout)
        return self.returncode


class Zygote:
    """One zygote process: started, asked to fork, told to go (its request pipe closed)."""

    def __init__(self, python: str, env: dict[str, str], timeout_s: float):
        requests_r, self.requests = os.pipe()
        self.replies, replies_w = os.pipe()
        self.proc = subprocess.Popen(
            [python, "-c", ZYGOTE_ENTRY, str(requests_r), str(replies_w), str(os.getpid())],
            env={**env, TRIAL_TOKEN: PLACEHOLDER}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, pass_fds=(requests_r, replies_w),
            start_new_session=True)  # Ctrl-C at the terminal is the session's to handle, not the zygote's
        os.close(requests_r)
        os.close(replies_w)
        self.buffer = b""
        self.in_flight: set[int] = set()  # children forked and not yet reaped
        self.writing = threading.Lock()  # one request, and its pid's reply, at a time
        self.replied = threading.Condition()
        self.forked: list[str] = []  # the replies to fork requests, in their order
        self.exits: dict[int, int] = {}  # exit codes of children reaped, not yet asked for
        self.gone = False  # the reply pipe ended: the zygote has gone
        try:
            self.ready = self._reply(timeout_s) == READY
        except subprocess.TimeoutExpired:  # it could not import torch in the trial's time: a fresh process tries
            self.ready = False
        if self.ready:  # its replies, read as they come: two children's ends may come in either order
            threading.Thread(target=self._read_replies, daemon=True).start()

    @property
    def busy(self) -> bool:
        """Whether a child of this zygote is in flight."""
        return bool(self.in_flight)

    def _read_replies(self) -> None:
        """The zygote's replies, each handed to the one waiting for it: a pid (a fork's), or a pid and its exit
        code (a child reaped); at the pipe's end every waiter is woken."""
        while True:
            try:
                line = self._reply(None)
            except (OSError, ValueError):
                line = None
            with self.replied:
                if line is None:
                    self.gone = True
                    self.replied.notify_all()
                    os.close(self.replies)
                    return
                parts = line.split()
                if len(parts) == 2 and all(part.lstrip("-").isdigit() for part in parts):
                    self.exits[int(parts[0])] = int(parts[1])
                else:
                    self.forked.append(line)
                self.replied.notify_all()

    def fork(self, config: dict[str, Any] | None, cwd: str, env: dict[str, str], log_path: str,
             call: tuple[str, str, list[str]] | None = None, module: list[str] | None = None,
             per_trial: tuple[str, ...] = PER_TRIAL) -> ForkedTrial | None:
        """A child running the harness with `config` (or `call`: module, function, its string arguments; or
        `module`: a module and its arguments, run as `python -m` runs it), the `per_trial` variables of `env` its
        own; None when the zygote has gone."""
        # The harness ends with its parent: that is the zygote now.
        argv = [] if config is None else [json.dumps({**config, "parent": self.proc.pid})]
        # A fresh process would inherit Ctrl-C ignored if the advisor ignores it now (a shell's background job),
        # and Python's handler otherwise, whatever it was when the zygote started.
        request = {"argv": argv, "cwd": cwd, "env": {k: env.get(k) for k in per_trial}, "log": log_path,
                   "call": call, "module": module,
                   "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN}
        with self.writing:
            try:
                data = (json.dumps(request) + "\n").encode()
                while data:  # a request beyond the pipe's buffer (a session's TensorBoard run) may take several writes
                    data = data[os.write(self.requests, data):]
                with self.replied:
                    if not self.replied.wait_for(lambda: self.forked or self.gone, 60.0) or not self.forked:
                        return None
                    reply = self.forked.pop(0)
                    if reply.isdigit():
                        self.in_flight.add(int(reply))
            except OSError:
                return None
            except BaseException:  # Ctrl-C mid-exchange: its next replies could be taken for another request's
                self.proc.kill()
                raise
        if not reply.isdigit():
            return None
        return ForkedTrial(self, int(reply))

    def exit_code(self, pid: int, timeout: float | None) -> int:
        """The exit code of the child `pid`, as the zygote reaped it."""
        with self.replied:
            if not self.replied.wait_for(lambda: pid in self.exits or self.gone, timeout):
                raise subprocess.TimeoutExpired(f"trial {pid}", timeout)
            self.in_flight.discard(pid)
            code = self.exits.pop(pid, None)
        if code is None:  # the zygote died with its child in flight: its status is lost with it
            _wait_gone(pid)
            return 1
        return code

    def alive(self) -> bool:
        """Whether the zygote is still there to fork."""
        return self.ready and not self.gone and self.proc.poll() is None

    def close(self) -> None:
        """Let the zygote go: it exits when its request pipe closes (killed if it is not ready or does not)."""
        # The reply pipe is its reader's to close, at its end (the zygote gone): closed under a reader blocked on
        # it, its number could be another file's by the time the reader reads.
        for fd in (self.requests,) if self.ready else (self.requests, self.replies):
            try:
                os.close(fd)
            except OSError:
                pass
        if not self.ready:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _reply(self, timeout: float | None) -> str | None:
        """The zygote's next line (None at its end); subprocess.TimeoutExpired after `timeout` s."""
        line, self.buffer = _next_line(self.replies, self.buffer, timeout)
        return line


def _next_line(fd: int, buffer: bytes, timeout: float | None = None) -> tuple[str | None, bytes]:
    """The next line read from `fd` after what `buffer` holds, and what is left (None at the pipe's end);
    subprocess.TimeoutExpired after `timeout` s."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while b"\n" not in buffer:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([fd], [], [], left)[0]:
            raise subprocess.TimeoutExpired("zygote", timeout or 0)
        chunk = os.read(fd, 65536)
        if not chunk:
            return None, buffer
        buffer += chunk
    line, rest = buffer.split(b"\n", 1)
    return line.decode(), rest


_lock = threading.Lock()
# The zygotes of the last environments trials ran in, least recently used first: a caller that switches
# between two (a test with `--device cuda` or another compiler, a notebook that sets a variable and unsets it)
# does not start one each time. Each holds torch imported (docs/architecture/trials.md), so no more than two are kept.
MAX_ZYGOTES = 2
_zygotes: OrderedDict[tuple, Zygote] = OrderedDict()
# Every zygote is started from this one thread, which lives as long as the advisor: the kernel sends a process its
# parent-death signal (`die_with_parent`) when the *thread* that started it ends, and a zygote one trial of a pair
# started in its own thread died when that trial ended, and the other trial with it (its result lost, exit code 1).
_starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="advisor-zygotes")
_refused: set[tuple] = set()  # zygotes that could not start: those trials start fresh


def start_trial(python: str, config: dict[str, Any] | None, cwd: str, env: dict[str, str], log_path: str,
                timeout_s: float, module: list[str] | None = None,
                per_trial: tuple[str, ...] = PER_TRIAL) -> ForkedTrial | None:
    """The trial forked from a zygote for `python` and `env` less its `per_trial` variables (started if need
    be): the harness with `config`, or `module` (its name and arguments, as `python -m` takes them); None where
    a fresh process must run it (see the module's docstring)."""
    token = env.get(TRIAL_TOKEN, "")
    if sys.platform != "linux" or env.get(FRESH_VARIABLE) == "1" or len(token) != len(PLACEHOLDER):
        return None
    shared = {k: v for k, v in env.items() if k not in per_trial}
    key = (python, tuple(sorted(shared.items())))
    with _lock:
        # A busy zygote of another environment would be let go, and its trial with it, to make room for this one.
        if key in _refused or (key not in _zygotes and any(z.busy for z in _zygotes.values())):
            return None
        for _ in range(2):  # a zygote that has gone since the last trial is replaced once
            zygote = _zygote_for(python, key, shared, timeout_s)
            if zygote is None:
                return None
            forked = zygote.fork(config, cwd, env, log_path, module=module, per_trial=per_trial)
            if forked is not None:
                return forked
            _retire(key)
        return None


def _zygote_for(python: str, key: tuple, shared: dict[str, str], timeout_s: float) -> Zygote | None:
    """The zygote for `key`, started if need be in the environment its trials share (the least recently used
    let go beyond MAX_ZYGOTES); None if it cannot start."""
    zygote = _zygotes.get(key)
    if zygote is not None and not zygote.alive():
        _retire(key)
        zygote = None
    if zygote is None:
        try:
            zygote = _starter.submit(Zygote, python, shared, timeout_s).result()
        except (OSError, RuntimeError):  # RuntimeError: the interpreter is shutting down
            zygote = None
        if zygote is None or not zygote.ready:
            _refused.add(key)
            if zygote is not None:
                zygote.close()
            return None
        _zygotes[key] = zygote
        while len(_zygotes) > MAX_ZYGOTES:
            _retire(next(iter(_zygotes)))
    _zygotes.move_to_end(key)
    return zygote


def call_forked(module: str, function: str, args: list[str]) -> bool:
    """Run `module.function(*args)` in a child of this process's zygote (the one its last trial came from),
    where torch is imported already (the TensorBoard run, say, spares the advisor importing torch itself);
    False where there is no idle zygote to fork it, or the call failed there: the caller then runs it here."""
    with _lock:
        zygote = next(reversed(_zygotes.values()), None)
        if zygote is None or zygote.busy or not zygote.alive():
            return False
        child = zygote.fork(None, os.getcwd(), {TRIAL_TOKEN: uuid.uuid4().hex}, os.devnull,
                            call=(module, function, list(args)))
        if child is None:
            return False
        try:
            return child.wait() == 0
        except BaseException:  # Ctrl-C: the child (in a session of its own) must not outlive the call
            os.killpg(child.pid, signal.SIGKILL)
            raise


def _retire(key: tuple) -> None:
    """Let the zygote for `key` go (it ends once idle), if there is one."""
    zygote = _zygotes.pop(key, None)
    if zygote is not None:
        zygote.close()


@atexit.register
def _retire_all() -> None:
    """Let every zygote go."""
    for key in list(_zygotes):
        _retire(key)


def _wait_gone(pid: int) -> None:
    """Wait until process `pid` no longer exists (it is not ours to reap)."""
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        time.sleep(0.05)

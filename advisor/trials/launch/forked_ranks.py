"""torchrun whose ranks are forked from its own process, where torch is imported already, instead of each
starting Python and importing torch afresh: about 3 s of CPU per rank here (torch, dynamo, torch.distributed).

`python -m advisor.trials.launch.forked_ranks TORCHRUN_ARGS` is torchrun (`torch.distributed.run`), the same
arguments, rendezvous, monitoring and shutdown, with one interposition: the `Popen` its agent starts each rank
with (`SubprocessHandler`) forks this process when the command is the harness's (`python -u -m
advisor.trials.harness.entry CONFIG`), and runs any other command as Popen does. The rank is a child Popen
waits for, signals and reaps as any. The forked child makes itself what the fresh rank would be: a session of
its own (torchrun's `start_new_session`), the agent's Python signal handlers reset, its environment exactly
the one torchrun gives the rank, torch's thread count from OMP_NUM_THREADS (torchrun sets 1 with several
ranks, and torch read the variable when this process imported it), unbuffered output (`-u`), argv, numpy
seeded anew; then the harness, which ends the process itself.

The agent has initialised no CUDA (it is given a number of ranks, not `gpu`), so each rank may. Where the
handler has no `Popen` to stand in for (another torch), or with `ADVISOR_FRESH_TRIALS=1`, ranks start afresh.
"""

from __future__ import annotations

import inspect
import io
import os
import signal
import subprocess
import sys
import warnings

from advisor.trials.launch.commands import HARNESS_MODULE
from advisor.trials.launch.zygote import FRESH_VARIABLE
from advisor.trials.harness.zygote_serve import end_as_python, reseed


class ForkedRank(subprocess.Popen):
    """A process torchrun's agent starts: the harness forked from this process, any other command exec'd."""

    def _execute_child(self, *args):
        bound = _EXECUTE_CHILD.bind(self, *args).arguments
        command = [str(part) for part in bound["args"]]
        if (command[:4] != [sys.executable, "-u", "-m", HARNESS_MODULE] or len(command) != 5
                or bound["preexec_fn"] is not None):
            return super()._execute_child(*args)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # what the agent wrote is not written again by the child
        with warnings.catch_warnings():  # Python 3.12 warns of fork in a process with threads (the agent's)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the harness ends the process itself (os._exit); anything else as `python -m` would
            end_as_python(lambda: _run_rank(bound, command))
        self.pid = pid
        self._child_created = True
        self._close_pipe_fds(*(bound[name] for name in ("p2cread", "p2cwrite", "c2pread", "c2pwrite",
                                                        "errread", "errwrite")))
        return None


_EXECUTE_CHILD = inspect.signature(subprocess.Popen._execute_child)


def _run_rank(bound: dict, command: list[str]) -> None:
    """In the forked child: what `command`, exec'd by Popen with these arguments, would be; then the harness."""
    if bound["start_new_session"]:
        os.setsid()
    for target, fd in ((0, bound["p2cread"]), (1, bound["c2pwrite"]), (2, bound["errwrite"])):
        if fd != -1:
            os.dup2(fd, target)
    if bound["cwd"] is not None:
        os.chdir(bound["cwd"])
    env = bound["env"]
    if env is not None:
        env = {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
        for name in [n for n in os.environ if n not in env]:
            os.environ.pop(name)
        for name, value in env.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
    for number in signal.valid_signals():  # exec resets handled signals; ignored ones stay ignored
        try:
            if callable(signal.getsignal(number)):
                signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    for fd, name in ((1, "stdout"), (2, "stderr")):  # -u: unbuffered, as the rank's python is told
        stream = getattr(sys, name)
        unbuffered = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=stream.encoding,
                                      errors=stream.errors, write_through=True)
        setattr(sys, name, unbuffered)
        setattr(sys, f"__{name}__", unbuffered)
    import advisor.trials.harness.entry as harness

    sys.argv = [harness.__file__, *command[4:]]
    reseed()
    harness.main(command[4:])


def main(argv: list[str]) -> None:
    """torchrun with `argv`, its harness ranks forked from this process (see the module's docstring)."""
    from torch.distributed import run as torchrun

    try:
        from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler
    except ImportError:
        subprocess_handler = None
    if (os.environ.get(FRESH_VARIABLE) != "1" and sys.platform == "linux"
            and getattr(subprocess_handler, "Popen", None) is subprocess.Popen):
        subprocess_handler.Popen = ForkedRank
    torchrun.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])

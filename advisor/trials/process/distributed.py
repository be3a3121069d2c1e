"""A data-parallel trial: every rank of a torchrun job is profiled and measured, with the same knobs.

`run_trial(..., nproc_per_node=N)` starts the harness under torchrun (torch.distributed's own launcher):
each rank runs the script with the same config and writes its own files into the trial folder —
`steps.rank{R}.jsonl`, `harness.rank{R}.json` and its trace `trial_rank{R}.*.pt.trace.json.gz` — which
the runner merges into one record. Inside a rank:

- DistributedDataParallel's own arguments are knobs: its `__init__` is wrapped, the user's values
  recorded, the requested ones set (`bucket_cap_mb`, `gradient_as_bucket_view`, `static_graph`,
  `find_unused_parameters`);
- the ranks agree when the trial is measured (`all_measured`): each rank's windows close by time, so
  without agreement one rank would stop while another waits for it in the next all-reduce. Once a
  rank's windows are done it votes at the end of each step (a MIN all-reduce of one number on the
  default process group, after the step's own collectives) and all stop at the same step.

Torch is imported lazily: the parent uses `rank_files`, `rank_of` and the merge without it.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import sysconfig
from pathlib import Path
from typing import Any, Callable

from advisor.trials.knobs import APPLIED, DDP_KNOBS, Knobs, not_applicable
from advisor.trials.process.targets import calls_init_process_group


def rank_of(environ: Any = os.environ) -> tuple[int, int]:
    """(rank, world size) of this process as torchrun set them; (0, 1) outside a job."""
    try:
        return int(environ.get("RANK", 0)), int(environ.get("WORLD_SIZE", 1))
    except ValueError:
        return 0, 1


TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def one_rank_on_demand(found: dict[str, Any]) -> Callable[[], None]:
    """Outside a torchrun job, make a call of `init_process_group` that reads torchrun's variables a one-rank
    job (rank 0 of 1, a free port on 127.0.0.1, as `torchrun --standalone --nproc-per-node 1` sets them),
    decided when the call happens: a call the script never reaches (under `if args.distributed:`) changes
    nothing. Sets `found["single_rank_job"]`; returns an undo."""
    import socket

    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    original = distributed_c10d.init_process_group

    def init_process_group(*args, **kwargs):
        explicit = len(args) > 1 or any(kwargs.get(k) not in (None, -1) for k in ("rank", "world_size", "store"))
        method = kwargs.get("init_method")
        if not explicit and method in (None, "env://") and "WORLD_SIZE" not in os.environ:
            with socket.socket() as probe:  # a free port for the one rank's store
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            for name, value in zip(TORCHRUN_VARIABLES, ("0", "1", "0", "1", "127.0.0.1", str(port))):
                os.environ.setdefault(name, value)
            found["single_rank_job"] = True
        return original(*args, **kwargs)

    dist.init_process_group = distributed_c10d.init_process_group = init_process_group

    def undo() -> None:
        dist.init_process_group = distributed_c10d.init_process_group = original

    return undo


def needs_torchrun(out: Path, script: Path) -> bool:
    """Whether a trial run as one process failed reading a variable torchrun sets (`os.environ["LOCAL_RANK"]`)
    in a script that calls init_process_group: it runs again as a one-rank torchrun job."""
    try:
        result = json.loads((out / rank_files(1, 0)["result"]).read_text())
    except (OSError, ValueError):
        return False
    message = str(result.get("message", ""))
    return (result.get("error_type") == "KeyError" and any(f"'{name}'" in message for name in TORCHRUN_VARIABLES)
            and calls_init_process_group(script))


def rank_files(world_size: int, rank: int) -> dict[str, str]:
    """The names of one rank's files in the trial folder (the plain names for a single process)."""
    if world_size <= 1:
        return {"steps": "steps.jsonl", "result": "harness.json", "worker": "trial", "crash": "crash.txt",
                "schedule": "schedule.json"}
    return {"steps": f"steps.rank{rank}.jsonl", "result": f"harness.rank{rank}.json", "worker": f"trial_rank{rank}",
            "crash": f"crash.rank{rank}.txt", "schedule": f"schedule.rank{rank}.json"}


def native_crash(folder: Path, world_size: int, rank: int) -> str | None:
    """How a rank crashed in native code (a segfault, an abort), from the Python stack its faulthandler
    wrote: the fatal error, the innermost frame of the user's code and, when the crash came from inside a
    library, that frame too, e.g. "Fatal Python error: Segmentation fault in train_step (/w/tiny.py, line 8),
    inside string_at (/usr/lib/python3.11/ctypes/__init__.py, line 519)". None when the rank wrote its
    result or did not crash so."""
    names = rank_files(world_size, rank)
    if (folder / names["result"]).exists():
        return None
    try:
        text = (folder / names["crash"]).read_text(errors="replace")
    except OSError:
        return None
    lines = [line.strip() for line in text.splitlines()]
    if not lines or not lines[0]:
        return None
    # The crashing thread's frames, most recent first: 'File "/w/tiny.py", line 8 in train_step'.
    current = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), len(lines))
    frames = []
    for line in lines[current + 1:]:
        match = _FAULTHANDLER_FRAME.match(line)
        if match is None:
            break
        frames.append(match.groups())
    if not frames:
        return lines[0]
    user = next((f for f in frames if not f[0].startswith(_LIBRARY_PATHS) and f[0] != "<string>"), frames[0])
    where = f"{lines[0]} in {user[2]} ({user[0]}, line {user[1]})"
    if user is not frames[0]:
        where += f", inside {frames[0][2]} ({frames[0][0]}, line {frames[0][1]})"
    return where


_FAULTHANDLER_FRAME = re.compile(r'^File "(.*)", line (\d+) in (.*)$')
# Frames of the standard library, installed packages and the advisor's harness are not the user's code.
_LIBRARY_PATHS = tuple({*(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
                        str(Path(__file__).resolve().parents[1]) + os.sep})


def crash_message(folder: Path, world_size: int) -> str | None:
    """'rank 1 crashed: Fatal Python error: Aborted (in ...)' for the rank that crashed first in native code
    ('the trial process crashed: ...' for a single process); None when none did (`native_crash`)."""
    crashed = []
    for rank in range(world_size):
        crash = native_crash(folder, world_size, rank)
        if crash is not None:  # a peer that lost the rank that crashed may abort too, a moment later
            written = (folder / rank_files(world_size, rank)["crash"]).stat().st_mtime_ns
            crashed.append((written, rank, crash))
    if not crashed:
        return None
    _, rank, crash = min(crashed)
    return f"rank {rank} crashed: {crash}" if world_size > 1 else f"the trial process crashed: {crash}"


class DDPKnobs:
    """Wraps DistributedDataParallel.__init__: the DDP knobs set, the user's values and the outcomes kept."""

    ARGUMENTS = {"ddp_bucket_cap_mb": "bucket_cap_mb", "ddp_gradient_as_bucket_view": "gradient_as_bucket_view",
                 "ddp_static_graph": "static_graph", "ddp_find_unused_parameters": "find_unused_parameters"}

    def __init__(self, knobs: Knobs):
        self.knobs = knobs
        self.user: dict[str, Any] = {}
        self.wrapped = 0

    def install(self) -> Callable[[], None]:
        """Wrap the constructor; returns an undo."""
        from torch.nn.parallel import DistributedDataParallel

        original = DistributedDataParallel.__init__
        signature = inspect.signature(original)
        interposition = self

        def __init__(ddp, *args, **kwargs):  # noqa: N807
            bound = signature.bind(ddp, *args, **kwargs)
            bound.apply_defaults()
            values = bound.arguments
            if not interposition.wrapped:  # the first model wrapped is the one trained
                interposition.user = {knob: values.get(name) for knob, name in interposition.ARGUMENTS.items()}
            interposition.wrapped += 1
            for knob, name in interposition.ARGUMENTS.items():
                value = getattr(interposition.knobs, knob)
                if value is not None and name in values:
                    values[name] = value
            return original(*bound.args, **bound.kwargs)

        DistributedDataParallel.__init__ = __init__

        def undo() -> None:
            DistributedDataParallel.__init__ = original

        return undo

    def outcomes(self) -> dict[str, str]:
        """Each requested DDP knob: applied, or why not."""
        requested = [k for k in DDP_KNOBS if getattr(self.knobs, k) is not None]
        if self.wrapped:
            return {k: APPLIED for k in requested}
        return {k: not_applicable("the script wraps no model in DistributedDataParallel") for k in requested}


def all_measured(done: bool) -> bool:
    """Whether every rank has measured what it needs (each votes its own `done`); `done` as it is outside
    a process group. A collective: every rank calls it at the end of the same step."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return done
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    vote = torch.tensor([1.0 if done else 0.0], device=device)
    dist.all_reduce(vote, op=dist.ReduceOp.MIN)
    return bool(vote.item() > 0.5)


def torchrun_module(nproc_per_node: int, torchrun_args: list[str], config: str) -> list[str]:
    """What `python -m` runs to start a trial's ranks: torchrun (standalone unless rendezvous options are
    given) running the harness as a module on each rank, each rank forked from torchrun's own process
    (`advisor.trials.process.forked_ranks`)."""
    standalone = not any(a.startswith(("--rdzv", "--nnodes", "--master")) for a in torchrun_args)
    return ["advisor.trials.process.forked_ranks", f"--nproc-per-node={nproc_per_node}",
            *(["--standalone"] if standalone else []), *torchrun_args, "-m", "advisor.trials.process.harness", config]


def torchrun_command(python: str, nproc_per_node: int, torchrun_args: list[str], config: str) -> list[str]:
    """The command that starts a trial's ranks (`torchrun_module` under `python -m`)."""
    return [python, "-m", *torchrun_module(nproc_per_node, torchrun_args, config)]


def merge_ranks(folder: Path, world_size: int, read_result: Callable[[Path], dict],
                read_steps: Callable[[Path], list]) -> tuple[dict[str, Any], list[dict[str, Any]], list[list]]:
    """The ranks' results merged into one harness result (rank 0's, with the first failure's status and
    message), each rank's result, and each rank's steps."""
    results, steps = [], []
    for rank in range(world_size):
        names = rank_files(world_size, rank)
        results.append(read_result(folder / names["result"]))
        steps.append(read_steps(folder / names["steps"]))
    merged = dict(results[0]) if results and results[0] else {}
    failed = [(rank, r) for rank, r in enumerate(results) if r and r.get("status") not in (None, "ok")]
    crash = crash_message(folder, world_size)
    if crash is not None:
        # A rank that died in native code wrote no result; its peers fail after it (a connection reset).
        merged.update(status="error", message=crash, error_type="NativeCrash", traceback=None)
    elif failed:
        # The rank that failed first is the cause; the others fail after it (a peer that closed).
        rank, result = min(failed, key=lambda item: item[1].get("failed_at") or float("inf"))
        message = result.get("message", "")
        merged.update(status=result["status"], message=f"rank {rank}: {message}" if world_size > 1 else message,
                      error_type=result.get("error_type"), traceback=result.get("traceback"))
    elif any(not r for r in results):
        missing = [rank for rank, r in enumerate(results) if not r]
        merged.update(status="error", message=f"rank(s) {', '.join(map(str, missing))} ended without a result")
    return merged, results, steps

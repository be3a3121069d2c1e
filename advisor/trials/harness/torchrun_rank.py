"""Inside a rank of a data-parallel trial: which rank this is, a one-rank job made on demand for a script that
calls `init_process_group` outside torchrun, and the ranks' agreement on when the trial is measured.

The ranks agree when the trial is measured (`all_measured`): each rank's windows close by time, so without
agreement one rank would stop while another waits for it in the next all-reduce. Once a rank's windows are
done it votes at the end of each step (a MIN all-reduce of one number on the default process group, after the
step's own collectives) and all stop at the same step. Torch is imported lazily: the parent uses `rank_of`
and `TORCHRUN_VARIABLES` without it.
"""

from __future__ import annotations

import os
from typing import Any, Callable


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

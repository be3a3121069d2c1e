"""The commands that start a trial's process: the harness as `python -c` (or forked from the zygote, which runs
the same entry), and a data-parallel trial's ranks under torchrun (torch.distributed's own launcher), each
rank running the harness as a module with the same config and writing its own files into the trial folder
(`advisor.trials.record.ranks`), which the runner merges into one record.
"""

from __future__ import annotations

import json
from pathlib import Path

from advisor.trials.harness.torchrun_rank import TORCHRUN_VARIABLES
from advisor.trials.harness.targets import calls_init_process_group
from advisor.trials.record.ranks import rank_files

HARNESS_MODULE = "advisor.trials.harness.entry"
HARNESS_ENTRY = f"import sys; from {HARNESS_MODULE} import main; main(sys.argv[1:])"


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


def torchrun_module(nproc_per_node: int, torchrun_args: list[str], config: str) -> list[str]:
    """What `python -m` runs to start a trial's ranks: torchrun (standalone unless rendezvous options are
    given) running the harness as a module on each rank, each rank forked from torchrun's own process
    (`advisor.trials.launch.forked_ranks`)."""
    standalone = not any(a.startswith(("--rdzv", "--nnodes", "--master")) for a in torchrun_args)
    return ["advisor.trials.launch.forked_ranks", f"--nproc-per-node={nproc_per_node}",
            *(["--standalone"] if standalone else []), *torchrun_args, "-m", HARNESS_MODULE, config]


def torchrun_command(python: str, nproc_per_node: int, torchrun_args: list[str], config: str) -> list[str]:
    """The command that starts a trial's ranks (`torchrun_module` under `python -m`)."""
    return [python, "-m", *torchrun_module(nproc_per_node, torchrun_args, config)]

"""Trial overhead of Ray: start to first step of a 2-rank trial of the DDP example placed on a Ray cluster
(2 nodes × 1 rank) vs the same 2 ranks started by torchrun on this machine.

A local cluster of two Ray nodes (1 CPU each) is started on 127.0.0.1 for the run and shut down after it.
Runs alternate (local, Ray, local, Ray, ...) so a machine that gets busier part-way through skews both
sides alike; each side's figure is the median of its runs' `times.first_step_at - times.started_at`
(the runner's start of the trial to the end of rank 0's first step). Needs `pip install -e '.[ray]'`.

    .venv/bin/python benchmarks/ray_overhead.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from advisor.trials.knobs import Knobs  # noqa: E402
from advisor.trials.launch.ray_job import SINGLE_MACHINE_VARIABLE  # noqa: E402
from advisor.trials.launch.runner import run_trial  # noqa: E402
from advisor.trials.spec import TrialSpec  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ddp_classifier.py"


def first_step_s(folder: Path, **where) -> float:
    """Seconds from the trial's start to the end of its first step."""
    result = run_trial(TrialSpec(f"{EXAMPLE}:train_step", Knobs(), folder, steps=1, wait=0, warmup=0, device="cpu",
                                 nproc_per_node=where.pop("nproc_per_node"), **where))
    if not result.ok:
        raise SystemExit(f"trial {result.status}: {result.message}")
    times = json.loads((folder / "trial.json").read_text())["times"]
    return times["first_step_at"] - times["started_at"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="trials per side")
    args = parser.parse_args()
    os.environ[SINGLE_MACHINE_VARIABLE] = "0"  # every Ray process on 127.0.0.1
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    local, on_ray = [], []
    try:
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.repeats):
                local.append(first_step_s(Path(tmp) / f"local{i}", nproc_per_node=2))
                on_ray.append(first_step_s(Path(tmp) / f"ray{i}", nproc_per_node=1, nnodes=2,
                                           ray_address=cluster.address))
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps({"local_torchrun_first_step_s": local, "ray_first_step_s": on_ray,
                      "median_local_s": statistics.median(local), "median_ray_s": statistics.median(on_ray),
                      "ray_overhead_s": statistics.median(on_ray) - statistics.median(local)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

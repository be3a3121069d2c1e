"""Ray's ranks forked from a zygote on their node, so that no trial pays each rank's import of torch again.

A trial's `NodeAgent`s live for that trial alone (they hold its placement group's CPUs), so a zygote of theirs
would die with them. Each node therefore gets one `NodeHost` from the driver, at its first trial there: an actor
that holds no CPU, pinned to the node and owned by the driver (it goes when the driver does), at the driver's
priority as the agents are. The host keeps a zygote as a local advisor does (`advisor.trials.launch.zygote`)
and forks each rank the agent asks for from it: the first trial on a node waits for the zygote's import as a
fresh rank would for its own, and every later one starts with torch imported (about 3 s a rank on a 2-core CPU
node, more with CUDA's libraries).

A rank's torch.distributed variables, its node and Ray's job id differ from one trial to the next and nothing
reads them at import: the zygote serves every rank whose environment differs in those alone (`PER_RANK`), each
child taking its own values. CUDA_VISIBLE_DEVICES is one of them: CUDA starts in the rank, never in a zygote.
A rank the host cannot fork (the host lost with its node, a zygote that cannot start, a platform other than
Linux, ADVISOR_FRESH_TRIALS=1) starts fresh from its agent, as before.

A forked rank is the zygote's child, not the agent's: the agent ends it by its token (`end_trial_processes`),
and the driver has each host end whatever still carries the trial's token once the trial is over however it
ended; a node lost takes its host, the zygote and the ranks with it (each dies with its parent).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from advisor.trials.harness.torchrun_rank import TORCHRUN_VARIABLES
from advisor.trials.launch.zygote import PER_TRIAL
from advisor.trials.record import TRIAL_NODE

# What an agent sets for each rank beside torchrun's own variables (`NodeAgent.run`), and what Ray sets per worker.
PER_RANK = PER_TRIAL + TORCHRUN_VARIABLES + (
    TRIAL_NODE, "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "RAY_JOB_ID",
    "CUDA_VISIBLE_DEVICES")
HOST_CALLS = 64  # the host's calls at once: a fork or a wait for each rank of the trials on its node


class NodeHost:
    """One node's zygote for the driver's ranks there (a Ray actor of no CPU): forks a rank, reports its end."""

    def __init__(self) -> None:
        self.ranks: dict[int, Any] = {}  # forked and not yet waited for, by pid

    def fork(self, config: dict[str, Any], cwd: str, env: dict[str, str], log_path: str,
             timeout_s: float) -> dict[str, int] | None:
        """Fork the harness with `config` in `env` (one rank's): its pid and the zygote's; None where the rank
        must start fresh."""
        from advisor.trials.launch.zygote import start_trial

        rank = start_trial(sys.executable, config, cwd, env, log_path, timeout_s, per_trial=PER_RANK)
        if rank is None:
            return None
        self.ranks[rank.pid] = rank
        return {"pid": rank.pid, "zygote": rank.zygote.proc.pid}

    def wait(self, pid: int) -> int:
        """The exit code of the rank `pid` once it has ended (negative: the signal that ended it)."""
        return self.ranks.pop(pid).wait()

    def end(self, token: str) -> None:
        """End whatever on this node still carries the trial's `token` (its ranks and what they started)."""
        from advisor.trials.launch.processes import end_trial_processes

        end_trial_processes(os.getpid(), token)


class HostedRank:
    """A rank forked by its node's host, waited for as a subprocess.Popen is (pid, wait)."""

    def __init__(self, ray: Any, host: Any, pid: int, zygote: int):
        self.ray, self.host, self.pid, self.zygote = ray, host, pid, zygote

    def wait(self) -> int:
        """Its exit code; 1 where the host was lost before it could say (the rank died with it)."""
        try:
            return self.ray.get(self.host.wait.remote(self.pid))
        except self.ray.exceptions.RayError:
            return 1


def forked_rank(host: Any, config: dict[str, Any], cwd: str, env: dict[str, str], log_path: str,
                timeout_s: float) -> HostedRank | None:
    """In an agent: the rank forked by its node's `host`, or None where it must start fresh."""
    import ray

    if host is None:
        return None
    try:
        forked = ray.get(host.fork.remote(config, cwd, env, log_path, timeout_s), timeout=timeout_s)
    except ray.exceptions.RayError:  # GetTimeoutError among them
        return None
    return None if forked is None else HostedRank(ray, host, forked["pid"], forked["zygote"])


# The driver's hosts, by its connection to the cluster (Ray's job id: a process that connects anew owns none of the
# old ones, which went with its last connection), node id and runtime environment (its priority).
_hosts: dict[tuple[str, str, str], Any] = {}


def host_for(ray: Any, node_id: str, runtime_env: dict[str, Any]) -> Any:
    """The driver's host on node `node_id`, started at its first trial there."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    key = (ray.get_runtime_context().get_job_id(), node_id, json.dumps(runtime_env, sort_keys=True))
    if key not in _hosts:
        _hosts[key] = ray.remote(NodeHost).options(
            num_cpus=0, max_concurrency=HOST_CALLS, runtime_env=runtime_env,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    return _hosts[key]


def end_on_hosts(ray: Any, hosts: list[Any], token: str, timeout_s: float) -> None:
    """Have each host end what still carries the trial's `token` on its node. Where one does not answer (its
    node lost), the driver lets go of these hosts: a node's next trial starts a host anew."""
    try:
        ray.get([host.end.remote(token) for host in hosts], timeout=timeout_s)
    except ray.exceptions.RayError:  # GetTimeoutError among them
        for key in [k for k, h in _hosts.items() if any(h is host for host in hosts)]:
            del _hosts[key]

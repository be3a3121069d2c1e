"""A data-parallel trial on a Ray cluster: the whole NNODES × NPROC-rank job, one placement group per trial.

`run_trial(TrialSpec(..., ray_address=ADDRESS, nnodes=N, nproc_per_node=G))` prepares the trial as for torchrun (its
record, the harness's config) and hands it to `run_ray_job`, which

1. reserves a placement group of N bundles, STRICT_SPREAD (one per node), each G ranks' CPUs (and GPUs),
   and names it in the record (`ray.placement_group`);
2. starts a `NodeAgent` actor in each bundle: the agent of bundle 0 names its node's address and a free
   port (MASTER_ADDR, MASTER_PORT), and every agent starts its G ranks as torchrun would, each the harness
   with torch.distributed's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
   MASTER_ADDR, MASTER_PORT), writing into a scratch folder on its own node: forked from the zygote its node's
   host keeps for the driver (`advisor.trials.launch.ray_hosts`: torch imported once a node, not once a rank
   and trial), else fresh; agents and ranks run at the driver's priority (its nice value), not at the nice 15
   Ray gives its workers;
3. gets every agent's files back as the agent's return value (Ray's object store: no shared filesystem),
   writes them into the trial folder under the names a local data-parallel trial has, and completes the
   record as for torchrun (`complete_record`: every rank's steps, the job's samples/s, one trace per rank).

Faults: a rank that fails ends the trial with its traceback and its node; once a node reports a failed
rank, the others get FAILURE_GRACE_S to fail after it and are then stopped; the time limit stops every
rank (status "timeout"); a node lost mid-trial fails the trial, naming it; Ctrl-C stops the job and marks
the trial interrupted. The actors are killed and the placement group removed however the trial ends;
the ranks carry the trial's token like any trial's processes, and are ended by it on every node (a rank started
fresh also dies with its agent, PR_SET_PDEATHSIG; a forked one with its node's host).

Ray is optional (`pip install 'torch-advisor[ray]'`) and imported only here, inside functions.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Callable

from advisor.errors import AdvisorError
from advisor.trials.launch.ray_hosts import end_on_hosts, host_for
from advisor.trials.record import LOG_FILE, TRIAL_FILE, TrialResult, complete_record
from advisor.trials.record.storage import write_json_atomic

RAY_MISSING = ("--ray needs the ray package on this machine and every node: pip install 'torch-advisor[ray]' "
               "(from a checkout: pip install -e '.[ray]')")
FAILURE_GRACE_S = 10.0  # how long the other nodes' ranks get to fail after a rank failed, before they are stopped
COLLECT_S = 30.0  # how long stopped agents get to hand back what their ranks wrote
PLACEMENT_S = 120.0  # how long a trial waits for the cluster to place its bundles (at most its time limit)
# Ray starts its workers, and so our agents and the ranks they start, at nice 15: wherever anything else runs
# on a node, the ranks would get a sliver of the CPU and measure slow. The variable, in the agent's runtime
# environment, gives it (and its ranks) the driver's own priority, as a local trial's processes have; Ray's
# job supervisor sets it to 0 for a job's driver in the same way.
NICENESS_VARIABLE = "RAY_worker_niceness"


def import_ray() -> Any:
    """The ray module, or AdvisorError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise AdvisorError(RAY_MISSING) from None
    return ray


def is_loopback(address: str) -> bool:
    """Whether a Ray address ("host:port", "ray://host:port") names this machine's loopback."""
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Ray's Linux default takes "127.0.0.1" for "this machine" and dials the machine's network address instead
# (for the GCS and as the driver's own address); with this variable off, as Ray sets it for one machine on
# macOS and Windows, loopback stays loopback. Read when ray is imported.
SINGLE_MACHINE_VARIABLE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def ray_installed() -> None:
    """AdvisorError saying how to install ray when it is not (without importing it)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise AdvisorError(RAY_MISSING)


def connect(address: str) -> Any:
    """Join the cluster at `address` as its driver (once per process); returns the ray module. A cluster on
    loopback is joined on 127.0.0.1 too: the driver then never binds to, or connects through, the machine's
    network address (ray must not have been imported before)."""
    if is_loopback(address):
        os.environ.setdefault(SINGLE_MACHINE_VARIABLE, "0")
    ray = import_ray()
    if ray.is_initialized():
        return ray
    options: dict[str, Any] = {"address": address, "log_to_driver": False, "logging_level": "warning"}
    if is_loopback(address):
        options["_node_ip_address"] = "127.0.0.1"
    try:
        ray.init(**options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise AdvisorError(f"--ray {address}: cannot join the Ray cluster: {exc}") from None
    return ray


# --------------------------------------------------------------------------------------------------
# On each node


class NodeAgent:
    """One node's share of a trial (a Ray actor in one bundle): starts its ranks, waits, hands back their files."""

    def __init__(self, token: str):
        import threading

        self.token = token
        self.node: str | None = None  # the job's node this agent runs (its ranks carry it as TRIAL_NODE)
        self.processes: list[Any] = []
        self.cleaned = threading.Event()  # `run` has ended its ranks and removed its scratch folder

    def where(self) -> dict[str, Any]:
        """This node: its address, Ray's id for it, and a port free on it (for rank 0's store)."""
        import socket

        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            port = s.getsockname()[1]
        return {"ip": ip, "node_id": ray.get_runtime_context().get_node_id(), "port": port, "pid": os.getpid()}

    def run(self, config: dict[str, Any], env: dict[str, str], ranks: list[int], world_size: int,
            master: dict[str, Any], node_rank: int, host: Any = None, timeout_s: float = PLACEMENT_S) -> dict[str, Any]:
        """Start these ranks (the harness, torchrun's environment: forked by the node's `host` where it can, else
        fresh), wait for them, return every file they wrote and the zygote they were forked from (None: fresh)."""
        import shutil
        import subprocess
        import sys
        import tempfile

        from advisor.trials.record import TRIAL_NODE
        from advisor.trials.launch.commands import HARNESS_ENTRY
        from advisor.trials.launch.ray_hosts import forked_rank

        self.node = str(node_rank)
        scratch = Path(tempfile.mkdtemp(prefix=f"advisor-ray-{self.token}-"))  # the token: whose it is
        # Not under torchrun: each rank dies with this agent (the parent it is told), as a lone trial does.
        config = dict(config, out_dir=str(scratch), torchrun=False, parent=os.getpid())
        try:
            # Ray sets OMP_NUM_THREADS to its workers' CPUs; torchrun sets 1 with several ranks a node, else nothing.
            node_env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
            if len(ranks) > 1:
                node_env["OMP_NUM_THREADS"] = "1"
            for local, rank in enumerate(ranks):
                rank_env = {**node_env, **env, "RANK": str(rank), "LOCAL_RANK": str(local),
                            "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(len(ranks)),
                            "GROUP_RANK": str(node_rank), "GROUP_WORLD_SIZE": str(world_size // len(ranks)),
                            "ROLE_NAME": "default", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world_size),
                            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
                            "TORCHELASTIC_RUN_ID": self.token, "MASTER_ADDR": master["ip"],
                            "MASTER_PORT": str(master["port"]), TRIAL_NODE: self.node}
                log, cwd = scratch / f"output.rank{rank}.log", Path(config["script"]).parent
                forked = forked_rank(host, config, str(cwd), rank_env, str(log), timeout_s)
                if forked is not None:
                    self.processes.append(forked)
                    continue
                with open(log, "wb") as out:
                    self.processes.append(subprocess.Popen(
                        [sys.executable, "-c", HARNESS_ENTRY, json.dumps(config)], cwd=cwd,
                        env=rank_env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT))
            codes = [p.wait() for p in self.processes]
            files = {p.name: p.read_bytes() for p in scratch.iterdir() if p.is_file()}
            zygotes = {getattr(p, "zygote", None) for p in self.processes}
            return {"codes": codes, "files": files, "zygote": zygotes.pop() if len(zygotes) == 1 else None}
        finally:
            self._end_ranks()
            shutil.rmtree(scratch, ignore_errors=True)
            self.cleaned.set()

    def stop(self) -> None:
        """End this node's ranks, and return once `run` has cleaned up after them: the driver kills this
        actor next, which would otherwise leave the scratch folder behind."""
        self._end_ranks()
        if self.node is not None:  # `run` has started (it names the node first)
            self.cleaned.wait(COLLECT_S)

    def _end_ranks(self) -> None:
        """End this node's ranks and whatever they started (DataLoader workers): those with the trial's token
        and this node's (another node of the job may share the machine, its ranks still at work)."""
        from advisor.trials.launch.processes import end_trial_processes

        for process in self.processes:
            end_trial_processes(process.pid, self.token, self.node)


# --------------------------------------------------------------------------------------------------
# On the driver


def run_ray_job(record: dict[str, Any], out: Path, config: dict[str, Any], env: dict[str, str], started: float, *,
                address: str, nnodes: int, nproc_per_node: int, timeout_s: float,
                on_start: Callable[[int, str], None] | None = None) -> TrialResult:
    """Run the prepared trial (`record`, the harness's `config`, the ranks' `env`) as one job on the cluster;
    write its files into `out` and complete its record. Ctrl-C stops the job, marks the trial interrupted
    and re-raises KeyboardInterrupt."""
    ray = connect(address)
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    world_size = nnodes * nproc_per_node
    gpus = nproc_per_node if record["device"] == "cuda" or (
        record["device"] == "auto" and ray.cluster_resources().get("GPU")) else 0
    bundle = {"CPU": nproc_per_node, **({"GPU": gpus} if gpus else {})}
    group = placement_group([bundle] * nnodes, strategy="STRICT_SPREAD")
    # The placement group's id: `ray.util.placement_group_table()` tells whether the trial gave its CPUs back.
    record.update(nproc_per_node=nproc_per_node, ray={"address": address, "nnodes": nnodes, "nodes": [],
                                                      "placement_group": group.id.hex()})
    write_json_atomic(out / TRIAL_FILE, record)
    agents: list[Any] = []
    hosts: list[Any] = []
    deadline = time.monotonic() + timeout_s
    if on_start is not None:  # a killed session's --resume ends whatever this machine still runs of the trial
        on_start(os.getpid(), record["token"])
    try:
        ready, _ = ray.wait([group.ready()], timeout=min(PLACEMENT_S, timeout_s))
        if not ready:
            record.update(status="error", message=f"the Ray cluster at {address} could not place {nnodes} bundles "
                          f"of {bundle} on {nnodes} different nodes (STRICT_SPREAD) within "
                          f"{min(PLACEMENT_S, timeout_s):g} s; it has {ray.cluster_resources()}")
            return _complete(record, out, started, world_size, {})
        agent_class = ray.remote(NodeAgent)
        runtime_env = {"env_vars": {NICENESS_VARIABLE: str(os.nice(0))}}
        # Each bundle's node has the driver's host (started now at its first trial, beside the agents' start).
        placed = ray.util.placement_group_table(group).get("bundles_to_node_id") or {}
        hosts = [host_for(ray, placed[i], runtime_env) if placed.get(i) else None for i in range(nnodes)]
        agents = [agent_class.options(num_cpus=nproc_per_node, num_gpus=gpus, max_concurrency=2,
                                      runtime_env=runtime_env,
                                      scheduling_strategy=PlacementGroupSchedulingStrategy(
                                          group, placement_group_bundle_index=i)).remote(record["token"])
                  for i in range(nnodes)]
        nodes = ray.get([a.where.remote() for a in agents], timeout=max(1.0, deadline - time.monotonic()))
        record["ray"]["nodes"] = [{"node": i, "ip": n["ip"], "node_id": n["node_id"],
                                   "ranks": list(range(i * nproc_per_node, (i + 1) * nproc_per_node))}
                                  for i, n in enumerate(nodes)]
        runs = [agent.run.remote(config, env, node["ranks"], world_size, nodes[0], node["node"], host,
                                 max(1.0, deadline - time.monotonic()))
                for agent, node, host in zip(agents, record["ray"]["nodes"], hosts)]
        returned = _wait(ray, runs, agents, record, deadline, timeout_s)
        return _complete(record, out, started, world_size, returned)
    except KeyboardInterrupt:
        _stop(ray, agents)
        record.update(status="interrupted", message="interrupted (Ctrl-C); the job's ranks on every node were stopped")
        _complete(record, out, started, world_size, {})
        raise
    except ray.exceptions.GetTimeoutError:
        record.update(status="timeout", message=f"the trial exceeded its time limit of {timeout_s:g} s")
        return _complete(record, out, started, world_size, {})
    except ray.exceptions.RayError as exc:  # an agent lost before its ranks started (its node gone)
        record.update(status="error", error_type="NodeLost", message=f"a node was lost as the job started: "
                      f"{_first_line(exc)}")
        return _complete(record, out, started, world_size, {})
    finally:
        for agent in agents:
            ray.kill(agent)  # the ranks it started fresh follow it (PR_SET_PDEATHSIG)
        # And the ranks its host forked, whatever happened.
        end_on_hosts(ray, [host for host in hosts if host is not None], record["token"], COLLECT_S)
        remove_placement_group(group)


def _wait(ray: Any, runs: list[Any], agents: list[Any], record: dict[str, Any], deadline: float,
          timeout_s: float) -> dict[int, dict[str, Any]]:
    """Every node's return, by node; the trial's status set where the job did not end by itself (the time
    limit, a lost node). A failed rank gives the other nodes FAILURE_GRACE_S before they are stopped."""
    returned: dict[int, dict[str, Any]] = {}
    pending = dict(enumerate(runs))
    stop_at = deadline
    while pending:
        done, _ = ray.wait(list(pending.values()), num_returns=1, timeout=max(0.0, stop_at - time.monotonic()))
        if not done:
            break
        node = next(i for i, ref in pending.items() if ref == done[0])
        del pending[node]
        try:
            returned[node] = ray.get(done[0])
        except ray.exceptions.RayError as exc:  # the node, or its agent, is gone
            where = record["ray"]["nodes"][node]
            record.update(status="error", error_type="NodeLost",
                          message=f"node {node} ({where['ip']}) was lost mid-trial: {_first_line(exc)}")
            stop_at = min(stop_at, time.monotonic())
            continue
        if any(code != 0 for code in returned[node]["codes"]) or _failed_ranks(returned[node]["files"]):
            stop_at = min(stop_at, time.monotonic() + FAILURE_GRACE_S)
    if pending:
        if record["status"] == "running" and stop_at >= deadline:
            record.update(status="timeout", message=f"the trial exceeded its time limit of {timeout_s:g} s")
        _stop(ray, [agents[i] for i in pending])
        for node, ref in pending.items():  # what the stopped ranks wrote so far
            try:
                returned[node] = ray.get(ref, timeout=COLLECT_S)
            except ray.exceptions.RayError:
                pass
    return returned


def _failed_ranks(files: dict[str, bytes]) -> list[str]:
    """The result files of ranks that did not end "ok"."""
    failed = []
    for name, data in files.items():
        if name.startswith("harness.rank"):
            try:
                status = json.loads(data).get("status")
            except (ValueError, AttributeError):
                status = None
            if status != "ok":
                failed.append(name)
    return failed


def _stop(ray: Any, agents: list[Any]) -> None:
    """Ask agents to end their ranks (their `run` then returns what the ranks wrote)."""
    try:
        ray.get([agent.stop.remote() for agent in agents], timeout=COLLECT_S)
    except ray.exceptions.RayError:
        pass  # a lost agent's ranks died with it


def _complete(record: dict[str, Any], out: Path, started: float, world_size: int,
              returned: dict[int, dict[str, Any]]) -> TrialResult:
    """Write the nodes' files into the trial folder (one log, each rank's part headed), complete the record as
    a local data-parallel trial's, and name the node of the rank that failed."""
    logs = []
    for node in sorted(returned):
        # The zygote its node's ranks were forked from (`ray_hosts`); None: they started fresh.
        record["ray"]["nodes"][node]["zygote"] = returned[node].get("zygote")
        for name, data in sorted(returned[node]["files"].items()):
            if name.startswith("output.rank"):
                rank = name.removeprefix("output.rank").removesuffix(".log")
                logs.append(f"--- rank {rank} on node {node} ---\n".encode() + data)
            else:
                (out / name).write_bytes(data)
    (out / LOG_FILE).write_bytes(b"".join(logs))
    result = complete_record(record, out, started, world_size)
    message = _with_node(record.get("message") or "", record["ray"]["nodes"])
    if message != record.get("message"):
        record["message"] = message
        write_json_atomic(out / TRIAL_FILE, record)
        result = TrialResult.from_record(record, out)
    return result


def _with_node(message: str, nodes: list[dict[str, Any]]) -> str:
    """'rank 1: ValueError ...' -> 'rank 1 (node 1, 10.0.0.2): ValueError ...'."""
    match = re.match(r"rank (\d+)", message)
    if match is None:
        return message
    rank = int(match.group(1))
    node = next((n for n in nodes if rank in n["ranks"]), None)
    if node is None:
        return message
    return f"rank {rank} (node {node['node']}, {node['ip']}){message[match.end():]}"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]

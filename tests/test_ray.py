"""Trials on a Ray cluster: a local cluster of two Ray nodes (2 CPUs each, every Ray process on 127.0.0.1),
started once for the module; each trial is the whole 2-node × 1-rank gloo job, placed by Ray, its records
brought back through Ray. A session on the DDP example (its baseline: one trace per rank, the job's figures,
the straggler named), a failing rank, a hanging rank, Ctrl-C, a node lost mid-trial; after each, the trial's
placement group is removed and no rank process is left, and once no trial runs every CPU of the cluster is
free; no Ray socket leaves loopback. The hanging rank's trial waits out its time limit beside the session's
second trial and the tests after it, on the second CPU of each node."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from session_checks import assert_decisions_follow_measurements
from test_distributed import DDP_EXAMPLE, left_behind, ranks_script
from trial_helpers import trial_record

from advisor.analysis.analyze import analyze_path
from advisor.analysis.job import jobs_of
from advisor.trials.knobs import Knobs
from advisor.trials.launch.ray_job import SINGLE_MACHINE_VARIABLE, connect
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from advisor.trials.launch.zygote import ZYGOTE_ENTRY
from conftest import run_advisor

pytestmark = pytest.mark.slow
# Before ray is imported (as `connect` does for a cluster on loopback): 127.0.0.1 stays 127.0.0.1.
os.environ[SINGLE_MACHINE_VARIABLE] = "0"
ray = pytest.importorskip("ray")
# A trial takes one CPU on each node: the hanging rank's trial idles out its time limit on the second.
NODE_CPUS = 2


def ray_processes() -> list[psutil.Process]:
    """This process (the driver) and everything it started: the cluster's processes, their workers, the ranks;
    not the zygote this process's local trials are forked from (advisor.trials.launch.zygote), nor its children."""
    me = psutil.Process()
    found = [me]
    for proc in me.children():
        try:
            if ZYGOTE_ENTRY not in proc.cmdline():
                found += [proc, *proc.children(recursive=True)]
        except psutil.Error:
            continue
    return found


def off_loopback() -> list[tuple]:
    """Internet sockets of those processes that listen on, or connect to, anything but loopback."""
    found = []
    for proc in ray_processes():
        try:
            for conn in proc.net_connections(kind="inet"):
                for address in (conn.laddr, conn.raddr):
                    ip = ipaddress.ip_address(address.ip) if address else None
                    if ip is not None and not (getattr(ip, "ipv4_mapped", None) or ip).is_loopback:
                        found.append((proc.name(), conn.status, conn.laddr, conn.raddr))
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("RAY_ADDRESS")}
    # Gloo picks the interface the host name resolves to unless told: the ranks' sockets stay on loopback too.
    saved_gloo, os.environ["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME"), "lo"
    # The two "nodes" share this machine's cores, as two ranks of one torchrun node do (torchrun gives them one
    # thread each): the driver's setting travels to the ranks.
    saved_threads, os.environ["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS"), "1"
    # A node killed by the node-lost test is found dead after a few refused health checks, not Ray's default
    # of five checks 3 s apart. A slow answer still has the default time to come on a busy machine.
    # No idle workers started for each driver that connects (Ray's default, for tasks): each trial's agents are
    # actors, which start workers of their own (the module: 66 -> 57 CPU-s).
    system = {"health_check_initial_delay_ms": 1000, "health_check_period_ms": 500,
              "health_check_failure_threshold": 4, "prestart_worker_first_driver": False}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": NODE_CPUS, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False, "_system_config": system})
    try:
        cluster.add_node(num_cpus=NODE_CPUS, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        connect(cluster.address)  # this process is a driver too: the in-process trials', and to read the resources
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        os.environ.update(saved)
        for name, value in (("GLOO_SOCKET_IFNAME", saved_gloo), ("OMP_NUM_THREADS", saved_threads)):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    deadline = time.monotonic() + 30
    while ray_processes()[1:] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not ray_processes()[1:], "the Ray cluster left processes behind"


def scratch_folders(record: dict) -> set[Path]:
    """The trial's scratch folders on this machine (both nodes' here), where its ranks write."""
    return set(Path(tempfile.gettempdir()).glob(f"advisor-ray-{record['token']}-*"))


def assert_cleaned_up(record: dict) -> None:
    """The trial's placement group is removed (its CPUs given back, its agents gone), no rank is left, and no
    scratch folder."""
    group = record["ray"]["placement_group"]
    deadline = time.monotonic() + 20
    while ray.util.placement_group_table().get(group, {}).get("state") != "REMOVED" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.util.placement_group_table()[group]["state"] == "REMOVED"
    assert not left_behind(record["token"])
    assert not scratch_folders(record)


def assert_every_cpu_free(nodes: int = 2) -> None:
    """Once no trial runs: every CPU of the cluster's `nodes` nodes is free (nothing else holds one). A node just
    lost stays in the cluster's resources until its health checks fail: waited for, as the free CPUs are."""
    def counts() -> tuple:
        return ray.available_resources().get("CPU"), ray.cluster_resources().get("CPU")

    deadline = time.monotonic() + 20
    while counts() != (nodes * NODE_CPUS,) * 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert counts() == (nodes * NODE_CPUS,) * 2


def first_trial_done(out: Path, driver: subprocess.Popen) -> dict:
    """The record of the session's first trial once it has ended (the session's driver still running)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and driver.poll() is None:
        for path in sorted(out.glob("trials/*/trial.json")):  # written whole (write_json_atomic)
            record = trial_record(path.parent)
            if record["status"] != "running":
                return record
        time.sleep(0.2)
    raise AssertionError(f"the session's first trial did not end (driver exit code {driver.poll()})")


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """A session of 2 trials (the baseline and the move its job's bound calls for) run by the command line, a
    driver of its own (which keeps itself on loopback); and, from the end of its baseline, a trial whose rank 1
    hangs at step 4 (this process its driver), with a time limit set from that baseline's start-up: the
    session, its hanging trial (a Future) and that limit."""
    out = tmp_path_factory.mktemp("ray") / "session"
    env = {k: v for k, v in os.environ.items() if k != SINGLE_MACHINE_VARIABLE}
    command = [sys.executable, "-m", "advisor.cli", "profile", "--ray", cluster.address, "--nnodes", "2",
               "--nproc-per-node", "1", "--steps", "2", "--wait", "1", "--warmup", "1", "--device", "cpu",
               "--windows", "2", "--window", "0.3", "--max-trials", "2", "--out", str(out),
               str(DDP_EXAMPLE), "--", "--slow-rank", "1"]
    output = out.with_name("driver.log")  # a file: a pipe nobody reads while the session runs would fill up
    with open(output, "w") as log:
        driver = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    with ThreadPoolExecutor(max_workers=1) as background:
        try:
            baseline = first_trial_done(out, driver)
            assert baseline["status"] == "ok", baseline.get("message")
            times = baseline["times"]
            # Time enough to reach step 4 at the baseline's start-up, with room for a machine grown busier since
            # (twice that and 5 s was too little beside a CPU-bound process).
            limit = round(3 * (times["first_step_at"] - times["started_at"]) + 10)
            script = ranks_script(tmp_path_factory.mktemp("hang"), fail_at=4, failure="hang")
            hanging = background.submit(run_trial, TrialSpec(f"{script}:train_step", Knobs(), script.parent / "t",
                                                             steps=10, device="cpu", nproc_per_node=1, nnodes=2,
                                                             ray_address=cluster.address, timeout_s=limit))
            driver.wait(timeout=600)
            assert driver.returncode == 0, output.read_text()[-4000:]
            yield out, json.loads((out / "session.json").read_text()), hanging, limit
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()


@pytest.fixture(scope="module")
def session(runs):
    """The session's folder and its session.json."""
    return runs[:2]


def test_each_trial_is_the_two_node_job_with_every_rank_brought_back(session):
    out, state = session
    baseline = trial_record(out / state["trials"][0]["folder"])
    assert baseline["status"] == "ok", baseline["message"]
    assert baseline["world_size"] == 2 and [r["rank"] for r in baseline["ranks"]] == [0, 1]
    nodes = baseline["ray"]["nodes"]
    assert [n["ranks"] for n in nodes] == [[0], [1]] and len({n["node_id"] for n in nodes}) == 2  # STRICT_SPREAD
    assert sorted(name.split(".")[0] for name in baseline["trace_files"]) == ["trial_rank0", "trial_rank1"]
    assert "--- rank 1 on node 1 ---" in (out / state["trials"][0]["folder"] / "output.log").read_text()
    # The ranks run at the driver's priority (this process's, which the CLI's inherits), not Ray's nice 15
    # for its workers (beside two CPU-bound processes, their first step took 63 s at nice 15, 2.4 s quiet).
    assert baseline["device_facts"]["cpu"]["niceness"] == os.nice(0)
    # The job's samples/s (both ranks'), and the job's analysis: rank 1's slow loader makes it the straggler.
    rates = [r["summary"]["samples_per_s"] for r in baseline["ranks"]]
    assert baseline["summary"]["samples_per_s"] == pytest.approx(sum(rates))
    (job,) = jobs_of(analyze_path(out / state["trials"][0]["folder"]))
    assert job.rank_numbers == (0, 1) and job.backend == "gloo"
    assert job.straggler is not None and job.straggler.rank == 1 and job.straggler.bound == "input"


def test_a_session_on_ray_decides_on_the_jobs_figures(session):
    out, state = session
    assert state["status"] == "done" and len(state["trials"]) == 2 and (out / "report.html").is_file()
    assert state["trials"][0]["samples_per_s"] == pytest.approx(
        trial_record(out / state["trials"][0]["folder"])["summary"]["samples_per_s"], rel=0.05)
    # The job's bound is rank 1's loader, not rank 0's waiting in the all-reduce.
    assert state["trials"][1]["recommendation"] == "more-workers" and state["trials"][1]["tried_under"] == "input"
    # ... and the model prices it from rank 1's wait, not rank 0's (the job's own summary: +0 %, for +105 %).
    assert state["trials"][1]["predicted_samples_gain"] > 0.3
    assert_decisions_follow_measurements(state)  # kept or reverted on the job's samples/s and its noise
    for row in state["trials"]:
        record = trial_record(out / row["folder"])
        assert record["world_size"] == 2 and len(record["ray"]["nodes"]) == 2
        assert_cleaned_up(record)


def test_each_nodes_ranks_are_forked_from_one_zygote_through_the_session(session):
    out, state = session
    zygotes = [{n["node_id"]: n["zygote"] for n in trial_record(out / row["folder"])["ray"]["nodes"]}
               for row in state["trials"]]
    assert None not in zygotes[0].values() and len(set(zygotes[0].values())) == 2, zygotes  # one on each node
    # The second trial's ranks (on the same two nodes, in either order) started with torch imported.
    assert zygotes[1] == zygotes[0]


def test_a_failing_rank_is_named_with_its_traceback_and_node(cluster, tmp_path):
    script = ranks_script(tmp_path, fail_at=4)
    trial = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=10, device="cpu",
                                nproc_per_node=1, nnodes=2, ray_address=cluster.address, timeout_s=300))
    assert trial.status == "error"
    assert trial.message.startswith("rank 1 (node 1, 127.0.0.1): ValueError in step 4: rank one broke"), trial.message
    assert "rank one broke" in trial.traceback and "in train_step" in trial.traceback
    assert_cleaned_up(trial_record(trial.path))


def test_without_ray_the_option_says_how_to_install_it(tmp_path):
    # The ray package hidden from the advisor's process (None in sys.modules: its import fails).
    code = ("import sys; sys.modules['ray'] = None; from advisor.cli import main; "
            f"sys.exit(main(['profile', '--ray', '127.0.0.1:6379', '--nnodes', '2', {str(DDP_EXAMPLE)!r}]))")
    done = run_advisor_python(code, tmp_path)
    assert done.returncode == 2 and "pip install 'torch-advisor[ray]'" in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()


def run_advisor_python(code: str, cwd):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_nnodes_needs_ray(tmp_path):
    done = run_advisor("profile", "--nnodes", "2", str(DDP_EXAMPLE), cwd=tmp_path)
    assert done.returncode == 2 and "--nnodes: only with --ray" in done.stderr
    assert json.dumps(done.stderr).count("\\n") == 1  # one line


def once_every_rank_runs(folder, action) -> threading.Thread:
    """A thread that calls `action` once both ranks of the trial in `folder` run (found by the trial's token)."""
    def watch():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                token = trial_record(folder)["token"]
            except (OSError, ValueError):
                token = None
            if token and len(left_behind(token)) >= 2:
                action()
                return
            time.sleep(0.2)

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


def test_ctrl_c_stops_the_job_on_every_node_and_marks_the_trial_interrupted(cluster, tmp_path):
    script = ranks_script(tmp_path, fail_at=4, failure="hang")
    # A shell starts background jobs (`make test &`) with SIGINT ignored, and the test workers inherit that:
    # this process's own Ctrl-C would never arrive. A terminal's Ctrl-C reaches Python's handler, as here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    thread = once_every_rank_runs(tmp_path / "t", lambda: os.kill(os.getpid(), signal.SIGINT))  # Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        try:
            run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=10, device="cpu",
                                nproc_per_node=1, nnodes=2, ray_address=cluster.address, timeout_s=300))
        finally:
            thread.join()
            signal.signal(signal.SIGINT, previous)
    record = trial_record(tmp_path / "t")
    assert record["status"] == "interrupted" and "every node" in record["message"]
    assert_cleaned_up(record)


def test_a_hanging_rank_ends_at_the_time_limit(runs):
    # Its trial has run beside the session's second trial and the tests above (a CPU of each node its own).
    _, _, hanging, limit = runs
    trial = hanging.result(timeout=limit + 120)
    assert trial.status == "timeout" and f"time limit of {limit} s" in trial.message
    record = trial_record(trial.path)
    assert [len(r["steps"]) >= 4 for r in record["ranks"]] == [True, True]  # what the ranks measured came back
    assert_cleaned_up(record)
    assert_every_cpu_free()  # the session, the failing rank's trial and this one all gave theirs back


def test_no_ray_socket_leaves_loopback(cluster):
    # While the cluster, its workers and this driver's connection are all up, after the trials above ran.
    assert len(ray_processes()) > 3
    assert not off_loopback()


# The module's last test: the cluster keeps one node from here on (adding the lost one back: 4 CPU-s).
def test_a_node_lost_mid_trial_fails_the_trial_and_nothing_is_left(cluster, tmp_path):
    script = ranks_script(tmp_path, fail_at=4, failure="hang")
    worker = next(node for node in cluster.list_all_nodes() if node is not cluster.head_node)
    thread = once_every_rank_runs(tmp_path / "t", lambda: cluster.remove_node(worker, allow_graceful=False))
    try:
        trial = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=10, device="cpu",
                                    nproc_per_node=1, nnodes=2, ray_address=cluster.address, timeout_s=300))
    finally:
        thread.join()
    assert worker not in cluster.list_all_nodes()
    assert trial.status == "error" and re.match(r"node [01] \(127\.0\.0\.1\) was lost mid-trial", trial.message), \
        trial.message
    # The node that lived removed its scratch folder; the lost one could not (on a real cluster it is another
    # machine's): here they share /tmp, so the test takes away the one it left.
    record = trial_record(trial.path)
    left = scratch_folders(record)
    assert len(left) <= 1, left
    for folder in left:
        shutil.rmtree(folder)
    assert_cleaned_up(record)
    assert_every_cpu_free(nodes=1)  # the node left standing

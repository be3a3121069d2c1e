"""Data-parallel trials on the CPU: torchrun starts two gloo ranks of DistributedDataParallel, every rank is
profiled and measured with the same knobs, DDP's own arguments are knobs, a failing or hanging rank ends
the trial cleanly, and a session runs on the examples' DDP classifier end to end."""

from __future__ import annotations

import json

import psutil
import pytest
from trial_helpers import trial_record, write_script

from advisor.analysis.analyze import analyze_path
from advisor.analysis.job import jobs_of
from advisor.search.session import run_session
from advisor.search.state import SessionOptions
from advisor.trials.knobs import APPLIED, Knobs
from advisor.trials.record import TRIAL_TOKEN
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from advisor.trials.launch.zygote import ZYGOTE_ENTRY
from conftest import ROOT

pytestmark = pytest.mark.slow
DDP_EXAMPLE = ROOT / "examples" / "ddp_classifier.py"

RANKS = """
    import json, os, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    def train_step(model, optimizer, x, step):
        if step == FAIL_AT and dist.get_rank() == 1:
            if FAILURE == "hang":
                time.sleep(600)  # rank 0 waits for it in the next all-reduce
            if FAILURE == "abort":
                os.abort()  # a native crash: no result, no Python exception; rank 0's peer goes away
            raise ValueError("rank one broke")
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    if __name__ == "__main__":
        dist.init_process_group("gloo")
        model = DistributedDataParallel(torch.nn.Linear(16, 16))
        with open(f"/proc/{os.getppid()}/stat") as f:  # the parent of torchrun's agent, which started this rank
            launcher_parent = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{launcher_parent}/cmdline", "rb") as f:
            launcher_parent = f.read().decode(errors="replace").split("\\0")
        with open(os.path.join(os.path.dirname(__file__), f"ddp.rank{dist.get_rank()}.json"), "w") as f:
            json.dump({"view": model.gradient_as_bucket_view, "bucket": model.bucket_bytes_cap,
                       "launcher_parent": launcher_parent}, f)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(100_000):
            train_step(model, optimizer, torch.randn(8, 16), step)
"""


def ranks_script(folder, fail_at=-1, failure="raise"):
    return write_script(folder, RANKS.replace("FAIL_AT", str(fail_at)).replace("FAILURE", repr(failure)))


def left_behind(token: str) -> list[int]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(TRIAL_TOKEN) == token:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def test_every_rank_is_profiled_and_measured_with_the_same_knobs(tmp_path):
    script = ranks_script(tmp_path)
    knobs = Knobs(ddp_gradient_as_bucket_view=True, ddp_bucket_cap_mb=50)
    trial = run_trial(TrialSpec(f"{script}:train_step", knobs, tmp_path / "t", steps=2, wait=1, warmup=1, device="cpu",
                                windows=2, window_s=0.2, nproc_per_node=2))
    assert trial.ok, trial.message
    record = trial_record(trial.path)
    assert record["world_size"] == 2 and [r["rank"] for r in record["ranks"]] == [0, 1]
    # One trace per rank; the ranks stopped at the same step (they agreed when all were measured).
    assert sorted(name.split(".")[0] for name in record["trace_files"]) == ["trial_rank0", "trial_rank1"]
    assert len(record["ranks"][0]["steps"]) == len(record["ranks"][1]["steps"]) > 2 + 2
    # The job's samples/s is every rank's.
    rates = [r["summary"]["samples_per_s"] for r in record["ranks"]]
    assert record["summary"]["samples_per_s"] == pytest.approx(sum(rates))
    # DistributedDataParallel got the knobs on every rank, and the user's own values were kept.
    assert record["knob_outcomes"]["ddp_gradient_as_bucket_view"] == APPLIED
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"ddp.rank{rank}.json").read_text())
        assert {k: seen[k] for k in ("view", "bucket")} == {"view": True, "bucket": 50 * 2**20}
        # torchrun was forked from this process's zygote (it spares the launcher's import of torch), and the ranks
        # from torchrun (tests/test_zygote.py: a forked rank is what a fresh one would be).
        assert ZYGOTE_ENTRY in seen["launcher_parent"], seen["launcher_parent"]
    assert record["user_values"]["ddp_gradient_as_bucket_view"] is False
    assert not left_behind(record["token"])


def test_the_rank_that_failed_first_is_named_with_its_traceback(tmp_path):
    script = ranks_script(tmp_path, fail_at=4)
    trial = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=10, device="cpu",
                                nproc_per_node=2))
    assert trial.status == "error"
    assert trial.message.startswith("rank 1: ValueError in step 4: rank one broke"), trial.message
    assert "rank one broke" in trial.traceback and 'in train_step' in trial.traceback
    assert not left_behind(trial_record(trial.path)["token"])


def test_a_rank_that_crashes_in_native_code_is_named_not_the_peer_it_left(tmp_path):
    # Rank 0 then fails too (its all-reduce loses the peer) and writes its error first: the crash is the cause.
    script = ranks_script(tmp_path, fail_at=4, failure="abort")
    trial = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=10, device="cpu",
                                nproc_per_node=2))
    assert trial.status == "error"
    assert trial.message.startswith(f"rank 1 crashed: Fatal Python error: Aborted in train_step ({script}, line 11)"), \
        trial.message
    record = trial_record(trial.path)
    assert record["error_type"] == "NativeCrash" and record["retried_after"][0].startswith("rank 1 crashed: ")
    assert (trial.path / "crash.rank1.txt").read_text().startswith("Fatal Python error: Aborted")
    assert not left_behind(record["token"])


def test_a_rank_that_hangs_ends_at_the_time_limit_with_nothing_left(tmp_path, trial_startup_s):
    script = ranks_script(tmp_path, fail_at=4, failure="hang")
    limit = round(2 * trial_startup_s + 5)
    trial = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=10, device="cpu",
                                nproc_per_node=2, timeout_s=limit))
    assert trial.status == "timeout" and f"time limit of {limit} s" in trial.message
    assert not left_behind(trial_record(trial.path)["token"])


def test_a_session_on_the_ddp_example_with_a_straggler(tmp_path):
    out = tmp_path / "session"
    options = SessionOptions(steps=2, wait=1, warmup=1, device="cpu", windows=2, window_s=0.3, max_trials=2,
                             nproc_per_node=2, script_args=("--slow-rank", "1"))
    state = run_session(str(DDP_EXAMPLE), out, options, log=lambda m: None)
    assert state["status"] == "done" and (out / "report.html").is_file()
    baseline = json.loads((out / state["trials"][0]["folder"] / "trial.json").read_text())
    assert baseline["world_size"] == 2 and len(baseline["trace_files"]) == 2
    # The job's samples/s: both ranks' (the slow loader of rank 1 holds rank 0 back as well).
    ranks = [r["summary"]["samples_per_s"] for r in baseline["ranks"]]
    assert baseline["summary"]["samples_per_s"] == pytest.approx(sum(ranks))
    assert state["trials"][0]["samples_per_s"] == pytest.approx(sum(ranks), rel=0.05)
    assert state["trials"][1]["recommendation"] == "more-workers"  # the straggler is bound by its loader
    # The session followed the job, not rank 0 (which alone waits in collectives): the bound is rank 1's loader.
    assert state["trials"][1]["tried_under"] == "input"
    report = (out / "report.html").read_text()
    assert 'class="straggler-row"' in report and "Job: rank 1 is the straggler" in report


def test_a_straggler_made_on_rank_zero_is_found_and_named(tmp_path):
    trial = run_trial(TrialSpec(f"{DDP_EXAMPLE}:train_step", Knobs(), tmp_path / "t", steps=3, wait=1, warmup=1,
                                device="cpu", nproc_per_node=2, script_args=["--slow-rank", "0"]))
    assert trial.ok, trial.message
    (job,) = jobs_of(analyze_path(trial.path))
    assert job.rank_numbers == (0, 1) and job.backend == "gloo"
    assert job.straggler is not None and job.straggler.rank == 0 and job.straggler.bound == "input"
    assert job.ranks[1].communication.exposed_us > job.ranks[0].communication.exposed_us


def test_a_data_parallel_script_without_ranks_asked_for_runs_as_a_one_rank_job(tmp_path):
    """examples/ddp_classifier.py calls init_process_group: with no --nproc-per-node its call makes the trial a
    job of one rank (it failed in init_process_group, RANK not set), and the session says so."""
    out = tmp_path / "session"
    options = SessionOptions(steps=2, wait=1, warmup=0, device="cpu", windows=0, max_trials=1)
    state = run_session(str(DDP_EXAMPLE), out, options, log=lambda m: None)
    row = state["trials"][0]
    assert row["status"] == "ok", row
    record = json.loads((out / row["folder"] / "trial.json").read_text())
    assert record["single_rank_job"] and record["nproc_per_node"] == 1
    assert any("one-rank job (--nproc-per-node N runs N ranks)" in n for n in state["notes"])
    (diagnosis,) = analyze_path(out / row["folder"])
    assert diagnosis.distributed["world_size"] == 1

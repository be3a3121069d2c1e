"""Multi-rank analysis, torch-free: the ranks of a data-parallel job side by side, the straggler named with
its cause, communication split into overlapped and exposed, collectives counted and sized, the job's verdict
and advice; on the shared A100 rank-3-of-8 trace and on 2-rank gloo traces recorded on this machine by
`advisor profile --nproc-per-node 2 examples/ddp_classifier.py:train_step -- --slow-rank 1`
(sample_runs/ddp_classifier), whose rank 1 sleeps in its DataLoader."""

from __future__ import annotations

import dataclasses
import json

import pytest

import advisor
from advisor.analysis.analyze import analyze_path
from advisor.analysis.job import job_diagnosis, jobs_of, own_us
from advisor.report.html import write_report
from advisor.search.bounds import Bound
from advisor.search.state import SessionOptions
from records import session
from advisor.search.strategy import SearchSpace, propose
from advisor.trials.record import load_trial
from conftest import SAMPLE_RUNS, gpu_trace, run_advisor
from trace_builder import TraceBuilder

DDP_RUN = SAMPLE_RUNS / "ddp_classifier"
STRAGGLER = DDP_RUN / "trials" / "00-baseline"  # rank 1's Dataset sleeps 2 ms per item
A100 = "a100-rank3-of-8.pt.trace.json.gz"


def straggler_job():
    (job,) = jobs_of(analyze_path(STRAGGLER))
    return job


def test_the_rank_that_sleeps_in_its_loader_is_named_the_straggler_with_its_cause():
    job = straggler_job()
    assert job.world_size == 2 and job.backend == "gloo" and job.rank_numbers == (0, 1) and not job.missing_ranks
    rank0, rank1 = job.ranks
    s = job.straggler
    assert s is not None and s.rank == 1 and s.bound == "input"
    # Its extra time is in the DataLoader, and rank 0 waits about as long in the all-reduce.
    assert s.excess_by_role_us["dataloader"] == max(s.excess_by_role_us.values())
    assert s.excess_us == pytest.approx(own_us(rank1) - own_us(rank0))
    assert rank0.communication.exposed_us > 0.5 * rank0.step_time_us
    assert rank1.communication.exposed_us < 0.2 * rank1.step_time_us
    assert s.others_wait_us == pytest.approx(rank0.communication.exposed_us)
    # Each rank alone says what it sees: rank 0 waits in collectives, rank 1 on its loader.
    assert rank0.bound == "communication" and rank1.bound == "input"
    # The job is bound by the straggler's loader, and its first advice is that rank's workers.
    assert job.bound == "input" and "rank 1 is the straggler" in job.verdict
    first = job.recommendations[0]
    assert first.id == "straggler-workers" and first.knobs == {"num_workers": "increase"} and first.helps_now
    assert all(r.bound != "communication" for r in job.recommendations)  # the wait is the straggler's doing


def test_collectives_are_counted_and_sized_as_the_model_s_gradients():
    job = straggler_job()
    record = json.loads((STRAGGLER / "trial.json").read_text())
    gradient_bytes = sum(record["model_dtypes"].values())  # parameter bytes, taken inside the trial
    for d in job.ranks:
        c = d.communication
        (all_reduce,) = c.collectives
        assert all_reduce.name == "all_reduce" and all_reduce.count >= 1
        # DDP all-reduces every gradient once per step, in buckets.
        assert all_reduce.bytes == gradient_bytes and all_reduce.largest <= gradient_bytes
        assert c.exposed_us + c.overlapped_us == pytest.approx(c.total_us)
        assert 0 <= c.exposed_us <= c.total_us <= d.step_time_us


def test_one_rank_of_eight_on_an_a100():
    diagnoses = analyze_path(gpu_trace(A100))
    (job,) = jobs_of(diagnoses)
    assert job.world_size == 8 and job.rank_numbers == (3,) and job.missing_ranks == (0, 1, 2, 4, 5, 6, 7)
    assert job.straggler is None and "rank 3 of 8 only" in job.verdict and job.bound == diagnoses[0].bound
    c = diagnoses[0].communication
    assert c.backend == "nccl" and c.rank == 3 and c.world_size == 8
    names = {k.name: k for k in c.collectives}
    assert {"all_reduce", "all_to_all"} <= set(names)
    assert all(k.bytes and k.bytes >= k.largest > 0 for k in names.values())
    # NCCL kernels run beside compute kernels: part of the communication is hidden, part exposed.
    assert 0 < c.exposed_us < c.total_us and c.overlapped_us > 0
    advice = {r.id: r for r in job.recommendations}
    ddp = advice["ddp-buckets"]
    assert ddp.bound == "communication" and ddp.knobs["ddp_gradient_as_bucket_view"] is True
    assert ddp.helps_now == (job.bound == "communication")


def test_advisor_analyze_of_the_folder_shows_the_ranks_side_by_side():
    proc = run_advisor("analyze", str(STRAGGLER))
    assert proc.returncode == 0, proc.stderr
    assert "Ranks side by side (gloo, world size 2)" in proc.stdout
    assert "1  ← straggler" in proc.stdout and "Job: rank 1 is the straggler" in proc.stdout
    proc = run_advisor("analyze", "--json", str(STRAGGLER))
    (job,) = json.loads(proc.stdout)["jobs"]
    assert job["straggler"]["rank"] == 1 and job["straggler"]["bound"] == "input" and job["bound"] == "input"
    assert [r["rank"] for r in job["ranks"]] == [0, 1]
    assert job["ranks"][0]["exposed_communication_ms"] > job["ranks"][1]["exposed_communication_ms"]
    assert job["recommendations"][0]["id"] == "straggler-workers"


def test_the_notebook_gets_per_rank_frames():
    job = advisor.analyze(STRAGGLER)
    assert isinstance(job, advisor.Job) and job.straggler.rank == 1
    frame = job.to_frame()
    assert list(frame.index) == [0, 1] and list(frame["straggler"]) == [False, True]
    assert frame.loc[1, "dataloader_ms"] > frame.loc[0, "dataloader_ms"]
    assert frame.loc[0, "exposed_communication_ms"] > frame.loc[1, "exposed_communication_ms"]
    frames = job.frames()
    assert set(frames) == {0, 1} and not frames[1].empty
    assert job.rank(1).bound == "input"
    html = job._repr_html_()
    assert "straggler-row" in html and "data:image/svg+xml;base64," in html


def test_the_report_calls_the_straggler_out(tmp_path):
    page = write_report(STRAGGLER, tmp_path / "report.html").read_text()
    assert "Ranks side by side" in page and 'class="straggler-row"' in page
    assert "Straggler: rank 1" in page and "One step (ProfilerStep#" in page


def test_the_search_follows_the_job_not_one_rank():
    # Rank 0 alone is bound by communication; the job is bound by rank 1's loader: the search grows workers.
    job = straggler_job()
    d = job_diagnosis(job)
    assert d.bound == "input" and d.recommendations[0].id == "straggler-workers"
    best = load_trial(STRAGGLER)
    state = session(trials=[{"knobs": {}, "status": "ok", "batch_size": best.batch_size}],
                    user_values=json.loads((STRAGGLER / "trial.json").read_text())["user_values"],
                    device={"type": "cpu", "cpu": {"logical_cores": 2}})
    options = SessionOptions(nproc_per_node=2, keep_effective_batch=True)
    found = propose(d, Bound("input"), best, state, options, SearchSpace())
    assert found[0].recommendation == "more-workers" and found[0].helps_now
    # Under a communication bound, DDP's own arguments are proposed, and only with several ranks.
    a100 = job_diagnosis(jobs_of(analyze_path(gpu_trace(A100)))[0])
    ddp = [p for p in propose(a100, Bound("communication"), best, state, options, SearchSpace())
           if p.recommendation == "ddp-buckets"]
    assert ddp and ddp[0].helps_now and ddp[0].knobs.ddp_gradient_as_bucket_view is True
    single = dataclasses.replace(options, nproc_per_node=1)
    assert not [p for p in propose(a100, Bound("communication"), best, state, single, SearchSpace())
                if p.recommendation == "ddp-buckets"]


def gpu_rank(folder, rank: int, compute_ms: float, step_ms: float = 100.0):
    """A built H100 rank of a 2-rank NCCL job: per step, `compute_ms` of kernels, then the gradient
    all-reduce until the step ends (a rank that computes less waits longer in it)."""
    b = TraceBuilder(distributed={"backend": "nccl", "rank": rank, "world_size": 2})
    us = 1000.0
    for n in range(4):
        t0 = n * step_ms * us
        b.step(n + 1, t0, step_ms * us)
        for k in range(12):  # twelve kernels filling the compute part
            width = compute_ms * us / 12
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32", t0 + k * 10, 5, t0 + k * width, width)
        call = b.op("nccl:all_reduce", t0 + 200, 50, cat="user_annotation")
        call["args"].update({"Input Dims": [[25_000_000]], "Input type": ["float"]})
        b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t0 + 210, 5, t0 + compute_ms * us,
                 (step_ms - compute_ms) * us)
    return b.write(folder / f"rank{rank}.pt.trace.json.gz")


def test_a_rank_that_computes_more_is_an_imbalance_and_balanced_ranks_are_bound_by_communication(tmp_path):
    unbalanced = tmp_path / "unbalanced"
    unbalanced.mkdir()
    gpu_rank(unbalanced, 0, compute_ms=50)
    gpu_rank(unbalanced, 1, compute_ms=90)
    (job,) = jobs_of(analyze_path(unbalanced))
    assert job.straggler.rank == 1 and job.straggler.bound == "compute" and job.bound == "compute"
    assert job.straggler.excess_us == pytest.approx(40_000, rel=0.01)
    assert job.recommendations[0].id == "rank-imbalance"
    balanced = tmp_path / "balanced"
    balanced.mkdir()
    gpu_rank(balanced, 0, compute_ms=60)
    gpu_rank(balanced, 1, compute_ms=60)
    (job,) = jobs_of(analyze_path(balanced))
    assert job.straggler is None and job.bound == "communication" and "balanced" in job.verdict
    c = job.ranks[0].communication
    assert c.exposed_us == pytest.approx(40_000, rel=0.01) and c.collectives[0].bytes == 100_000_000
    advice = {r.id: r for r in job.recommendations}
    assert advice["ddp-buckets"].helps_now and advice["no-sync-accumulation"].helps_now

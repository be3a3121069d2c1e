"""What the profiler records is bounded: a trial counts the operators of an unprofiled step, records as many
steps as the trace's memory budget holds (one light step where not even one does) and says so; the advisor
watches the trial's memory and stops a trial that holds more than it allows. The budgets are made small
(ADVISOR_TRACE_BUDGET, ADVISOR_TRIAL_MEMORY) so that a step of a few thousand operators takes the bounded path."""

from __future__ import annotations

import gzip
import json

import pytest
from trial_helpers import trial_record, write_script

from advisor.trials.knobs import Knobs
from advisor.trials.process.op_count import OpCounter
from advisor.trials.process.runner import run_trial
from advisor.trials.record.trace_budget import BYTES_PER_OP, budget_bytes, plan_trace
from conftest import advisor_main

pytestmark = pytest.mark.slow

# An LSTM cell unrolled over 100 time steps: some 14 000 operators a step, forward, backward and optimizer.
CELL_LOOP = """
import torch

cell = torch.nn.LSTMCell(1, 16)
head = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.01)
x = torch.randn(8, 100)


def train_step():
    h = c = torch.zeros(8, 16)
    outputs = []
    for t in range(x.shape[1]):
        h, c = cell(x[:, t:t + 1], (h, c))
        outputs.append(head(h))
    loss = torch.stack(outputs).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


if __name__ == "__main__":
    for _ in range(400):
        train_step()
"""


def test_the_plan_records_what_the_budget_holds():
    assert plan_trace(1000, 1, 5, 10**9).steps == 5 and plan_trace(1000, 1, 5, 10**9).reason is None
    two = plan_trace(1000, 1, 5, 2 * 1000 * BYTES_PER_OP + 1)
    assert (two.steps, two.light) == (2, False) and "2 of 5 steps fit" in two.reason
    light = plan_trace(10**6, 1, 5, 2**30)
    assert (light.steps, light.light) == (1, True) and "without shapes and memory events" in light.reason
    assert budget_bytes(8 * 2**30, {"ADVISOR_TRACE_BUDGET": "200M"}) == 200 * 2**20
    assert budget_bytes(2 * 2**30, {}) == 2**29 and budget_bytes(64 * 2**30, {}) == 2**30


def test_a_step_of_many_operators_is_counted_and_recorded_within_the_budget(tmp_path):
    script = write_script(tmp_path, CELL_LOOP, "cells.py")
    whole = run_trial(str(script), Knobs(), tmp_path / "whole", steps=2, device="cpu")
    plan = trial_record(whole.path)["trace_plan"]
    assert whole.status == "ok" and plan["steps"] == plan["steps_asked"] == 2 and plan["reason"] is None
    # The loop's set-up is step 0; the operators of step 1 (wait 2) were counted: as many as one step runs
    # here, counted the same way (a counter left running would count on into the steps after).
    assert plan["counted_step"] == 1, plan
    step: dict = {"__name__": "cells"}
    exec(CELL_LOOP, step)
    step["train_step"]()
    counter = OpCounter()
    counter.start()
    step["train_step"]()
    assert counter.stop() == pytest.approx(plan["ops_per_step"], rel=0.02) and plan["ops_per_step"] > 5_000

    # A budget of 1 MiB: one step, recorded without shapes and memory events, and the session says why.
    out = tmp_path / "session"
    done = advisor_main("profile", str(script), "--no-apply", "--device", "cpu", "--windows", "1",
                        "--window", "0.1", "--out", str(out), env={"ADVISOR_TRACE_BUDGET": "1M"})
    assert done.returncode == 0, done.stderr
    record = trial_record(out / "trials" / "00-baseline")
    plan = record["trace_plan"]
    assert (plan["steps"], plan["steps_asked"], plan["light"]) == (1, 5, True), plan
    assert record["schedule"]["active"] == 1 and record["summary"]["steps_recorded"] == 1
    events = json.loads(gzip.open(out / "trials" / "00-baseline" / record["trace_files"][0]).read())["traceEvents"]
    assert [e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")] == ["ProfilerStep#3"]
    assert not any(e.get("name") == "[memory]" or "Input Dims" in (e.get("args") or {}) for e in events)
    note = "the profiler recorded 1 of 5 step(s) from trial 00 on"
    assert note in " ".join(done.stdout.split()) and note in (out / "report.html").read_text()
    assert "Bound" in done.stdout or "bound" in done.stdout  # the one recorded step is diagnosed


def test_a_trial_that_holds_more_memory_than_the_watch_allows_is_stopped(tmp_path, monkeypatch):
    monkeypatch.setenv("ADVISOR_TRIAL_MEMORY", "1500M")  # read by the advisor's process, which watches
    script = write_script(tmp_path, """
        import time
        import torch

        held = []

        def train_step(step):
            if step >= 3:  # from the profiled step on, 100 MiB more each step: over the watch's 1.5 GB
                held.append(torch.ones(100 * 2**20, dtype=torch.uint8))
            time.sleep(0.05)
            return torch.ones(4).sum()

        if __name__ == "__main__":
            for step in range(1000):
                train_step(step)
    """)
    result = run_trial(f"{script}:train_step", Knobs(), tmp_path / "t", steps=1, device="cpu", windows=100,
                       window_s=0.1)
    record = trial_record(result.path)
    assert result.status == "oom" and record["error_type"] == "MemoryWatch", result.message
    assert "stopped before the machine ran out" in result.message and "ADVISOR_TRIAL_MEMORY" in result.message
    assert record["watched_peak_bytes"] > 1500 * 2**20
    # The operators were counted before the steps that held the memory: the record keeps the estimate.
    assert record["trace_plan"]["ops_per_step"] > 0 and "its trace was estimated at" in result.message


def test_windows_that_would_outlast_the_time_limit_are_cut_to_fit(tmp_path):
    # Steps of 0.3 s and a limit of 12 s: ten windows of five steps (15 s) never fit in what is left after the
    # profiled steps; the trial measures the windows that fit and ends measured, not timed out.
    script = write_script(tmp_path, """
        import time

        def train_step(step):
            time.sleep(0.3)

        if __name__ == "__main__":
            for step in range(1000):
                train_step(step)
    """)
    result = run_trial(f"{script}:train_step", Knobs(), tmp_path / "t", steps=1, wait=1, warmup=0, device="cpu",
                       windows=10, window_s=1.0, timeout_s=12, profile=False)
    record = trial_record(result.path)
    assert result.status == "ok", result.message
    schedule = record["schedule"]
    assert "would outlast the trial's time limit" in record["windows_cut"], record["windows_cut"]
    assert 0 <= schedule["windows"] < 10 and schedule["windows_measured"] == schedule["windows"], schedule

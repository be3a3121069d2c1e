"""What the profiler records is bounded: a trial counts the operators of an unprofiled step, records as many
steps as the trace's memory budget holds (one light step where not even one does, the first part of one where
not even that does) and says so; the advisor
watches the trial's memory and stops a trial that holds more than it allows. The budgets are made small
(ADVISOR_TRACE_BUDGET, ADVISOR_TRIAL_MEMORY) so that a step of a few thousand operators takes the bounded path."""

from __future__ import annotations

import gzip
import json

import pytest
from trial_helpers import trial_record, write_script

from advisor.trials.knobs import Knobs
from advisor.trials.harness.op_count import OpCounter, in_backward
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from advisor.trials.record.trace_budget import BYTES_PER_OP, LIGHT_BYTES_PER_OP, budget_bytes, plan_trace
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
    light = plan_trace(2 * 10**5, 1, 5, 2**30)
    assert (light.steps, light.light, light.ops_recorded) == (1, True, None)
    assert "without shapes and memory events" in light.reason
    # time_sequence_prediction's step (2.6 million operators) is more than a light step's worth of 1 GiB:
    # the first 262 144 of its operators are recorded.
    part = plan_trace(2_600_000, 1, 5, 2**30)
    assert (part.steps, part.light, part.ops_recorded) == (1, True, 2**30 // LIGHT_BYTES_PER_OP)
    assert part.estimated_bytes <= 2**30 and "its first 262,144 operators (10%, and to the end of a backward pass" in part.reason
    assert budget_bytes(8 * 2**30, {"ADVISOR_TRACE_BUDGET": "200M"}) == 200 * 2**20
    assert budget_bytes(2 * 2**30, {}) == 2**29 and budget_bytes(64 * 2**30, {}) == 2**30


def test_the_trace_is_cut_between_operators_outside_the_backward_pass():
    """A profiler stopped inside the backward pass runs again when the pass ends (the engine puts back the thread
    state it captured): time_sequence_prediction's trial grew to 6 GB, a smaller one crashed. The cut waits for
    the first operator after the pass."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    x = torch.randn(8, 4, requires_grad=True)

    def step():
        (x.sin() * 2).sum().backward()
        return x.grad.add(1)

    phases: list[bool] = []

    class Phases(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            phases.append(in_backward())
            return func(*args, **(kwargs or {}))

    with Phases():
        step()
    first = phases.index(True)  # the first operator of the backward pass
    fired: list[tuple[int, bool]] = []
    counter = OpCounter(first + 1, lambda: fired.append((counter.count, in_backward())))
    counter.start()
    step()
    assert counter.stop() == len(phases)
    assert len(fired) == 1 and not fired[0][1] and fired[0][0] == phases.index(False, first) + 1, (fired, phases)


def test_a_step_of_many_operators_is_counted_and_recorded_within_the_budget(tmp_path):
    script = write_script(tmp_path, CELL_LOOP, "cells.py")
    whole = run_trial(TrialSpec(str(script), Knobs(), tmp_path / "whole", steps=2, device="cpu"))
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


def test_windows_that_would_outlast_the_time_limit_are_cut_to_fit(tmp_path):
    # Steps of 0.3 s and a limit of 6 s: ten windows of five steps (15 s) never fit in what is left after the
    # profiled steps; the trial measures the windows that fit and ends measured, not timed out. The limit counts
    # from the trial's start: it is forked from the zygote the test above started (a zygote's own start, 2-5 s
    # of importing torch, would take most of it).
    script = write_script(tmp_path, """
        import time

        def train_step(step):
            time.sleep(0.3)

        if __name__ == "__main__":
            for step in range(1000):
                train_step(step)
    """)
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=1, wait=1, warmup=0,
                                 device="cpu", windows=10, window_s=1.0, timeout_s=6, profile=False))
    record = trial_record(result.path)
    assert result.status == "ok", result.message
    schedule = record["schedule"]
    assert "would outlast the trial's time limit" in record["windows_cut"], record["windows_cut"]
    assert 0 <= schedule["windows"] < 10 and schedule["windows_measured"] == schedule["windows"], schedule


def test_a_dropped_trace_gives_its_memory_back():
    """glibc keeps the freed blocks of the profiler's events: a trial whose trace was written ran on with it resident
    (time_sequence_prediction: 2.5 kB an operator recorded) unless the trial trims the heap once it drops the
    profiler."""
    import psutil
    import torch

    from advisor.trials.harness.profiler import give_back_trace_memory, profile

    process = psutil.Process()
    x = torch.randn(8, 8)
    x.add(1).mul(2)  # the operators' first calls (and their allocations) before the baseline
    give_back_trace_memory()
    before = process.memory_info().rss
    prof = profile(activities=[torch.profiler.ProfilerActivity.CPU])
    prof.start()
    for _ in range(5_000):
        x.add(1).mul(2).sum()
    prof.stop()
    recorded = process.memory_info().rss - before
    del prof
    give_back_trace_memory()
    left = process.memory_info().rss - before
    assert recorded > 10 * 2**20, recorded  # 15 000 operators held by the stopped profiler (some 100 MB)
    assert left < recorded / 4, (left, recorded)


# The two tests below make the budgets small. A trial's environment picks the zygote it is forked from
# (advisor.trials.launch.zygote), and each new one imports torch again (2-5 s here): the two share one
# environment, with both budgets small, and come after the module's trials at the defaults, whose zygote the
# next module's trials find still kept. Neither budget is near what the other test's trial reaches: the LBFGS
# trial holds some 400 MB, the memory test's step runs a handful of operators.
SMALL_BUDGETS = {"ADVISOR_TRACE_BUDGET": "8M", "ADVISOR_TRIAL_MEMORY": "1500M"}

# pytorch/examples' time_sequence_prediction scaled down (its 1 000 time steps to 20, LBFGS's 20 iterations a
# step to 4): the same LBFGS closure over two LSTMCells, some 12 000 operators a step instead of 2.6 million.
SEQUENCE = """
import torch

torch.manual_seed(0)
x = torch.sin((torch.arange(21.0) + torch.randint(-80, 80, (16, 1))) / 20).double()
inputs, target = x[:, :-1], x[:, 1:]
lstm1, lstm2, linear = torch.nn.LSTMCell(1, 51), torch.nn.LSTMCell(51, 51), torch.nn.Linear(51, 1)
model = torch.nn.ModuleList([lstm1, lstm2, linear]).double()
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.8, max_iter=4)


def forward(batch):
    h = c = h2 = c2 = torch.zeros(batch.size(0), 51, dtype=torch.double)
    outputs = []
    for column in batch.split(1, dim=1):
        h, c = lstm1(column, (h, c))
        h2, c2 = lstm2(h, (h2, c2))
        outputs.append(linear(h2))
    return torch.cat(outputs, dim=1)


def closure():
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(forward(inputs), target)
    loss.backward()
    return loss


for step in range(400):
    optimizer.step(closure)
"""


def test_a_step_over_a_light_steps_budget_is_recorded_in_part(tmp_path):
    # A budget of 8 MiB (ADVISOR_TRACE_BUDGET): not even one step without shapes and memory events fits, so the
    # profiler records the first 2 048 operators of one step, writes its trace there, and the session is
    # diagnosed from that part and says so.
    script = write_script(tmp_path, SEQUENCE, "sequence.py")
    out = tmp_path / "session"
    done = advisor_main("profile", str(script), "--no-apply", "--device", "cpu", "--windows", "1",
                        "--window", "0.1", "--out", str(out), env=SMALL_BUDGETS)
    assert done.returncode == 0, done.stderr
    record = trial_record(out / "trials" / "00-baseline")
    plan = record["trace_plan"]
    assert (plan["steps"], plan["steps_asked"], plan["light"]) == (1, 5, True), plan
    assert plan["ops_recorded"] == 8 * 2**20 // LIGHT_BYTES_PER_OP and plan["ops_per_step"] > 4 * plan["ops_recorded"]
    assert record["schedule"]["active"] == 1 and record["summary"]["steps_recorded"] == 1
    events = json.loads(gzip.open(out / "trials" / "00-baseline" / record["trace_files"][0]).read())["traceEvents"]
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    assert [e["name"] for e in steps] == ["ProfilerStep#3"]
    assert not any(e.get("name") == "[memory]" or "Input Dims" in (e.get("args") or {}) for e in events)
    # The part, not the step: the operators recorded are those the plan allowed (the profiler records a few
    # events for each operator dispatched), and the trace's step ended where the profiler stopped.
    operators = [e for e in events if e.get("cat") == "cpu_op"]
    assert 0 < len(operators) < 8 * plan["ops_recorded"] < 2 * plan["ops_per_step"], len(operators)
    step_s = next(s["wall_s"] for s in record["steps"] if s["index"] == 3)
    assert steps[0]["dur"] / 1e6 < step_s
    # Writing the trace within the step is the profiler's time: it is left out of the step's.
    assert record["times"]["trace_cut_s"] > 0 and record["times"]["trace_cut_at"] > record["times"]["first_step_at"]
    text = " ".join(done.stdout.split())
    note = "the profiler recorded 1 of 5 step(s) from trial 00 on"
    assert note in text and "was recorded in part, its first 2,048 operators" in text
    assert note in (out / "report.html").read_text()
    assert "Bound" in done.stdout or "bound" in done.stdout  # the recorded part is diagnosed
    # LBFGS runs its closure's backward 20 times a step: not the script's gradient accumulation.
    assert "gradient accumulation" not in text, text[text.find("gradient accumulation") - 300:][:500]
    assert "accumulation_steps" not in record.get("own_settings", {})


def test_a_trial_that_holds_more_memory_than_the_watch_allows_is_stopped(tmp_path, monkeypatch):
    for name, value in SMALL_BUDGETS.items():  # ADVISOR_TRIAL_MEMORY: read by the advisor's process, which watches
        monkeypatch.setenv(name, value)
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
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=1, device="cpu", windows=100,
                                 window_s=0.1))
    record = trial_record(result.path)
    assert result.status == "oom" and record["error_type"] == "MemoryWatch", result.message
    assert "stopped before the machine ran out" in result.message and "ADVISOR_TRIAL_MEMORY" in result.message
    assert record["watched_peak_bytes"] > 1500 * 2**20
    # The operators were counted before the steps that held the memory: the record keeps the estimate.
    assert record["trace_plan"]["ops_per_step"] > 0 and "its trace was estimated at" in result.message

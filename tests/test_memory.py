"""Memory: gradient accumulation by interposition, memory at failure, growth per step, activations."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from trial_helpers import EXAMPLES, trial_record, write_script

from advisor.trials.harness.activations import ActivationRecorder
from advisor.trials.harness.trial_facts import cpu_computes_bf16
from advisor.trials.knobs import APPLIED, Knobs
from advisor.trials.interposition.step import StepInterposition
from advisor.trials.interposition.gradients import GradientInterposition
from advisor.trials.interposition.loaders import plan_loader_arguments
from advisor.trials.record.memory_summary import memory_growth
from advisor.trials.launch.processes import group_members
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec

K = 4


def small_problem():
    """A seeded Linear+ReLU+Linear model, one batch of 32 and its full-batch reference."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    optimizer.zero_grad()
    F.cross_entropy(reference(x), y).backward()
    grads = [p.grad.clone() for p in reference.parameters()]
    optimizer.step()
    return model, x, y, grads, reference


def counting(optimizer):
    """Count the calls that reach the optimizer's own step and zero_grad (below the interposition)."""
    calls = {"step": 0, "zero_grad": 0}
    optimizer.register_step_post_hook(lambda *a: calls.__setitem__("step", calls["step"] + 1))
    zero_grad = type(optimizer).zero_grad

    def counted(self, *args, **kwargs):
        calls["zero_grad"] += 1
        return zero_grad(self, *args, **kwargs)

    return calls, counted


@pytest.mark.parametrize("order", ["zero_grad first", "zero_grad last"])
def test_accumulated_gradients_equal_the_full_batch(order, monkeypatch):
    model, x, y, full_grads, reference = small_problem()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    calls, counted = counting(optimizer)
    monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", counted)
    interposition = StepInterposition(Knobs(accumulation_steps=K), "cpu")
    grads = None
    for micro, (xb, yb) in enumerate(zip(x.chunk(K), y.chunk(K))):  # one call of the target = one micro-step
        with interposition.step():
            if order == "zero_grad first":
                optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            if micro == K - 1:
                grads = [p.grad.clone() for p in model.parameters()]
            optimizer.step()
            if order == "zero_grad last":
                optimizer.zero_grad()
        assert calls["step"] == (1 if micro == K - 1 else 0)
    for accumulated, full in zip(grads, full_grads):
        assert torch.allclose(accumulated, full, atol=1e-6)
    for after, expected in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(after, expected, atol=1e-6)
    assert calls == {"step": 1, "zero_grad": 1}  # once per cycle each
    assert interposition.outcomes["accumulation_steps"] == APPLIED
    record = interposition.record()["accumulation"]
    assert record == {"steps": K, "micro_steps": K, "optimizer_steps": 1, "optimizer_steps_deferred": K - 1,
                      "zero_grads": 1, "zero_grads_skipped": K - 1}


def test_accumulation_is_not_applicable_when_the_target_never_steps_the_optimizer():
    model, x, y, _, _ = small_problem()
    interposition = StepInterposition(Knobs(accumulation_steps=K), "cpu")
    for xb, yb in zip(x.chunk(K), y.chunk(K)):
        with interposition.step():
            F.cross_entropy(model(xb), yb).backward()  # the user's loop steps the optimizer
    assert interposition.outcomes_after_steps()["accumulation_steps"].startswith("not applicable: the target never")


def test_accumulation_with_the_fp16_grad_scaler_and_an_lr_scheduler():
    # The GradScaler mechanism is device-generic; the CPU GradScaler exercises it without a GPU.
    model, x, y, full_grads, reference = small_problem()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)  # wraps optimizer.step
    gradients = GradientInterposition("cpu", scale=True, accumulate=K)
    for cycle in range(2):
        for xb, yb in zip(x.chunk(K), y.chunk(K)):
            with gradients.active():
                optimizer.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                optimizer.step()
                scheduler.step()
        if cycle == 0:
            for after, expected in zip(model.parameters(), reference.parameters()):
                assert torch.allclose(after, expected, atol=1e-6)  # the scaler stepped on unscaled sums
    assert gradients.counts["optimizer_steps"] == 2 and gradients.counts["zero_grads"] == 2
    assert scheduler.last_epoch == 2 and optimizer.param_groups[0]["lr"] == pytest.approx(0.025)
    assert gradients.scaler._growth_tracker.item() == 2  # update() ran once per cycle, no inf found


def test_accumulation_with_bf16_autocast_matches_the_full_batch_in_bf16_tolerance():
    model, x, y, full_grads, _ = small_problem()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    interposition = StepInterposition(Knobs(amp="bf16", accumulation_steps=K), "cpu")
    for xb, yb in zip(x.chunk(K), y.chunk(K)):
        with interposition.step():
            optimizer.zero_grad()
            F.cross_entropy(model(xb).float(), yb).backward()
    for accumulated, full in zip((p.grad for p in model.parameters()), full_grads):
        assert torch.allclose(accumulated, full, atol=2e-2, rtol=2e-2)
    assert interposition.outcomes == {"amp": APPLIED, "accumulation_steps": APPLIED}


def test_loader_plan_yields_micro_batches_or_says_why_not():
    user = {"batch_size": 32, "batch_sampler": None, "num_workers": 0, "pin_memory": False,
            "persistent_workers": False, "prefetch_factor": None}
    effective, outcomes = plan_loader_arguments(user, Knobs(accumulation_steps=4), accelerator=False)
    assert effective["batch_size"] == 8 and outcomes == {"accumulation_steps": APPLIED}
    effective, _ = plan_loader_arguments(user, Knobs(batch_size=64, accumulation_steps=4), accelerator=False)
    assert effective["batch_size"] == 16  # the batch_size knob is the effective batch
    effective, outcomes = plan_loader_arguments(user, Knobs(accumulation_steps=3), accelerator=False)
    assert effective["batch_size"] == 32 and outcomes["accumulation_steps"] == "not applicable: batch 32 is not a multiple of 3"
    _, outcomes = plan_loader_arguments({**user, "batch_size": None}, Knobs(accumulation_steps=2), accelerator=False)
    assert outcomes["accumulation_steps"].startswith("not applicable: the DataLoader does not batch")
    assert Knobs(accumulation_steps=4).label() == "accumulation-steps-4"
    with pytest.raises(ValueError, match="accumulation_steps must be a positive integer"):
        Knobs(accumulation_steps=0)


ACCUMULATING_SCRIPT = """
    import json
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(512, 8), torch.randint(0, 3, (512,)))
    steps = []

    def train_step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    optimizer.register_step_post_hook(lambda *a: steps.append(1))
    for epoch in range(10):
        for x, y in DataLoader(data, batch_size=32):
            train_step(x, y)
            json.dump({"optimizer_steps": len(steps)}, open("observed.json", "w"))
"""


def test_trial_with_accumulation_records_micro_and_effective_batch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # trials run in the folder they are started from; the script writes there
    script = write_script(tmp_path, ACCUMULATING_SCRIPT)
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(accumulation_steps=4), tmp_path / "t", steps=5, wait=2,
                                 warmup=1, device="cpu", profile=False))
    assert result.ok, result.message + (result.traceback or "")
    record = trial_record(result.path)
    assert record["knob_outcomes"] == {"accumulation_steps": APPLIED}
    assert record["dataloaders"][0]["user"]["batch_size"] == 32
    assert record["dataloaders"][0]["effective"]["batch_size"] == 8
    summary = record["summary"]
    assert (summary["accumulation_steps"], summary["micro_batch_size"], summary["effective_batch_size"]) == (4, 8, 32)
    assert summary["batch_size"] == 8 and summary["samples_per_s"] > 0
    assert record["accumulation"]["micro_steps"] == 8 and record["accumulation"]["optimizer_steps"] == 2
    assert json.loads((tmp_path / "observed.json").read_text())["optimizer_steps"] == 1  # after 7 calls: 1 cycle


# --------------------------------------------------------------------------------------------------
# Memory growth per step (pure), and the examples that leak or not


def test_memory_growth_is_a_least_squares_slope_from_the_most_precise_source():
    steps = [{"index": i, "rss_bytes": 500e6 + 8e6 * i + (3e6 if i % 2 else 0)} for i in range(8)]
    growth = memory_growth(steps)
    assert growth["source"] == "rss_bytes" and growth["steps"] == 7 and growth["first_index"] == 1
    assert growth["bytes_per_step"] == pytest.approx(8e6, rel=0.1) and growth["r2"] > 0.9
    # The profiled steps' allocator figure wins over the resident set (which the profiler inflates).
    for step in steps[3:]:
        step["profiler_allocated_bytes"] = 12 * 2**20
    growth = memory_growth(steps)
    assert growth["source"] == "profiler_allocated_bytes" and growth["steps"] == 5
    assert growth["bytes_per_step"] == 0 and growth["r2"] == 0
    # One jump (optimizer state created at the first optimizer step) is not a steady growth.
    steps[3]["profiler_allocated_bytes"] = 10 * 2**20
    growth = memory_growth(steps)
    assert growth["bytes_per_step"] > 0 and growth["median_difference_bytes"] == 0
    assert memory_growth(steps[:3]) is None


def test_leaky_example_grows_every_step(tmp_path):
    result = run_trial(TrialSpec(f"{EXAMPLES / 'leaky_loss.py'}:train_step", Knobs(), tmp_path / "t", steps=5,
                                 device="cpu"))
    assert result.ok, result.message
    summary = trial_record(result.path)["summary"]
    growth = summary["memory_growth"]
    # 256 × 8192 float log-probabilities kept per step: 8 MiB, and a straight line.
    assert growth["source"] == "profiler_allocated_bytes" and growth["steps"] == 5
    assert summary["memory_growth_per_step_bytes"] == pytest.approx(8 * 2**20, rel=0.1) and growth["r2"] > 0.99
    assert growth["median_difference_bytes"] == pytest.approx(8 * 2**20, rel=0.1)
    breakdown = summary["memory_breakdown"]
    params = (64 * 128 + 128 + 128 * 8192 + 8192) * 4
    assert breakdown["when"] == "end" and breakdown["parameters"] == params and breakdown["gradients"] == params
    assert breakdown["optimizer_state"] == 0  # plain SGD keeps none
    assert breakdown["activations"] > 8 * 2**20 and breakdown["activations_source"].startswith("estimated")


# --------------------------------------------------------------------------------------------------
# Out of memory under a cap, and the configuration that fits

CAP = 1450 * 2**20  # 1.45 GiB of writable memory above torch's own: the user's batch of 16 needs about 1.9 GiB
# Two OpenMP threads, so that the memory of thread stacks and arenas is alike on any machine; where torch runs
# two already, the environment stays the suite's (a variable of its own would start a zygote for these trials).
TWO_THREADS = None if torch.get_num_threads() == 2 else dict(os.environ, OMP_NUM_THREADS="2")


def test_memory_hungry_runs_out_of_memory_and_micro_batches_fit_under_the_same_cap(tmp_path):
    target = f"{EXAMPLES / 'memory_hungry.py'}:train_step"
    env = TWO_THREADS
    baseline = run_trial(TrialSpec(target, Knobs(), tmp_path / "base", steps=1, wait=1, warmup=0, device="cpu",
                                   memory_limit=CAP, env=env))
    assert baseline.status == "oom", baseline.message
    assert "in step 0" in baseline.message
    record = trial_record(baseline.path)
    assert not group_members(record["pid"])  # the trial is gone; this process (the advisor) is fine
    breakdown = record["summary"]["memory_breakdown"]
    assert breakdown["when"] == "at failure" and breakdown["gradients"] == 0
    assert 0 < breakdown["parameters"] < 2**20 and breakdown["activations"] > 500 * 2**20
    assert "partial" in breakdown["activations_source"]
    cap = record["memory_cap"]
    held = cap["held_bytes"]  # torch's libraries: the limit is above them, whichever build is installed
    assert 0 < held < CAP and cap["how"] == f"RLIMIT_DATA at {held + CAP} bytes"
    assert (cap["device"], cap["bytes"]) == ("cpu", CAP) and "beyond what torch held" in cap["what"]
    assert breakdown["data_bytes"] <= held + CAP and breakdown["rss_bytes"] > breakdown["activations"]
    activations = record["summary"]["activations"]
    assert activations["complete"] is False and activations["checkpoint_candidates"][0] == "Block"

    fits = run_trial(TrialSpec(target, Knobs(accumulation_steps=4), tmp_path / "acc", steps=1, wait=1, warmup=0,
                               device="cpu", memory_limit=CAP, env=env))
    assert fits.ok, fits.message
    summary = trial_record(fits.path)["summary"]
    assert (summary["micro_batch_size"], summary["effective_batch_size"]) == (4, 16)
    assert summary["peak_data_bytes"] < held + CAP


# The advisor tries bf16 after an out-of-memory trial only where the CPU computes it (`recovery_plan`); emulated
# on an AMD EPYC without bf16 instructions, this one step took 21 s against the baseline's 6 s.
@pytest.mark.skipif(not cpu_computes_bf16(), reason="the CPU has no bf16 instructions: the advisor does not try bf16")
def test_bf16_autocast_halves_the_activations_and_the_users_batch_fits_under_the_same_cap(tmp_path):
    target = f"{EXAMPLES / 'memory_hungry.py'}:train_step"
    env = TWO_THREADS
    bf16 = run_trial(TrialSpec(target, Knobs(amp="bf16"), tmp_path / "bf16", steps=1, wait=0, warmup=0, device="cpu",
                               memory_limit=CAP, env=env, profile=False))
    assert bf16.ok and bf16.batch_size == 16, bf16.message


# --------------------------------------------------------------------------------------------------
# Activations per module


class Block(torch.nn.Module):
    """A tiny transformer block."""

    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, 2, batch_first=True)
        self.ff = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.norm(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.ff(x)


def test_activation_recorder_names_the_blocks_with_their_count():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), *(Block(16) for _ in range(3)), torch.nn.Linear(16, 50))
    tokens = torch.randint(0, 50, (4, 12))
    with ActivationRecorder() as recorder:
        F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    summary = recorder.summary(step=0)
    blocks = next(e for e in summary["by_class"] if e["class"] == "Block")
    assert blocks["count"] == 3 and blocks["names"] == ["1", "2", "3"] and blocks["share"] > 0.5
    assert summary["checkpoint_candidates"][0] == "Block" and summary["roots"] == ["Sequential"]
    assert all(e["share"] <= 1 for e in summary["by_class"])
    # Outside the recorded step nothing is hooked.
    assert not torch.nn.modules.module._global_forward_hooks


def test_blocks_called_one_by_one_and_what_checkpointing_them_frees():
    torch.manual_seed(0)
    embed, blocks, head = torch.nn.Embedding(50, 16), [Block(16) for _ in range(3)], torch.nn.Linear(16, 50)
    tokens = torch.randint(0, 50, (4, 12))
    saved = {}
    for checkpointed in (False, True):
        with ActivationRecorder() as recorder:
            x = embed(tokens)
            for block in blocks:  # no parent module: each block is an outermost module
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if checkpointed else block(x)
            F.cross_entropy(head(x).flatten(0, 1), tokens.flatten()).backward()
        summary = recorder.summary(step=0)
        saved[checkpointed] = summary["saved_bytes"]
        if not checkpointed:
            assert summary["checkpoint_candidates"][0] == "Block"
            blocks_entry = next(e for e in summary["by_class"] if e["class"] == "Block")
            assert blocks_entry["count"] == 3
            freed = blocks_entry["bytes"]
    # Checkpointing the blocks frees what the recorder attributed to them, except their inputs.
    assert saved[True] < saved[False] - 0.8 * freed


def test_activation_bytes_are_what_autograd_saves():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    x = torch.randn(32, 8)
    with ActivationRecorder() as recorder:
        model(x).sum().backward()
    summary = recorder.summary(step=0)
    # Linear saves its input x; ReLU saves its output, which the second Linear saves too (counted once).
    assert summary["saved_bytes"] == 32 * 8 * 4 + 32 * 16 * 4
    by_name = {m["name"]: m["bytes"] for m in summary["by_module"]}
    assert by_name == {"0": 32 * 8 * 4, "1": 32 * 16 * 4, "2": 32 * 16 * 4}

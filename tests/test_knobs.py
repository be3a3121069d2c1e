"""Knobs: values, the DataLoader plan, and each interposition mechanism exercised in this process."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from advisor.trials.knobs import APPLIED, Knobs
from advisor.knobs.non_blocking import copying_cuda, copying_to
from advisor.trials.interposition.step import StepInterposition
from advisor.trials.interposition.gradients import GradScaling
from advisor.trials.interposition.loaders import (LoaderRecord, dataloader_outcomes, install_dataloader_knobs,
                                                  plan_loader_arguments)
from trial_helpers import dataloader_defaults

TORCH_DEFAULTS = dataloader_defaults()
USER = {**TORCH_DEFAULTS, "batch_size": 16, "batch_sampler": None}


def test_knobs_import_does_not_import_torch():
    code = "import sys, advisor.trials.knobs, advisor.trials.launch.runner; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_knobs_values_labels_and_round_trip():
    knobs = Knobs(amp="bf16", num_workers=2, pin_memory=True)
    assert knobs.requested() == {"amp": "bf16", "num_workers": 2, "pin_memory": True}
    assert knobs.label() == "amp-bf16+num-workers-2+pin-memory"
    assert Knobs().label() == "baseline"
    assert Knobs.from_dict(knobs.to_dict()) == knobs
    with pytest.raises(ValueError, match="unknown knob 'workers'"):
        Knobs.from_dict({"workers": 2})
    with pytest.raises(ValueError, match="amp must be"):
        Knobs(amp="fp8")
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        Knobs(batch_size=0)
    with pytest.raises(ValueError, match="num_workers"):
        Knobs(num_workers=-1)


def test_plan_overrides_and_keeps_dataloader_valid():
    effective, outcomes = plan_loader_arguments(
        USER, Knobs(batch_size=64, num_workers=2, prefetch_factor=4, persistent_workers=True), accelerator=False
    )
    assert effective == {**TORCH_DEFAULTS, "batch_size": 64, "num_workers": 2, "persistent_workers": True,
                         "prefetch_factor": 4}
    assert set(outcomes.values()) == {APPLIED}


def test_plan_reports_what_cannot_apply():
    _, outcomes = plan_loader_arguments(
        {**USER, "batch_sampler": object()}, Knobs(batch_size=8, prefetch_factor=2, pin_memory=True), accelerator=False
    )
    assert outcomes["batch_size"] == "not applicable: the DataLoader uses a batch_sampler"
    assert outcomes["prefetch_factor"].startswith("not applicable: the DataLoader has no worker processes")
    assert outcomes["pin_memory"].startswith("not applicable: no accelerator")
    # Fewer workers than the user had: their worker-only settings are dropped so DataLoader accepts it.
    effective, _ = plan_loader_arguments(
        {**USER, "num_workers": 4, "persistent_workers": True, "prefetch_factor": 8}, Knobs(num_workers=0), accelerator=True
    )
    assert effective["persistent_workers"] is False and effective["prefetch_factor"] is None
    effective, outcomes = plan_loader_arguments(USER, Knobs(pin_memory=True), accelerator=True)
    assert effective["pin_memory"] is True and outcomes["pin_memory"] == APPLIED
    # 8-bit copies set off ask for the float images the Dataset builds already: nothing to apply, not "not
    # applicable" (a recording's such outcome once kept a replayed search from ever trying them).
    loader = LoaderRecord(user=dict(USER), effective=dict(USER), outcomes={}, steps=3)
    assert dataloader_outcomes(Knobs(uint8_copies=False), [loader]) == {"uint8_copies": APPLIED}
    assert dataloader_outcomes(Knobs(uint8_copies=True), [loader])["uint8_copies"].startswith("not applicable")


def test_dataloader_is_built_with_the_knobs_and_records_the_users_values():
    records = []
    undo = install_dataloader_knobs(Knobs(batch_size=8, num_workers=1, prefetch_factor=3), accelerator=False, records=records)
    try:
        loader = DataLoader(TensorDataset(torch.arange(40.0)), 4, shuffle=False)
    finally:
        undo()
    assert (loader.batch_size, loader.num_workers, loader.prefetch_factor) == (8, 1, 3)
    assert [len(batch[0]) for batch in loader] == [8] * 5
    assert records[0].user == {**TORCH_DEFAULTS, "batch_size": 4}
    assert DataLoader(TensorDataset(torch.arange(4.0)), 4).batch_size == 4  # undone


def test_non_blocking_to_passes_non_blocking_true_for_host_to_accelerator_copies():
    calls = []

    def original(tensor, *args, **kwargs):
        calls.append((args, kwargs))
        return tensor

    to = copying_to(torch, original)
    x = torch.ones(2)
    to(x, "cuda")
    to(x, torch.device("cuda", 0), torch.float16)
    to(x, device="cuda:0")
    to(x, "cuda", non_blocking=False)  # the user's explicit choice wins
    to(x, "cpu")
    to(x, torch.float16)
    assert [c[1].get("non_blocking") for c in calls] == [True, True, True, False, None, None]

    cuda_calls = []
    cuda = copying_cuda(lambda tensor, *a, **k: cuda_calls.append(k))
    cuda(x)
    cuda(x, 0, False)
    assert cuda_calls == [{"non_blocking": True}, {}]


def test_non_blocking_is_not_applicable_on_cpu():
    interposition = StepInterposition(Knobs(non_blocking=True), "cpu")
    assert interposition.outcomes["non_blocking"].startswith("not applicable")
    original = torch.Tensor.to
    with interposition.step():
        assert torch.Tensor.to is original


def test_bf16_autocast_reaches_a_matmul_in_the_step():
    interposition = StepInterposition(Knobs(amp="bf16"), "cpu")
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with interposition.step():
        inside = (a @ b).dtype
    assert inside == torch.bfloat16 and (a @ b).dtype == torch.float32
    assert interposition.outcomes == {"amp": APPLIED}
    assert StepInterposition(Knobs(amp="fp16"), "cpu").outcomes["amp"].startswith("not applicable")


def test_autocast_follows_where_the_model_is_not_the_trial_device():
    # A trial resolved to "cuda" (a GPU machine) whose script keeps its model on the CPU: autocast must
    # reach the CPU matmuls, as the model's parameters and the step's tensors say.
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    interposition = StepInterposition(Knobs(amp="bf16"), "cuda")
    with interposition.step((x,), {}):
        inside = model(x).dtype
    assert inside == torch.bfloat16 and "cpu" in interposition.changes["amp"].autocast_types
    assert interposition.outcomes == {"amp": APPLIED}
    # fp16 autocast runs only on CUDA: a CPU-only step gets none, and says why.
    fp16 = StepInterposition(Knobs(amp="fp16"), "cuda")
    with fp16.step((x,), {}):
        inside = model(x).dtype
    if not torch.cuda.is_available():
        assert inside == torch.float32 and fp16.changes["amp"].autocast_types == []
        assert fp16.outcomes["amp"].startswith("not applicable")


def test_grad_scaling_scales_backward_and_steps_through_the_scaler():
    # The mechanism is device-generic; the CPU GradScaler exercises it without a GPU.
    weight = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    seen = []
    weight.register_hook(lambda grad: seen.append(grad.clone()))
    original_step = vars(torch.optim.SGD)["step"]
    scaling = GradScaling("cpu")
    with scaling.active():
        loss = (weight * 2).sum()
        loss.backward()
        optimizer.step()
    scale = 65536.0
    assert torch.allclose(seen[0], torch.tensor([2.0, 2.0]) * scale)  # backward ran on the scaled loss
    assert torch.allclose(weight.detach(), torch.tensor([0.8, 1.8]))  # the step saw unscaled gradients
    assert scaling.stepped and scaling.scaler.get_scale() == scale  # update() ran, no inf found
    assert vars(torch.optim.SGD)["step"] is original_step  # the interposition is undone
    # Outside the step nothing is scaled.
    optimizer.zero_grad()
    (weight * 2).sum().backward()
    assert torch.allclose(weight.grad, torch.tensor([2.0, 2.0]))


def test_grad_scaling_leaves_a_step_that_scales_itself_alone():
    weight = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    users_scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    seen = []
    weight.register_hook(lambda grad: seen.append(grad.clone()))
    scaling = GradScaling("cpu")
    with scaling.active():
        users_scaler.scale((weight * 2).sum()).backward()
        users_scaler.step(optimizer)
        users_scaler.update()
    assert torch.allclose(seen[0], torch.tensor([8.0, 8.0]))  # scaled once, by the user's scaler
    assert torch.allclose(weight.detach(), torch.tensor([0.8, 1.8]))
    assert not scaling.stepped


def test_a_grown_batch_says_how_to_scale_the_learning_rate_and_one_left_as_written_says_nothing():
    from advisor.knobs.batch_size import training_notes

    grown = training_notes({"batch_size": 32}, {"batch_size": 128}, keep_effective_batch=False)
    assert len(grown) == 1 and grown[0].startswith("The batch grew from 32 to 128 (×4): scale the learning rate by "
                                                   "about ×4")
    assert training_notes({"batch_size": 32}, {"batch_size": None}, keep_effective_batch=False) == []
    assert training_notes({"batch_size": 32}, {"batch_size": 32}, keep_effective_batch=True) == [
        "--keep-effective-batch: the batch size was left as written"]


def test_core_use_counts_workers_and_threads_per_rank_against_the_cores():
    from advisor.knobs.threads import core_use, core_use_text

    use = core_use(4, 1, {"num_workers": 2, "threads": None}, {"num_workers": 0, "threads": 2})
    assert use == {"cores": 4, "ranks": 1, "workers": 2, "threads": 2, "all_used": True}
    assert core_use_text(use, input_bound=True).endswith("or use a machine with more cores")
    assert core_use(8, 1, {}, {"num_workers": 2, "threads": 2})["all_used"] is False
    assert core_use_text(core_use(8, 1, {}, {"num_workers": 2, "threads": 2}), input_bound=True) is None
    assert core_use(None, 1, {}, {"num_workers": 2, "threads": 2}) is None  # the cores were not recorded

"""Trials on a CUDA device: each knob's CUDA branch, as only a GPU can show it: the memory cap on the device,
autocast by the device the model is on (bf16, and fp16 with its GradScaler), pinned memory and non_blocking
host-to-device copies, the 8-bit conversion after a real copy (the same numbers), TF32 and cudnn.benchmark,
torch.compile with Triton's kernels, DistributedDataParallel on NCCL (two ranks where there are two GPUs,
else one), and the profiler's check that a trace holds the GPU's kernels. Skipped where there is no CUDA
device (the CPU paths of the same mechanisms are tested in test_trial, test_knobs, test_memory,
test_uint8_copies, test_model_knobs and test_distributed); `make gpu-check` runs them on a GPU machine."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from test_uint8_copies import datasets  # noqa: F401 - the fixture: Dataset shapes the knob rewrites
from torch.utils.data import DataLoader
from trial_helpers import trial_record, write_script

from advisor.trials.harness.trial_facts import cuda_computes_bf16
from advisor.trials.knobs import APPLIED, Knobs
from advisor.trials.launch.profiler_check import cuda_profiler_problem, probe, trace_problems
from advisor.trials.launch.processes import group_members
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from advisor.trials.interposition.eight_bit_images import ByteCopies, mark
from advisor.trials.interposition.uint8_probe import probe_plan
from conftest import ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

GPU_SCRIPT = """
    import json
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    device = torch.device("cuda")
    model = torch.nn.Linear(256, 256).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step(x, step):
        x = x.to(device)
        if step == GROW_AT:
            torch.empty(GROW_BYTES, dtype=torch.uint8, device=device)  # more than the cap allows
        loss = (model(x) @ model.weight).float().pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with open("observed.json", "w") as f:
            json.dump({"matmul_dtype": str(model(x).dtype)}, f)
        return loss

    if __name__ == "__main__":
        loader = DataLoader(TensorDataset(torch.randn(4096, 256)), batch_size=64)
        for epoch in range(100):
            for step, (x,) in enumerate(loader):
                train_step(x, step)
"""


def gpu_script(folder, grow_at=-1, grow_bytes=0):
    return write_script(folder, GPU_SCRIPT.replace("GROW_AT", str(grow_at)).replace("GROW_BYTES", str(grow_bytes)))


def test_memory_limit_caps_device_memory_and_says_so(tmp_path):
    script = gpu_script(tmp_path, grow_at=3, grow_bytes=3 * 2**30)
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "t", steps=3, device="cuda",
                                 memory_limit=2 * 2**30))
    assert result.status == "oom", result.message
    record = trial_record(result.path)
    assert record["memory_cap"]["device"].startswith("cuda:") and record["memory_cap"]["bytes"] == 2 * 2**30
    assert "set_per_process_memory_fraction" in record["memory_cap"]["how"]
    assert [s["index"] for s in record["steps"]] == [0, 1, 2]
    assert not group_members(record["pid"])


def test_pinned_non_blocking_copies_and_autocast_on_the_gpu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # trials run in the folder they are started from; the script writes there
    script = gpu_script(tmp_path)
    knobs = Knobs(amp="bf16" if cuda_computes_bf16() else "fp16", pin_memory=True, non_blocking=True)
    result = run_trial(TrialSpec(f"{script}:train_step", knobs, tmp_path / "t", steps=3, device="cuda"))
    assert result.ok, result.message
    assert result.knob_outcomes == {"amp": APPLIED, "pin_memory": APPLIED, "non_blocking": APPLIED}
    observed = json.loads((tmp_path / "observed.json").read_text())
    assert observed["matmul_dtype"] in ("torch.bfloat16", "torch.float16")
    from advisor.analysis.analyze import analyze_file

    diagnosis = analyze_file(sorted(result.path.glob("*.pt.trace.json*"))[0])
    assert diagnosis.platform == "gpu" and diagnosis.copies.pinned_us > 0 and diagnosis.copies.pageable_us == 0


def test_fp16_autocast_runs_with_its_grad_scaler(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the script writes observed.json in the folder the trial runs from
    script = gpu_script(tmp_path)
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(amp="fp16"), tmp_path / "t", steps=3, device="cuda"))
    assert result.ok, result.message
    assert result.knob_outcomes == {"amp": APPLIED}
    assert json.loads((tmp_path / "observed.json").read_text())["matmul_dtype"] == "torch.float16"
    losses = [s["loss"] for s in trial_record(result.path)["steps"]]
    assert losses and all(loss is not None and loss == loss for loss in losses)  # finite: the scaler unscaled


@pytest.mark.parametrize("name, index", [("PilNormalized", 0), ("NumpyFloat32", None), ("Astype", 1),
                                         ("TensorFloat", 0)])
def test_the_8bit_conversion_after_a_real_copy_gives_the_same_numbers(datasets, name, index):  # noqa: F811
    """The Dataset's float images, and the 8-bit ones copied to the GPU and converted there: bit for bit the
    same (CUDA divides by a Python number as a product with its reciprocal; the conversion must not)."""
    cls = getattr(datasets, name)
    before = list(DataLoader(cls(), batch_size=4))
    plan = probe_plan(cls())
    original = cls.__getitem__
    cls.__getitem__ = plan.function
    try:
        after = list(DataLoader(cls(), batch_size=4, pin_memory=True))
    finally:
        cls.__getitem__ = original
    copies = ByteCopies(True)
    moved_to = copies.to(torch.Tensor.to)
    for old, new in zip(before, after):
        mark(new, plan)
        image = new if index is None else new[index]
        got = moved_to(image, "cuda", non_blocking=True)
        assert got.device.type == "cuda" and got.dtype == torch.float32
        assert torch.equal(got.cpu(), old if index is None else old[index])
    assert copies.converted == len(before)


def test_a_real_trial_moves_8bit_images_to_the_gpu(tmp_path):
    target = f"{ROOT / 'examples' / 'image_classifier.py'}:train_step"
    knobs = Knobs(num_workers=2, pin_memory=True, non_blocking=True, uint8_copies=True)
    result = run_trial(TrialSpec(target, knobs, tmp_path / "t", steps=3, wait=1, warmup=1, device="cuda"))
    assert result.ok, result.message
    assert set(result.knob_outcomes.values()) == {APPLIED}, result.knob_outcomes
    record = trial_record(result.path)
    assert record["uint8_plan"]["removed"] == ["pixels = (pixels - 0.5) / 0.25"]
    assert all(s["loss"] is not None for s in record["steps"])


MODEL_SCRIPT = """
    import json
    import torch
    import torch.nn as nn

    device = torch.device("cuda")
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step(x, y):
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with open("observed.json", "w") as f:
            json.dump({"cudnn_benchmark": torch.backends.cudnn.benchmark,
                       "matmul_precision": torch.get_float32_matmul_precision()}, f)
        return loss.detach()

    if __name__ == "__main__":
        for _ in range(100_000):
            train_step(torch.randn(32, 3, 32, 32), torch.randint(0, 4, (32,)))
"""


def kernel_names(folder) -> list[str]:
    """The names of the GPU kernels in a trial's traces."""
    names = []
    for trace in sorted(folder.glob("*.pt.trace.json*")):
        with (gzip.open if trace.suffix == ".gz" else open)(trace, "rt") as f:
            names += [e.get("name", "") for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
    return names


def test_tf32_and_cudnn_benchmark_are_set_on_the_device(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the script writes observed.json in the folder the trial runs from
    script = write_script(tmp_path, MODEL_SCRIPT)
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(tf32=True, cudnn_benchmark=True), tmp_path / "t",
                                 steps=3, device="cuda"))
    assert result.ok, result.message
    observed = json.loads((tmp_path / "observed.json").read_text())
    assert result.knob_outcomes["cudnn_benchmark"] == APPLIED and observed["cudnn_benchmark"] is True
    if torch.cuda.get_device_capability()[0] >= 8:
        assert result.knob_outcomes["tf32"] == APPLIED and observed["matmul_precision"] == "high"
    else:
        assert "compute capability" in result.knob_outcomes["tf32"] and observed["matmul_precision"] == "highest"
    assert kernel_names(result.path), "the trace holds the GPU's kernels"


def test_ddp_trial_on_nccl(tmp_path):
    """Two ranks where there are two GPUs (their all-reduce is NCCL kernels in the traces), else one."""
    ranks = 2 if torch.cuda.device_count() >= 2 else 1
    result = run_trial(TrialSpec(f"{ROOT / 'examples' / 'ddp_classifier.py'}:train_step", Knobs(ddp_bucket_cap_mb=50),
                                 tmp_path / "t", steps=2, wait=1, warmup=1, device="cuda", nproc_per_node=ranks,
                                 timeout_s=300))
    assert result.ok, result.message
    assert result.knob_outcomes == {"ddp_bucket_cap_mb": APPLIED}
    record = trial_record(result.path)
    if ranks == 2:
        assert record["world_size"] == 2
        assert any("nccl" in name.lower() for name in kernel_names(result.path))
    else:
        assert record.get("single_rank_job") is True


def test_the_profiler_sees_the_gpu_before_a_cuda_baseline(tmp_path):
    """What `advisor doctor` and `advisor profile` check: a profiled step's trace holds kernels (CUPTI works)."""
    counts = probe("cuda", tmp_path)
    assert counts["kernels"] > 0 and counts["device_memory_events"] > 0, counts
    assert not trace_problems(counts)
    assert cuda_profiler_problem("cuda") is None


def test_compile_runs_triton_kernels_on_the_device(tmp_path):
    """Last: the longest, and the one whose time varies most (Triton compiles the kernels)."""
    script = write_script(tmp_path, MODEL_SCRIPT)
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(compile=True), tmp_path / "t", steps=3, wait=2,
                                 device="cuda", timeout_s=400))
    assert result.ok, result.message
    assert result.knob_outcomes == {"compile": APPLIED}
    record = trial_record(result.path)
    assert record["compile"]["graphs"] >= 1 and record["compile"]["compile_s"] is not None
    assert any(name.startswith("triton_") for name in kernel_names(result.path)), "Triton's kernels ran"


def test_trials_forked_from_the_zygote_run_on_the_gpu(tmp_path, monkeypatch):
    # The zygote imported torch but never touched CUDA: each forked trial initializes it afresh.
    import os

    from advisor.analysis.analyze import analyze_file

    monkeypatch.chdir(tmp_path)
    script = write_script(tmp_path, GPU_SCRIPT.replace("GROW_AT", "-1").replace("GROW_BYTES", "0").replace(
        '"matmul_dtype": str(model(x).dtype)', '"parent": __import__("os").getppid()'))
    parents = []
    for i in range(2):
        result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / f"t{i}", steps=3, device="cuda"))
        assert result.ok, result.message
        assert analyze_file(sorted(result.path.glob("*.pt.trace.json*"))[0]).platform == "gpu"
        parents.append(json.loads((tmp_path / "observed.json").read_text())["parent"])
    assert parents[0] == parents[1] != os.getpid()  # both forked, from one zygote

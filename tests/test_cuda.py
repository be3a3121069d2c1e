"""Trials on a CUDA device: what only a GPU can show. Skipped where there is none (the CPU paths of the
same mechanisms are tested in test_trial, test_knobs and test_memory)."""

from __future__ import annotations

import json

import pytest
import torch
from trial_helpers import trial_record, write_script

from advisor.trials.knobs import APPLIED, Knobs
from advisor.trials.runner import group_members, run_trial

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
    result = run_trial(f"{script}:train_step", Knobs(), tmp_path / "t", steps=3, device="cuda",
                       memory_limit=2 * 2**30)
    assert result.status == "oom", result.message
    record = trial_record(result.path)
    assert record["memory_cap"]["device"].startswith("cuda:") and record["memory_cap"]["bytes"] == 2 * 2**30
    assert "set_per_process_memory_fraction" in record["memory_cap"]["how"]
    assert [s["index"] for s in record["steps"]] == [0, 1, 2]
    assert not group_members(record["pid"])


def test_pinned_non_blocking_copies_and_autocast_on_the_gpu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # trials run in the folder they are started from; the script writes there
    script = gpu_script(tmp_path)
    knobs = Knobs(amp="bf16" if torch.cuda.is_bf16_supported() else "fp16", pin_memory=True, non_blocking=True)
    result = run_trial(f"{script}:train_step", knobs, tmp_path / "t", steps=3, device="cuda")
    assert result.ok, result.message
    assert result.knob_outcomes == {"amp": APPLIED, "pin_memory": APPLIED, "non_blocking": APPLIED}
    observed = json.loads((tmp_path / "observed.json").read_text())
    assert observed["matmul_dtype"] in ("torch.bfloat16", "torch.float16")
    from advisor.analysis.analyze import analyze_file

    diagnosis = analyze_file(sorted(result.path.glob("*.pt.trace.json*"))[0])
    assert diagnosis.platform == "gpu" and diagnosis.copies.pinned_us > 0 and diagnosis.copies.pageable_us == 0

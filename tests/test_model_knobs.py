"""The knobs beyond the five: channels_last, torch.compile, fused optimizers, TF32 and cudnn.benchmark, in real
CPU trials and sessions. On the CPU TF32 and cuDNN autotuning are not applicable, and say so; the rules that
propose them run on the real GPU traces in tests/data (tests/test_analyze_advice.py)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from advisor.trials.knobs import APPLIED, Knobs
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from conftest import advisor_main

MLP = '''
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)


def train_step(x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


for _ in range(40):
    train_step(torch.randn(16, 32), torch.randint(0, 4, (16,)))
'''

SMALL_CONV = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
# float64: no AMP advice (autocast leaves float64 alone), so that compile comes within a short budget
model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4)).double()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(256, 3, 32, 32, dtype=torch.float64), torch.randint(0, 4, (256,)))
loader = DataLoader(data, batch_size=16, drop_last=True)


def train_step(x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach()


for epoch in range(50):
    for x, y in loader:
        train_step(x, y)
'''


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_without_convolutions_or_a_gpu_each_knob_says_what_it_did(tmp_path):
    script = write(tmp_path, "mlp.py", MLP)
    knobs = Knobs(channels_last=True, fused_optimizer=True, tf32=True, cudnn_benchmark=True)
    result = run_trial(TrialSpec(f"{script}:train_step", knobs, tmp_path / "t", steps=2, wait=1, warmup=1,
                                 device="cpu"))
    assert result.ok, result.message
    outcomes = result.knob_outcomes
    assert outcomes["channels_last"].startswith("not applicable") and "no 2-D convolutions" in outcomes["channels_last"]
    assert outcomes["tf32"].startswith("not applicable") and "CPU" in outcomes["tf32"]
    assert outcomes["cudnn_benchmark"].startswith("not applicable") and "CUDA" in outcomes["cudnn_benchmark"]
    assert outcomes["fused_optimizer"] == APPLIED
    record = json.loads((tmp_path / "t" / "trial.json").read_text())
    built_at = next(i for i, line in enumerate(MLP.splitlines(), 1) if "optim.Adam" in line)
    assert record["optimizers"] == [{"class": "Adam", "user": {"fused": None, "foreach": None}, "ran": "fused",
                                     "site": f"{script}:{built_at}"}]
    assert record["user_values"]["fused_optimizer"] is False
    assert record["compile"] is None
    assert knobs.label() == "channels-last+fused-optimizer+tf32+cudnn-benchmark"


def test_a_compile_that_fails_is_not_applicable_and_the_session_goes_on(tmp_path):
    """The C++ compiler the CPU backend needs is missing: the trial runs eagerly, the session records the
    compile as not applicable with inductor's own reason, never proposes it again, and finishes."""
    script = write(tmp_path, "conv.py", SMALL_CONV)
    out = tmp_path / "session"
    # Beside compile, one knob that applies: the round goes on past the failed compile, and a pair would show
    # whether it is proposed again. Six trials: room for the best and a change measured again where the load moved
    # (on a busy machine a session of four measured baseline, channels_last and both again, and never compiled).
    done = advisor_main("profile", f"{script}:train_step", "--device", "cpu", "--out", str(out), "--max-trials", "6",
                        "--steps", "2", "--windows", "2", "--window", "0.3", "--only", "compile,channels_last",
                        env={"CXX": "/nonexistent/c++"})
    assert done.returncode == 0, done.stdout + done.stderr
    state = json.loads((out / "session.json").read_text())
    assert state["status"] == "done"
    compiled = [t for t in state["trials"] if (t["knobs"] or {}).get("compile")]
    assert len(compiled) == 1, [t["change"] for t in state["trials"]]  # never proposed again
    row = compiled[0]
    assert row["status"] == "ok", row["message"]
    assert row["outcomes"]["compile"].startswith("not applicable: torch.compile failed: no C++ compiler")
    # Found before the model was traced (inductor's own check of its compilers), not at its first kernel.
    assert "InvalidCxxCompiler" in row["outcomes"]["compile"] and "nothing was traced" in row["outcomes"]["compile"]
    if row["recommendation"] == "compile":  # alone (not beside a change that applied): nothing was changed
        assert row["decision"] == "not applicable" and "torch.compile failed" in row["reason"]
    assert not (state["final_knobs"] or {}).get("compile")
    patch = out / "suggested.patch"
    assert not patch.exists() or "torch.compile" not in patch.read_text()


def test_a_trial_that_compiles_gets_time_for_its_compile():
    from advisor.search.trial_runner import trial_time_limit
    from advisor.search.state import SessionOptions

    assert trial_time_limit(SessionOptions(timeout_s=60), Knobs(amp="bf16")) == 60
    assert trial_time_limit(SessionOptions(timeout_s=60), Knobs(compile=True)) == 660
    assert trial_time_limit(SessionOptions(timeout_s=900), Knobs(compile=True)) == 1800


SIAMESE = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Siamese(nn.Module):
    """Two images through one convolution tower, their features compared (pytorch/examples' siamese_network)."""

    def __init__(self):
        super().__init__()
        self.tower = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, 1)

    def forward(self, a, b):
        return torch.sigmoid(self.head(torch.abs(self.tower(a) - self.tower(b)))).squeeze(1)


torch.manual_seed(0)
device = torch.device("cpu")
model = Siamese().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
pairs = TensorDataset(torch.randn(128, 1, 16, 16), torch.randn(128, 1, 16, 16), torch.randint(0, 2, (128,)).float())
loader = DataLoader(pairs, batch_size=8, drop_last=True)


def train_step(images_1, images_2, targets):
    images_1, images_2, targets = images_1.to(device), images_2.to(device), targets.to(device)
    optimizer.zero_grad()
    loss = nn.functional.binary_cross_entropy(model(images_1, images_2), targets)
    loss.backward()
    optimizer.step()
    return loss.detach()


for epoch in range({epochs}):
    for images_1, images_2, targets in loader:
        train_step(images_1, images_2, targets)
'''


def test_a_model_of_two_images_gets_both_in_channels_last_in_the_trial_and_the_patch(tmp_path):
    """pytorch/examples' siamese network feeds two images to one model: the trial made both channels_last (every 4-D
    input), while the patch wrote it on the first image only. The trial records the positions of the model's 4-D
    inputs, and the patch moves each of them (never the 1-D targets, which channels_last refuses)."""
    import ast
    import subprocess
    import sys

    from advisor.code.patch.plan import plan_patch

    script = write(tmp_path, "siamese.py", SIAMESE.replace("{epochs}", "20"))
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(channels_last=True), tmp_path / "t", steps=2, wait=1,
                                 warmup=1, device="cpu", windows=0))
    assert result.ok, result.message
    assert result.knob_outcomes["channels_last"] == APPLIED
    inputs = json.loads((tmp_path / "t" / "trial.json").read_text())["channels_last_inputs"]
    assert inputs == [0, 1], inputs
    diff = plan_patch(script, "train_step", Knobs(channels_last=True), {}, channels_last_inputs=inputs).diff
    (tmp_path / "suggested.patch").write_text(diff)
    applied = subprocess.run(["git", "apply", "suggested.patch"], cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr + diff
    after = script.read_text()
    moved = next(n for n in ast.walk(ast.parse(after)) if isinstance(n, ast.Assign)
                 and ast.unparse(n.targets[0]) == "(images_1, images_2, targets)")
    assert [ast.unparse(e) for e in moved.value.elts] == [
        "images_1.to(device, memory_format=torch.channels_last)",
        "images_2.to(device, memory_format=torch.channels_last)", "targets.to(device)"], ast.unparse(moved)
    patched = write(tmp_path, "patched.py", after.replace("range(20)", "range(1)"))  # one epoch is enough
    done = subprocess.run([sys.executable, str(patched)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

"""The knobs beyond the five: channels_last, torch.compile, fused optimizers, TF32 and cudnn.benchmark, in real
CPU trials and sessions. On the CPU TF32 and cuDNN autotuning are not applicable, and say so; the rules that
propose them run on the real GPU traces in tests/data (tests/test_analyze_advice.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from advisor.trials.knobs import APPLIED, Knobs
from advisor.trials.runner import run_trial
from conftest import ROOT, run_advisor

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
model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(256, 3, 32, 32), torch.randint(0, 4, (256,)))
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
    result = run_trial(f"{script}:train_step", knobs, tmp_path / "t", steps=2, wait=1, warmup=1, device="cpu")
    assert result.ok, result.message
    outcomes = result.knob_outcomes
    assert outcomes["channels_last"].startswith("not applicable") and "no 2-D convolutions" in outcomes["channels_last"]
    assert outcomes["tf32"].startswith("not applicable") and "CPU" in outcomes["tf32"]
    assert outcomes["cudnn_benchmark"].startswith("not applicable") and "CUDA" in outcomes["cudnn_benchmark"]
    assert outcomes["fused_optimizer"] == APPLIED
    record = json.loads((tmp_path / "t" / "trial.json").read_text())
    assert record["optimizers"] == [{"class": "Adam", "user": {"fused": None, "foreach": None}, "ran": "fused"}]
    assert record["user_values"]["fused_optimizer"] is False
    assert record["compile"] is None
    assert knobs.label() == "channels-last+fused-optimizer+tf32+cudnn-benchmark"


def test_a_compile_that_fails_is_not_applicable_and_the_session_goes_on(tmp_path):
    """The C++ compiler the CPU backend needs is missing: the trial runs eagerly, the session records the
    compile as not applicable with inductor's own reason, never proposes it again, and finishes."""
    script = write(tmp_path, "conv.py", SMALL_CONV)
    out = tmp_path / "session"
    done = run_advisor("profile", f"{script}:train_step", "--device", "cpu", "--out", str(out), "--max-trials", "6",
                       "--steps", "2", "--windows", "2", "--window", "0.3", "--keep-effective-batch",
                       env={"CXX": "/nonexistent/c++"}, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    state = json.loads((out / "session.json").read_text())
    assert state["status"] == "done"
    compiled = [t for t in state["trials"] if (t["knobs"] or {}).get("compile")]
    assert len(compiled) == 1, [t["change"] for t in state["trials"]]  # never proposed again
    row = compiled[0]
    assert row["status"] == "ok", row["message"]
    assert row["outcomes"]["compile"].startswith("not applicable: torch.compile failed")
    assert "compiler" in row["outcomes"]["compile"].lower()
    if row["recommendation"] == "compile":  # alone (not beside a change that applied): nothing was changed
        assert row["decision"] == "not applicable" and "torch.compile failed" in row["reason"]
    assert not (state["final_knobs"] or {}).get("compile")
    patch = out / "suggested.patch"
    assert not patch.exists() or "torch.compile" not in patch.read_text()


@pytest.fixture(scope="module")
def conv_session(tmp_path_factory) -> Path:
    """A real session on the convolutional example: compute-bound on this CPU."""
    root = tmp_path_factory.mktemp("conv")
    shutil.copytree(ROOT / "examples", root / "examples", ignore=shutil.ignore_patterns("data", "*.ipynb"))
    out = root / "session"
    done = run_advisor("profile", "examples/conv_classifier.py:train_step", "--device", "cpu", "--out", str(out),
                       "--max-trials", "7", "--steps", "2", "--windows", "2", "--window", "0.3",
                       "--keep-effective-batch", cwd=root, timeout=900)  # the batch is not what this is about
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_conv_session_tries_channels_last_and_compile_and_keeps_what_pays(conv_session):
    state = json.loads((conv_session / "session.json").read_text())
    assert state["trials"][0]["bound"] == "compute"
    turned = {k for t in state["trials"][1:] for k, v in (t["knobs"] or {}).items() if v and k in
              ("channels_last", "compile")}
    assert turned == {"channels_last", "compile"}, [t["change"] for t in state["trials"]]
    for t in state["trials"][1:]:
        assert t["decision"] in ("kept", "reverted"), (t["change"], t["decision"], t["reason"])
        assert all(v == APPLIED for v in (t["outcomes"] or {}).values()), t["outcomes"]
        if t["decision"] == "kept" and t["recommendation"] != "confirm":
            assert t["gain"] > 0
    compiled = next(t for t in state["trials"] if t["knobs"].get("compile"))  # alone, or in a pair
    record = json.loads((conv_session / compiled["folder"] / "trial.json").read_text())
    figures = compiled["compile"]
    assert figures["graphs"] >= 1 and figures["graph_breaks"] == 0 and figures["compile_s"] > 0
    # The compile ran in the first steps: none of the measured steps holds it, so samples/s does not count it.
    measured = [s["wall_s"] for s in record["steps"] if s["phase"] == "window"]
    assert measured and max(measured) < figures["compile_s"]
    payback = figures.get("pays_back_after_steps")
    assert payback is None if compiled["gain"] <= 0 else payback >= 1


def test_the_conv_sessions_patch_applies_and_runs(conv_session, tmp_path):
    state = json.loads((conv_session / "session.json").read_text())
    final = {k: v for k, v in state["final_knobs"].items() if v is not None}
    patch = conv_session / "suggested.patch"
    if not final:
        assert not patch.exists()
        return
    root = tmp_path / "copy"
    shutil.copytree(ROOT / "examples", root / "examples", ignore=shutil.ignore_patterns("data", "*.ipynb"))
    # The patch is relative to the folder the session names (the script's, without a repository around it).
    where = root / Path(state["patch_root"]).relative_to(conv_session.parent)
    done = subprocess.run(["patch", "-p1", "-i", str(patch)], cwd=where, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    text = (root / "examples" / "conv_classifier.py").read_text()
    for knob, line in (("channels_last", "model = model.to(memory_format=torch.channels_last)"),
                       ("compile", "model = torch.compile(model)"), ("amp", "torch.autocast(")):
        assert (line in text) == bool(final.get(knob)), knob
    run = subprocess.run([sys.executable, "examples/conv_classifier.py", "--max-steps", "3"], cwd=root,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "loss" in run.stdout


def test_a_trial_that_compiles_gets_time_for_its_compile():
    from advisor.search.session import trial_time_limit
    from advisor.search.state import SessionOptions

    assert trial_time_limit(SessionOptions(timeout_s=60), Knobs(amp="bf16")) == 60
    assert trial_time_limit(SessionOptions(timeout_s=60), Knobs(compile=True)) == 660
    assert trial_time_limit(SessionOptions(timeout_s=900), Knobs(compile=True)) == 1800

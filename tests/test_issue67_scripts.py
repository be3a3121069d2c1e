"""Issue 67's two scripts (re-created in tests/scripts/issue67), each in a real trial on the CPU: the convnet's
Dataset (`np.float32(self.raw[i]) / 255.0`, module numpy MEAN and STD, `.transpose(2, 0, 1).copy()`) takes
the 8-bit copies, and the GPT block (`math.sqrt(d // self.heads)`, an inline `triu` mask, `softmax(...) @ v`)
takes scaled_dot_product_attention; the patch made from each trial's plan applies with `patch -p1` and the
patched script runs, learning as the original did."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from advisor.analysis.analyze import analyze_file
from advisor.code.patch.plan import plan_patch
from advisor.report.formatting import attention_text
from advisor.trials.knobs import APPLIED, Knobs
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from conftest import ROOT, run_script

SCRIPTS = ROOT / "tests" / "scripts" / "issue67"


def trial_and_patch(tmp_path, name: str, target: str, knobs: Knobs, plan_key: str) -> tuple[dict, str, str]:
    """A trial of the script's copy with `knobs`; its record, the patched script's text, the diff."""
    project = tmp_path / "project"
    project.mkdir()
    script = project / name
    shutil.copy(SCRIPTS / name, script)
    result = run_trial(TrialSpec(f"{script}:{target}", knobs, tmp_path / "trial", steps=3, wait=1, warmup=1,
                                 device="cpu", script_args=("--steps", "24")))
    assert result.ok, result.message
    record = json.loads((tmp_path / "trial" / "trial.json").read_text())
    plan = record[plan_key]
    patch = plan_patch(script, target, knobs, record.get("user_values") or {}, root=project,
                       **{plan_key: plan})
    assert not patch.notes, patch.notes
    applied = subprocess.run(["patch", "-p1"], input=patch.diff, cwd=project, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    return record, script.read_text(), patch.diff


def losses(script) -> list[float]:
    done = run_script(script, cwd=script.parent, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    return [float(x) for x in re.findall(r"loss (\S+)", done.stdout)]


def test_the_convnet_takes_the_8bit_copies_and_its_patch_runs_with_the_same_losses(tmp_path):
    record, text, diff = trial_and_patch(tmp_path, "convnet.py", "train_step", Knobs(uint8_copies=True),
                                         "uint8_plan")
    assert record["knob_outcomes"]["uint8_copies"] == APPLIED
    plan = record["uint8_plan"]
    assert plan["conversion"] == "np.float32(self.raw[i]) / 255.0" and plan["uint8"] == "self.raw[i]"
    assert plan["removed"] == ["img = (img - MEAN) / STD"] and plan["codes"] == ["MEAN", "STD"]
    assert "img = self.raw[i]" in text and "(img - MEAN) / STD" not in text
    assert "torch.from_numpy(img.transpose(2, 0, 1).copy()), label" in text  # the layout, on the 8-bit image
    assert "normalized(images.to(device))" in text
    before = losses(SCRIPTS / "convnet.py")
    assert losses(tmp_path / "project" / "convnet.py") == before and len(before) == 8


def test_on_the_cpu_a_step_that_never_moves_its_batch_converts_it_where_it_enters(tmp_path):
    """The 8-bit batch still crosses from the two workers; it is converted as it leaves the loader, and the
    patch converts it as the step's first statement."""
    record, text, diff = trial_and_patch(tmp_path, "convnet_cpu.py", "train_step", Knobs(uint8_copies=True),
                                         "uint8_plan")
    assert record["knob_outcomes"]["uint8_copies"] == APPLIED
    assert '"""One step on the CPU, the batch as the loader hands it out."""\n    images = normalized(images)' in text
    before = losses(SCRIPTS / "convnet_cpu.py")
    assert losses(tmp_path / "project" / "convnet_cpu.py") == before and len(before) == 8


def test_the_gpt_block_takes_sdpa_and_its_patch_runs_with_the_same_losses(tmp_path):
    record, text, diff = trial_and_patch(tmp_path, "gpt_block.py", "train_step", Knobs(sdpa=True), "attention_plan")
    assert record["knob_outcomes"]["sdpa"] == APPLIED
    plan = record["attention_plan"][0]
    assert plan["class"] == "Block" and plan["form"] == "causal mask, 1/sqrt(d)"
    assert "y = F.scaled_dot_product_attention(q, k, v, is_causal=True)" in text
    forward = text.split("def forward")[1].split("class GPT")[0]
    assert "masked_fill" not in forward and "F.softmax" not in forward
    before = losses(SCRIPTS / "gpt_block.py")
    assert losses(tmp_path / "project" / "gpt_block.py") == pytest.approx(before, rel=1e-4) and len(before) == 6
    # The same evidence in `advisor analyze` of the trial: attention's share, the module found, rewritable.
    trace = sorted((tmp_path / "trial").glob("*.pt.trace.json*"))[0]
    figure = analyze_file(trace).extra["attention"]
    assert figure["modules"] == [{"class": "Block", "rewritable": True, "why": "causal mask, 1/sqrt(d)"}]
    assert 0 < figure["share"] < 1 and figure["implementations"]
    assert "Block: rewritable as scaled_dot_product_attention (causal mask, 1/sqrt(d))" in attention_text(figure)

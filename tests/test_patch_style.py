"""Patches a reviewer would merge: every kind of patch, written into a project that configures ruff and black
(line-length 79) on scripts black formatted first, leaves a file that parses, whose added lines are within the
project's width, that black leaves as it is and on whose added lines ruff finds nothing. The width is the
project's own (pyproject.toml, ruff.toml, setup.cfg), else 100. The issue's convnet, patched with its
per-channel constants made once, prints the same losses as before."""

from __future__ import annotations

import difflib
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.code.patch.layout import line_width
from advisor.code.patch.plan import plan_patch
from advisor.trials.interposition.uint8_probe import probe_plan
from advisor.trials.knobs import Knobs
from conftest import ROOT, run_script, require

BIN = Path(sys.executable).parent
if not (BIN / "ruff").exists() or not (BIN / "black").exists():
    pytest.skip("needs ruff and black (the test extras)", allow_module_level=True)

WIDTH = 79
RUFF = f"""[tool.ruff]
line-length = {WIDTH}

[tool.ruff.lint]
select = ["E", "F", "W"]
"""
BLACK = f"""[tool.black]
line-length = {WIDTH}

"""
EXAMPLES, SCRIPTS = ROOT / "examples", ROOT / "tests" / "scripts"
USER = {"batch_size": 32, "num_workers": 0, "pin_memory": False, "persistent_workers": False,
        "prefetch_factor": None, "ddp_bucket_cap_mb": 25, "ddp_gradient_as_bucket_view": False}


def dataset_plan(script: Path, cls: str) -> dict:
    """The 8-bit plan a trial records for the script's Dataset class (read from the formatted copy)."""
    name = f"style_{script.stem}"
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    made = {"ShapesDataset": lambda: module.ShapesDataset(module.ensure_dataset(ROOT / "examples" / "data" / "shapes",
                                                                                count=8)),
            "Pictures": lambda: module.Pictures(8)}[cls]
    plan = probe_plan(made())  # read on the Dataset's items, as the trial reads it
    assert not isinstance(plan, str), plan
    return plan.to_dict()


def pipeline_plan(script: Path) -> dict:
    """The plan a trial records for the timm script's torchvision pipeline (the same transforms, built here)."""
    pytest.importorskip("torchvision")
    from torchvision import datasets, transforms

    from advisor.trials.interposition.eight_bit_images import rewrite_dataset

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    pipeline = transforms.Compose([transforms.RandomResizedCrop(32, scale=(0.5, 1.0)),
                                   transforms.RandomHorizontalFlip(), transforms.ColorJitter(0.2, 0.2, 0.2),
                                   transforms.ToTensor(), transforms.Normalize(mean, std)])
    plan, _ = rewrite_dataset(datasets.FakeData(8, (3, 40, 40), 10, transform=pipeline), f"{script}:1")
    return plan.to_dict()


KINDS = {  # name: (script, its folder, knobs, extra arguments of plan_patch; the 8-bit plan's maker)
    "loader": ("image_classifier.py", EXAMPLES, Knobs(batch_size=64, num_workers=4, pin_memory=True,
                                                      persistent_workers=True, prefetch_factor=4), {}),
    "autocast, non_blocking": ("image_classifier.py", EXAMPLES, Knobs(amp="bf16", non_blocking=True), {}),
    "fp16 scaler, accumulation": ("conv_classifier.py", EXAMPLES, Knobs(amp="fp16", accumulation_steps=4), {}),
    "model: channels_last, compile, fused": ("conv_classifier.py", EXAMPLES,
                                             Knobs(channels_last=True, compile=True, fused_optimizer=True), {}),
    "tf32, cudnn.benchmark": ("conv_classifier.py", EXAMPLES, Knobs(tf32=True, cudnn_benchmark=True), {}),
    "threads": ("image_classifier.py", EXAMPLES, Knobs(num_workers=2, threads=1), {}),
    "ddp": ("ddp_classifier.py", EXAMPLES, Knobs(ddp_bucket_cap_mb=10, ddp_gradient_as_bucket_view=True,
                                                  ddp_static_graph=True, ddp_find_unused_parameters=True), {}),
    "framework: TrainingArguments": ("hf_trainer.py", SCRIPTS / "frameworks",
                                     Knobs(compile=True, tf32=True, num_workers=2, amp="bf16"), {"target": None}),
    "framework: Lightning": ("lightning_cnn.py", SCRIPTS / "frameworks",
                             Knobs(compile=True, channels_last=True, amp="fp16", fused_optimizer=True),
                             {"target": None}),
    "8-bit copies, scalar constants": ("image_classifier.py", EXAMPLES, Knobs(uint8_copies=True),
                                       {"plan": lambda s: dataset_plan(s, "ShapesDataset")}),
    "8-bit copies, per-channel constants": ("convnet_constants.py", SCRIPTS, Knobs(uint8_copies=True),
                                            {"plan": lambda s: dataset_plan(s, "Pictures")}),
    "8-bit copies, torchvision pipeline": ("timm_fakedata.py", SCRIPTS, Knobs(uint8_copies=True),
                                           {"plan": pipeline_plan}),
}


def tool(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / name), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def added_lines(before: str, after: str) -> dict[int, str]:
    """The patched file's added lines, by their number in it (1-based)."""
    added = {}
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
    for op, _, _, j1, j2 in matcher.get_opcodes():
        if op in ("replace", "insert"):
            added.update({j + 1: after.splitlines()[j] for j in range(j1, j2)})
    return added


FORMATTED: dict[Path, str] = {}  # a source as black lays it out at WIDTH: the same for every kind that patches it


def formatted_project(folder: Path, name: str, source: Path, black: bool) -> Path:
    """A copy of the script in a project that configures ruff (and black), formatted by black at the
    project's width as such a project's files are."""
    folder.mkdir()
    (folder / "pyproject.toml").write_text((BLACK if black else "") + RUFF)
    script = folder / name
    if source / name not in FORMATTED:
        shutil.copyfile(source / name, script)
        done = tool("black", "-q", "--line-length", str(WIDTH), name, cwd=folder)
        assert done.returncode == 0, done.stderr
        FORMATTED[source / name] = script.read_text()
    script.write_text(FORMATTED[source / name])
    return script


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_patch_kind_is_within_the_width_and_passes_the_formatters(tmp_path, kind):
    """In a project that configures black (which the patch then runs on its lines) and in one that
    configures ruff alone (the advisor's own layout): the file parses, the added lines are within the width
    and ruff finds nothing on them; black leaves the first as it is."""
    require("patch")
    name, folder, knobs, extra = KINDS[kind]
    for black in (True, False):
        project = tmp_path / ("black" if black else "ruff")
        script = formatted_project(project, name, folder, black)
        before = script.read_text()
        plan = extra["plan"](script) if "plan" in extra else None
        if plan is not None:
            plan["file"] = str(script)
        patch = plan_patch(script, extra.get("target", "train_step"), knobs, USER, root=project,
                           uint8_plan=plan)
        assert patch.diff, patch.notes
        (project / "suggested.patch").write_text(patch.diff)
        applied = subprocess.run(["patch", "-p1", "-i", "suggested.patch"], cwd=project, capture_output=True,
                                 text=True)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        after = script.read_text()
        compile(after, name, "exec")
        added = added_lines(before, after)
        assert added, patch.diff
        assert {n: line for n, line in added.items() if len(line) > WIDTH} == {}, patch.diff
        ruff = tool("ruff", "check", "--no-cache", "--output-format", "concise", name, cwd=project)
        found = [line for line in ruff.stdout.splitlines()
                 if (m := re.match(rf".*{re.escape(name)}:(\d+):", line)) and int(m.group(1)) in added]
        assert found == [], found
        if black:
            checked = tool("black", "--check", "--diff", "-q", name, cwd=project)
            assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_width_is_the_projects_own(tmp_path):
    script = tmp_path / "pkg" / "train.py"
    script.parent.mkdir()
    script.write_text("x = 1\n")
    assert line_width(script, tmp_path) == 100  # nothing configured
    (tmp_path / "setup.cfg").write_text("[flake8]\nmax-line-length = 110\n")
    assert line_width(script, tmp_path) == 110
    (tmp_path / "pyproject.toml").write_text("[tool.black]\n")
    assert line_width(script, tmp_path) == 88  # black configured, its own default
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 120\n")
    assert line_width(script, tmp_path) == 120
    (script.parent / "ruff.toml").write_text("line-length = 72\n")
    assert line_width(script, tmp_path) == 72  # the nearest folder's


@pytest.mark.slow
def test_the_issues_convnet_gets_the_8_bit_copies_and_its_patch_learns_the_same(tmp_path):
    require("patch")
    """The issue's convnet (refused before): a real trial applies the 8-bit copies; the patch made from the
    plan it recorded, run for real, prints the same losses, step by step, as the original."""
    import json

    from advisor.trials.knobs import APPLIED
    from advisor.trials.launch.runner import run_trial
    from advisor.trials.spec import TrialSpec

    script = formatted_project(tmp_path / "project", "convnet_constants.py", SCRIPTS, black=True)
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(uint8_copies=True), tmp_path / "trial", steps=3, wait=1,
                                 warmup=1, device="cpu"))
    assert result.ok, result.message
    record = json.loads((tmp_path / "trial" / "trial.json").read_text())
    assert record["knob_outcomes"]["uint8_copies"] == APPLIED
    plan = record["uint8_plan"]
    assert (plan["codes"], plan["views"]) == (["MEAN", "STD"], [[3, 1, 1], [3, 1, 1]])
    original = run_script(script, cwd=script.parent, timeout=300)
    assert original.returncode == 0, original.stderr
    patch = plan_patch(script, "train_step", Knobs(uint8_copies=True), {}, root=script.parent, uint8_plan=plan)
    (script.parent / "suggested.patch").write_text(patch.diff)
    subprocess.run(["patch", "-p1", "-i", "suggested.patch"], cwd=script.parent, check=True, capture_output=True)
    text = script.read_text()
    assert "images = normalized(images.to(device))" in text and "(img - MEAN) / STD" not in text
    assert "torch.as_tensor(MEAN, dtype=torch.float32, device=device)" in text
    patched = run_script(script, cwd=script.parent, timeout=300)
    assert patched.returncode == 0, patched.stderr
    losses = [re.findall(r"loss (\S+)", run.stdout) for run in (original, patched)]
    assert losses[0] == losses[1] and len(losses[0]) == 8
